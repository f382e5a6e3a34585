"""Shared by the benchmarks: start servers on loopback, build real prompts,
time requests, write run records."""

import atexit
import datetime
import http.client
import json
import os
import pathlib
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("DECISIO_CACHE", pathlib.Path.home() / ".cache/decisio"))
ASSETS = pathlib.Path(os.environ.get("DECISIO_ASSETS", CACHE / "assets"))
MODEL = pathlib.Path(os.environ.get("DECISIO_MODEL", CACHE / "models/smollm2-135m-instruct"))
# The binary `make setup` builds (make builds in $CARGO_TARGET_DIR).
DECISIO = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release/decisio"


OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, path="/health", limit=180):
    """Waits until GET `path` answers 200; raises when `proc` exits or the
    limit passes (the process is killed then)."""
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited early")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server on port {port} did not become healthy")


def start_decisio(model=MODEL, extra=(), env=None):
    """decisio on a free port; without `--state-dir` in `extra`, with a
    fresh state folder of its own (removed when this process ends): the
    default one may be held by a server already running (`make serve`).
    `env`: its environment (default: this process's)."""
    port = free_port()
    extra = list(extra)
    if "--state-dir" not in extra:
        state = tempfile.mkdtemp(prefix="decisio-bench-state-")
        atexit.register(shutil.rmtree, state, ignore_errors=True)
        extra += ["--state-dir", state]
    proc = subprocess.Popen(
        [str(DECISIO), "serve", "--model", str(model),
         "--served-model-name", "model", "--port", str(port), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wait_healthy(port, proc)
    return proc, port


def start_mlx_lm(model=MODEL):
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if os.path.exists(OPENBLAS):
        # The same BLAS decisio links (the wheel's own is the slow reference one).
        env["LD_PRELOAD"] = OPENBLAS
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_lm.server", "--model", str(model), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wait_healthy(port, proc, path="/v1/models")
    return proc, port


def llama_cpp():
    """llama.cpp's server and the fixture's GGUF at float32, built or found in
    the cache by scripts/bench/llama_server.sh; returns (folder, version)."""
    out = subprocess.run(["bash", str(ROOT / "scripts/bench/llama_server.sh")], check=True,
                         stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHON=sys.executable)).stdout.strip()
    folder = pathlib.Path(out.splitlines()[-1])
    return folder, folder.name.split("-", 1)[1]


def start_llama_server(gguf, threads=None):
    """llama.cpp's server on `gguf`: one slot (its prompt cache reuses the
    previous prompt's prefix), the GGUF's own chat template, a context of
    8,192 tokens (the fixture's), one thread per core."""
    folder, _ = llama_cpp()
    port = free_port()
    threads = str(threads or os.cpu_count())
    proc = subprocess.Popen(
        [str(folder / "llama-server"), "--model", str(gguf), "--port", str(port),
         "--host", "127.0.0.1", "--parallel", "1", "--ctx-size", "8192",
         "--threads", threads, "--threads-batch", threads, "--jinja", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthy(port, proc)
    return proc, port


def post(port, path, body):
    """POSTs JSON on a fresh loopback connection; returns (seconds, parsed body)."""
    data = json.dumps(body).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200:
        raise RuntimeError(f"{path} on port {port}: {r.status} {raw[:300]!r}")
    return dt, json.loads(raw)


def drive(port, clients, seconds, body, path="/v1/completions", timeout=60):
    """`clients` threads, each with its own kept-alive connection and one
    request in flight, post until the deadline; an error is any answer but
    200 or a failed connection. Returns (latencies, errors, wall seconds)."""
    latencies, errors, lock = [], [], threading.Lock()
    start = threading.Barrier(clients + 1)

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        mine, bad = [], []
        start.wait()
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                ok = r.status == 200
            except (OSError, http.client.HTTPException) as e:
                ok, data = False, repr(e).encode()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            if ok:
                mine.append(time.perf_counter() - t)
            else:
                bad.append(data[:200].decode(errors="replace"))
        with lock:
            latencies.extend(mine)
            errors.extend(bad)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    return latencies, errors, time.perf_counter() - started


def mmlu_rows(n=2000):
    rows = []
    with open(ASSETS / "mmlu.jsonl") as f:
        for line in f:
            row = json.loads(line)
            if row.get("correct_answer") in ("A", "B", "C", "D"):
                rows.append(row)
            if len(rows) >= n:
                break
    return rows


def question_text(row):
    return row["question"].strip() + "\n" + "\n".join(
        f"{k}. {row['answer_' + k.lower()]}" for k in "ABCD")


def nearest_rank(values, q):
    """The q-quantile of `values` by nearest rank (None when empty)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def median_ms(f, n, warm=1):
    """Median wall time of `f()` in milliseconds over n runs, after `warm`
    untimed ones; `f` returns MLX arrays, evaluated inside the timing."""
    import mlx.core as mx
    for _ in range(warm):
        mx.eval(f())
    times = []
    for _ in range(n):
        s = time.perf_counter()
        mx.eval(f())
        times.append(time.perf_counter() - s)
    return statistics.median(times) * 1e3


CUE = "Answer with the letter of the correct option."


def mmlu_block(row):
    """An MMLU row as a lettered question with the answer cue."""
    text = row["question"].strip()
    for k in "abcd":
        text += f"\n{k.upper()}. {str(row['answer_' + k]).strip()}"
    return text + "\n" + CUE


def settle():
    """A pause before a timed request: on few cores the other server's BLAS
    threads keep spinning for a moment after its own request, and would be
    timed as part of this one."""
    time.sleep(1.0)


def summarize(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def machine():
    return {"platform": platform.platform(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def run_dir(name):
    day = datetime.date.today().isoformat()
    d = ROOT / "runs" / f"{day}_{name}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def paired_bars(bars, names, y, title, path):
    """Draws `bars` ([{"name", "a", "b"}], `names` the two series) as a PNG
    with the project's `paired_bars` example; False when it is not built."""
    exe = DECISIO.parent / "examples" / "paired_bars"
    if not exe.exists():
        return False
    spec = {"rows": bars, "names": names, "y": y, "title": title}
    subprocess.run([str(exe), json.dumps(spec), str(path)], check=True)
    return True
