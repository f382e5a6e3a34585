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

import json
import os
import subprocess
import tempfile
import sys

import common

BODY = json.dumps({"model": "smollm2", "prompt": [1, 504, 3458, 282], "max_tokens": 1,
                   "temperature": 0, "logprobs": 1})


def start(binary, model, port, extra):
    p = subprocess.Popen([binary, "serve", "--model", model, "--served-model-name", "smollm2",
                          "--port", str(port), *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    common.wait_healthy(port, p, limit=120)
    return p


def summary(latencies, errors, wall):
    ms = lambda s: None if s is None else round(s * 1000, 1)
    q = common.nearest_rank
    return {"requests": len(latencies), "errors": len(errors), "error_samples": errors[:3],
            "seconds": round(wall, 2), "requests_per_second": round(len(latencies) / wall, 2),
            "latency_ms": {"p50": ms(q(latencies, 0.5)), "p90": ms(q(latencies, 0.9)),
                           "p99": ms(q(latencies, 0.99)), "max": ms(max(latencies, default=None))}}


def main():
    binary, model, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    clients = int(sys.argv[5]) if len(sys.argv) > 5 else 64
    os.makedirs(out, exist_ok=True)
    up, gw = common.free_port(), common.free_port()
    # Room for every client's request in both queues (the default is 64).
    queue = ["--max-queue", str(2 * clients)]
    scratch = tempfile.mkdtemp(prefix="decisio-bench-")
    upstream = start(binary, model, up, queue + ["--state-dir", os.path.join(scratch, "up")])
    gateway = start(binary, model, gw, queue + ["--backend", "vllm", "--upstream",
                                               f"http://127.0.0.1:{up}", "--state-dir",
                                               os.path.join(scratch, "gw")])
    try:
        common.drive(up, 4, 3, BODY, timeout=120)  # warm-up
        direct = summary(*common.drive(up, clients, seconds, BODY, timeout=120))
        through = summary(*common.drive(gw, clients, seconds, BODY, timeout=120))
    finally:
        gateway.kill()
        upstream.kill()
    result = {"clients": clients, "seconds_per_path": seconds,
              "request": json.loads(BODY), "direct": direct, "gateway": through}
    with open(os.path.join(out, "throughput.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


main()
