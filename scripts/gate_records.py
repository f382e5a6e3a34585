"""The gates' run records of the fixture: `make gate`.

Usage: python3 scripts/gate_records.py [--out runs/<today>_gates] [--suite suites/small.yaml]

Converts the fixture's GGUF three ways with `decisio convert` (`--weights
dense`: the reference; `keep`: the fixture as served, 4-bit; `q2`: a
deliberately degraded 2-bit conversion), runs the suite against each on a
freshly started server (the fixture twice, for the bit-for-bit gate; and
the vLLM backend in front of an MLX gateway of the fixture, twice), then gates
every candidate against its reference and writes each gate's lines and an
accuracy plot beside the records. A record already complete in OUT is
kept (delete its folder to make it anew). Writes OUT/summary.md from the
gates' outputs.
"""

import argparse
import datetime
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DECISIO_CACHE", Path.home() / ".cache/decisio"))
BIN = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release/decisio"
GGUF = CACHE / "assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FIXTURE = Path(os.environ.get("DECISIO_MODEL", CACHE / "models/smollm2-135m-instruct"))
ASSETS = Path(os.environ.get("DECISIO_ASSETS", CACHE / "assets"))
# The Python with the OpenAI SDK (make setup's virtual environment).
SDK_PYTHON = CACHE / "venv/bin/python"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, log):
    """Waits for /health, failing when the server exits first."""
    while True:
        if proc.poll() is not None:
            sys.exit(f"the server exited before it was ready; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)


class Server:
    """A decisio server on a free port with its own state folder."""

    def __init__(self, args, work, name):
        self.port = free_port()
        self.state = tempfile.mkdtemp(prefix="decisio-gate-state-")
        self.log = work / f"{name}-server.log"
        self.proc = subprocess.Popen(
            [str(BIN), "serve", *args, "--served-model-name", "smollm2",
             "--state-dir", self.state, "--port", str(self.port)],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_healthy(self.port, self.proc, self.log)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.state, ignore_errors=True)


def convert(weights):
    out = CACHE / f"models/gates/smollm2-{weights}"
    if not (out / "config.json").exists():
        subprocess.run([str(BIN), "convert", "--gguf", str(GGUF), "--out", str(out),
                        "--weights", weights, "--force"], check=True, stdout=subprocess.DEVNULL)
    return out


def suite_run(url, suite, out):
    """The suite against the server at URL, then its chat questions again
    through the OpenAI SDK (scripts/sdk_conformance.py) while it is up."""
    if (out / "record.json").exists():
        print(f"[gate] {out.name}: kept")
        return
    print(f"[gate] {out.name}: suite run", flush=True)
    subprocess.run([str(BIN), "suite", "run", "--server", url, "--suite", str(suite),
                    "--data", str(ASSETS), "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(SDK_PYTHON), str(ROOT / "scripts/sdk_conformance.py"),
                    "--record", str(out), "--server", url], check=True)


def gate(out, name, candidate, reference, *extra):
    cmd = [str(BIN), "gate", "--record", str(out / candidate), "--against", str(out / reference),
           "--gates", str(ROOT / "suites/gates.yaml"), "--plot", str(out / f"accuracy-{name}.png"), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    shown = " ".join(["decisio gate --record", candidate, "--against", reference, *extra])
    text = f"$ {shown}\n{r.stdout}{r.stderr}exit status {r.returncode}\n"
    (out / f"gate-{name}.txt").write_text(text)
    print(text)
    return r.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path,
                    default=ROOT / f"runs/{datetime.date.today().isoformat()}_gates")
    ap.add_argument("--suite", type=Path, default=ROOT / "suites/small.yaml")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="decisio-gates-"))

    runs = [
        ("reference-dense", ["--model", str(convert("dense"))]),
        ("fixture-q4", ["--model", str(FIXTURE)]),
        ("fixture-q4-again", ["--model", str(FIXTURE)]),
        ("degraded-q2", ["--model", str(convert("q2"))]),
    ]
    for name, args in runs:
        if (a.out / name / "record.json").exists():
            print(f"[gate] {name}: kept")
            continue
        s = Server(args, work, name)
        try:
            suite_run(s.url, a.suite, a.out / name)
        finally:
            s.stop()
    for name in ("vllm-backend", "vllm-backend-again"):
        if (a.out / name / "record.json").exists():
            print(f"[gate] {name}: kept")
            continue
        # The vLLM backend in front of an MLX gateway of the fixture, the
        # gateway also its head upstream, states unpadded as on MLX; both
        # started afresh for each record.
        mlx = Server(["--model", str(FIXTURE)], work, f"{name}-upstream")
        try:
            front = Server(["--backend", "vllm", "--model", str(FIXTURE), "--upstream", mlx.url,
                            "--head-upstream", mlx.url, "--pad-policy", "none"], work, name)
            try:
                suite_run(front.url, a.suite, a.out / name)
            finally:
                front.stop()
        finally:
            mlx.stop()

    results = [
        ("fixture-vs-reference", "fixture-q4", "reference-dense", [], 0),
        ("fixture-bitwise", "fixture-q4-again", "fixture-q4", ["--bitwise"], 0),
        ("degraded-vs-reference", "degraded-q2", "reference-dense", [], 1),
        ("vllm-bitwise", "vllm-backend-again", "vllm-backend", ["--bitwise"], 0),
        ("vllm-vs-fixture", "vllm-backend", "fixture-q4", [], 0),
        # Across backends, bit for bit is measured, not required (None).
        ("vllm-vs-fixture-bitwise", "vllm-backend", "fixture-q4", ["--bitwise"], None),
    ]
    lines = ["# Gates of the fixture's conversions and backends",
             "",
             f"Made by `make gate` (scripts/gate_records.py) with the suite `{a.suite.name}`; "
             "each record in its folder (record.json, summary.md, reliability plots), "
             "each gate's output in gate-*.txt, accuracy per set beside the reference in accuracy-*.png.",
             ""]
    wrong = []
    for name, cand, ref, extra, expected in results:
        code = gate(a.out, name, cand, ref, *extra)
        verdict = ("measured, not required" if expected is None
                   else "as expected" if code == expected else "NOT as expected")
        lines += [f"## {name}: {'passes' if code == 0 else 'fails'} ({verdict})", "",
                  "```", (a.out / f"gate-{name}.txt").read_text().rstrip(), "```", ""]
        if expected is not None and code != expected:
            wrong.append(name)
    (a.out / "summary.md").write_text("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)
    if wrong:
        sys.exit(f"gates not as expected: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
