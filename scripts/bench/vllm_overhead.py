"""Gateway overhead of the vLLM backend on loopback.

Sends the same token-id completion (`max_tokens` 1, `logprobs` 1) to an
upstream directly and through a `decisio serve --backend vllm` gateway in
front of it, interleaved, one request at a time, and reports the latency of
each path and the difference of their percentiles.

usage: vllm_overhead.py UPSTREAM_PORT GATEWAY_PORT N OUT.json
"""

import http.client
import json
import statistics
import sys
import time


def post(conn, body):
    t = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    assert r.status == 200, data
    return time.perf_counter() - t


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    up, gw, n, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    body = json.dumps({"model": "smollm2", "prompt": [1, 504, 3458, 282], "max_tokens": 1,
                       "temperature": 0, "logprobs": 1})
    cu = http.client.HTTPConnection("127.0.0.1", up)
    cg = http.client.HTTPConnection("127.0.0.1", gw)
    for _ in range(20):
        post(cu, body)
        post(cg, body)
    direct, through = [], []
    for _ in range(n):
        direct.append(post(cu, body))
        through.append(post(cg, body))
    ms = lambda s: round(s * 1000, 3)
    result = {
        "requests_per_path": n,
        "direct_ms": {"p50": ms(pct(direct, 0.5)), "p99": ms(pct(direct, 0.99)),
                      "mean": ms(statistics.mean(direct))},
        "gateway_ms": {"p50": ms(pct(through, 0.5)), "p99": ms(pct(through, 0.99)),
                       "mean": ms(statistics.mean(through))},
    }
    result["overhead_ms"] = {k: round(result["gateway_ms"][k] - result["direct_ms"][k], 3)
                             for k in ("p50", "p99", "mean")}
    json.dump(result, open(out, "w"), indent=2)
    print(json.dumps(result, indent=2))


main()
