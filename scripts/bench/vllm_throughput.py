"""Throughput of the vLLM backend at 64 concurrent clients, side by side.

Starts an upstream (`decisio serve` with the MLX backend, the stand-in for a
vLLM server on this GPU-less machine) and a `decisio serve --backend vllm`
gateway in front of it, then, in one run, drives each path for the same
time with the same number of concurrent clients (64 threads, each with its
own kept-alive connection, one request in flight at a time), sending the
same token-id completion (`max_tokens` 1, `logprobs` 1). Reports requests
per second, latency percentiles and errors per path; an error is any answer
but 200, or a failed connection.

usage: vllm_throughput.py DECISIO_BINARY MODEL_DIR SECONDS OUT_DIR [CLIENTS]
"""

import http.client
import json
import os
import socket
import subprocess
import tempfile
import sys
import threading
import time

BODY = json.dumps({"model": "smollm2", "prompt": [1, 504, 3458, 282], "max_tokens": 1,
                   "temperature": 0, "logprobs": 1})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, model, port, extra):
    p = subprocess.Popen([binary, "serve", "--model", model, "--served-model-name", "smollm2",
                          "--port", str(port), *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        time.sleep(0.1)
    p.kill()
    raise SystemExit(f"the server on port {port} did not become healthy")


def drive(port, clients, seconds):
    """`clients` threads post until the deadline; returns latencies and errors."""
    latencies, errors, lock = [], [], threading.Lock()
    deadline = time.perf_counter() + seconds

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            try:
                conn.request("POST", "/v1/completions", BODY,
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                ok = r.status == 200
            except (OSError, http.client.HTTPException) as e:
                ok, data = False, repr(e).encode()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            with lock:
                if ok:
                    latencies.append(time.perf_counter() - t)
                else:
                    errors.append(data[:200].decode(errors="replace"))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors, time.perf_counter() - started


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else None


def summary(latencies, errors, wall):
    ms = lambda s: None if s is None else round(s * 1000, 1)
    return {"requests": len(latencies), "errors": len(errors), "error_samples": errors[:3],
            "seconds": round(wall, 2), "requests_per_second": round(len(latencies) / wall, 2),
            "latency_ms": {"p50": ms(pct(latencies, 0.5)), "p90": ms(pct(latencies, 0.9)),
                           "p99": ms(pct(latencies, 0.99)), "max": ms(max(latencies, default=None))}}


def main():
    binary, model, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    clients = int(sys.argv[5]) if len(sys.argv) > 5 else 64
    os.makedirs(out, exist_ok=True)
    up, gw = free_port(), free_port()
    # Room for every client's request in both queues (the default is 64).
    queue = ["--max-queue", str(2 * clients)]
    scratch = tempfile.mkdtemp(prefix="decisio-bench-")
    upstream = start(binary, model, up, queue + ["--state-dir", os.path.join(scratch, "up")])
    gateway = start(binary, model, gw, queue + ["--backend", "vllm", "--upstream",
                                               f"http://127.0.0.1:{up}", "--state-dir",
                                               os.path.join(scratch, "gw")])
    try:
        drive(up, 4, 3)  # warm-up
        direct = summary(*drive(up, clients, seconds))
        through = summary(*drive(gw, clients, seconds))
    finally:
        gateway.kill()
        upstream.kill()
    result = {"clients": clients, "seconds_per_path": seconds,
              "request": json.loads(BODY), "direct": direct, "gateway": through}
    with open(os.path.join(out, "throughput.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


main()
