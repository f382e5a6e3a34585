# decisio: the two commands of the README, and their parts.
#   make serve   set everything up, start the server on the default model, show an answer
#   make test    set everything up, then run every test
SHELL := /bin/bash
export DECISIO_CACHE ?= $(HOME)/.cache/decisio
export DECISIO_ASSETS ?= $(DECISIO_CACHE)/assets
export DECISIO_MODEL ?= $(DECISIO_CACHE)/models/smollm2-135m-instruct
export DECISIO_REFERENCE_DIR ?= $(CURDIR)/target/reference
PYTHON := $(DECISIO_CACHE)/venv/bin/python
# mlx-lm's own dense copy of the fixture (the same weight values, on MLX's
# fast dense CPU kernels) and the BLAS decisio links, for the references.
DENSE_MODEL := $(DECISIO_CACHE)/models/smollm2-135m-instruct-dense
OPENBLAS := $(wildcard /usr/lib/x86_64-linux-gnu/libopenblas.so.0)
PORT ?= 8000

.PHONY: setup serve test reference reference-logits cargo-test e2e lint bench bench-tasks

setup:
	@bash scripts/setup.sh

serve: setup
	@bash scripts/serve-demo.sh $(PORT)

# Reference figures computed by the Python implementations (mlx-lm,
# transformers, tokenizers) that the Rust tests compare against.
# (The logits reference takes about 9 minutes and is committed; regenerate it
# with `make reference-logits` after changing the fixture's conversion.)
reference: setup
	@mkdir -p $(DECISIO_REFERENCE_DIR)
	@test -f $(DENSE_MODEL)/config.json || $(PYTHON) -m mlx_lm convert --hf-path $(DECISIO_MODEL) --mlx-path $(DENSE_MODEL) --dequantize >/dev/null
	@LD_PRELOAD=$(OPENBLAS) $(PYTHON) scripts/reference/decisions.py $(DENSE_MODEL) $(DECISIO_REFERENCE_DIR)
	@$(PYTHON) scripts/reference/prompts.py $(DECISIO_REFERENCE_DIR) $(DECISIO_MODEL) $(DECISIO_ASSETS)/qwen3 $(DECISIO_ASSETS)/gemma3
	@test -f $(DECISIO_REFERENCE_DIR)/qwen3_6/tokenizer.json || $(PYTHON) scripts/reference/qwen3_6_tokenizer.py $(DECISIO_REFERENCE_DIR)/qwen3_6
	@$(PYTHON) scripts/reference/tiny_models.py $(DECISIO_REFERENCE_DIR)
	@$(PYTHON) scripts/reference/tiny_tokenizers.py $(DECISIO_REFERENCE_DIR) $(DECISIO_ASSETS)/qwen3 $(DECISIO_ASSETS)/gemma3

reference-logits: setup
	$(PYTHON) scripts/reference/logits.py $(DECISIO_MODEL) tests/fixtures/reference

cargo-test: reference
	cargo test --release --locked

e2e: setup
	$(PYTHON) -m pytest -q tests/e2e

lint:
	cargo fmt --all -- --check
	cargo clippy --release --locked --all-targets -- -D warnings

test: cargo-test e2e

bench: setup
	$(PYTHON) scripts/bench/first_token.py
	$(PYTHON) scripts/bench/cpu_kernels.py
	$(PYTHON) scripts/bench/host_kernels.py
	$(PYTHON) scripts/bench/decide.py
	$(MAKE) bench-tasks

# Task registration: choice throughput and latency, then intent heads over
# MMLU subjects (6 draws x 10 shots), the head's fit time, the reliability PNG.
bench-tasks: setup
	cargo build --release --bin decisio --example task_figures
	$(PYTHON) scripts/bench/task_registration.py
