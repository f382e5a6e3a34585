"""The run record of the vLLM backend against a real vLLM: `make vllm-real`.

Usage: python3 scripts/vllm_real_record.py [--out runs/<today>_vllm-real]

vLLM 0.32.0's CPU build (make setup's venv) serves the fixture's float32
copy. This records, into OUT:
- the install: the venv's size and, from its stamp, what it holds;
- vLLM's start: seconds from `vllm serve` to its /health (three starts);
- the parity gates: the small suite through the vLLM backend in front of
  the real vLLM gated against the fixture on the MLX backend
  (scripts/ci_gates.sh with DECISIO_GATES_OUT; every answer, each set's
  mean KL);
- the tests of tests/vllm_real.rs and tests/vllm_wait.rs, each test's time,
  with the fault run's counts (decisions sent, lost) and the start-before-
  the-upstream timeline they print.
Writes OUT/summary.md and OUT/record.json.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DECISIO_CACHE", Path.home() / ".cache/decisio"))
VENV = Path(os.environ.get("DECISIO_VLLM_VENV", CACHE / "vllm-venv"))
HF_MODEL = CACHE / "models/smollm2-135m-instruct-dense"
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
TEST_TIME = re.compile(r"^test (\S+) \.\.\. (ok|FAILED) <([\d.]+)s>", re.M)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_start_seconds():
    """Seconds from `vllm serve` to its /health answering 200."""
    port = free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [str(VENV / "bin/vllm"), "serve", str(HF_MODEL), "--served-model-name", "smollm2",
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
         "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager",
         "--block-size", "32"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                sys.exit("vLLM exited before it was healthy")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                time.sleep(0.25)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def run_tests(binaries):
    """Builds and runs the test binaries one after another; returns each
    test's (binary, name, outcome, seconds) and the output."""
    out = subprocess.run(
        ["cargo", "test", "--release", "--locked", "--no-run", "--message-format=json"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    exes = {}
    for line in out.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] in binaries and msg.get("profile", {}).get("test"):
            exes[msg["target"]["name"]] = msg["executable"]
    tests, text = [], ""
    for name in binaries:
        done = subprocess.run([exes[name], "-Z", "unstable-options", "--report-time", "--nocapture"],
                              cwd=ROOT, env={**os.environ, "RUSTC_BOOTSTRAP": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        text += done.stdout
        for test, outcome, seconds in TEST_TIME.findall(done.stdout):
            tests.append({"binary": name, "test": test, "outcome": outcome, "seconds": float(seconds)})
    return tests, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / f"runs/{datetime.date.today()}_vllm-real")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    record = {"vllm": (VENV / ".installed").read_text().strip(),
              "venv_bytes": sum(f.stat().st_size for f in VENV.rglob("*") if f.is_file() and not f.is_symlink())}

    record["start_seconds"] = [round(vllm_start_seconds(), 1) for _ in range(3)]
    print(f"[vllm-real] vLLM start: {record['start_seconds']} s", flush=True)

    gates = a.out / "gates"
    shutil.rmtree(gates, ignore_errors=True)
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts/ci_gates.sh")], cwd=ROOT,
                          env={**os.environ, "DECISIO_GATES_OUT": str(gates)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (a.out / "gates.log").write_text(done.stdout)
    record["gates"] = {"exit": done.returncode, "seconds": round(time.monotonic() - t0, 1),
                       "lines": (gates / "gate-vllm-real.txt").read_text().splitlines()
                       if (gates / "gate-vllm-real.txt").exists() else []}
    started = re.search(r"a real vLLM answered /health after (\d+) s", done.stdout)
    record["gates"]["vllm_start_seconds"] = int(started.group(1)) if started else None
    print(f"[vllm-real] gates: exit {done.returncode}", flush=True)

    tests, text = run_tests(["vllm_real", "vllm_wait"])
    (a.out / "tests.log").write_text(text)
    record["tests"] = tests
    record["faults"] = re.findall(r"replicas: (\d+) decisions sent, (\d+) lost", text)
    record["timelines"] = re.findall(r"timeline of the start, seconds from the gateway's start: (.*)", text)
    (a.out / "record.json").write_text(json.dumps(record, indent=2) + "\n")

    lines = [f"# The vLLM backend against a real vLLM ({datetime.date.today()})", "",
             f"Command: `make vllm-real` (scripts/vllm_real_record.py). {record['vllm']}; the venv "
             f"holds {record['venv_bytes'] / 2**30:.1f} GiB.", "",
             "## vLLM's start (seconds from `vllm serve` to /health, idle machine)",
             f"{', '.join(map(str, record['start_seconds']))}", "",
             "## Parity: the small suite through the vLLM backend against the fixture on MLX",
             f"`suites/gates-vllm.yaml` (exit {record['gates']['exit']}, {record['gates']['seconds']} s "
             f"including both suite runs); the records are in `gates/`:", "", "```",
             *record["gates"]["lines"], "```", "",
             "## Tests (each test's time)", "", "| binary | test | outcome | s |", "|---|---|---|---|",
             *[f"| {t['binary']} | {t['test']} | {t['outcome']} | {t['seconds']:.1f} |" for t in tests], "",
             "## Faults: a replica killed with SIGKILL mid-run",
             *[f"- {sent} decisions sent, {lost} lost" for sent, lost in record["faults"]], "",
             "## Starting before the upstream (seconds from the gateway's start)",
             *[f"- {t}" for t in record["timelines"]], ""]
    (a.out / "summary.md").write_text("\n".join(lines))
    print(f"[vllm-real] wrote {a.out}/summary.md")


if __name__ == "__main__":
    main()
