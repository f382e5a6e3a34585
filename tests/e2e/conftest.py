"""A real `decisio serve` on a free loopback port, for the OpenAI SDK tests."""

import os
import pathlib
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("DECISIO_CACHE", pathlib.Path.home() / ".cache/decisio"))
MODEL = pathlib.Path(os.environ.get("DECISIO_MODEL", CACHE / "models/smollm2-135m-instruct"))
API_KEY = "test-key-e2e"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server():
    assert (MODEL / "config.json").exists(), f"fixture model missing at {MODEL}; run make setup"
    port = free_port()
    state_dir = tempfile.mkdtemp(prefix="decisio-e2e-state-")
    proc = subprocess.Popen(
        [str(ROOT / "target/release/decisio"), "serve", "--model", str(MODEL),
         "--served-model-name", "smollm2", "--port", str(port), "--api-key", API_KEY,
         "--state-dir", state_dir],
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:
            if proc.poll() is not None:
                raise RuntimeError("decisio exited before it was ready")
            time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError("decisio did not become healthy")
    yield base
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture()
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0)
