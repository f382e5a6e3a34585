"""Gateway overhead of the vLLM backend on loopback.

Sends the same token-id completion (`max_tokens` 1, `logprobs` 1) to an
upstream directly and through a `decisio serve --backend vllm` gateway in
front of it, interleaved, one request at a time, and reports the latency of
each path and the difference of their percentiles.

Two forms:

    vllm_overhead.py UPSTREAM_PORT GATEWAY_PORT N OUT.json
        Servers already started by hand (the 2026-11-30 record).

    vllm_overhead.py replay DECISIO_BINARY MODEL_DIR N OUT_DIR
                     [--clients 64] [--seconds 10] [--decide N] [--rounds R]
        Starts the replay upstream (`vllm_replay.py`: vLLM's answer shapes,
        constant near-zero latency, nothing real) and a gateway in front of
        it, then measures (1) N interleaved completions direct vs through
        the gateway, (2) N `/v1/decide` requests of one state and one
        question through the gateway (render, tokenize, one upstream call,
        letters read), each against the replayed completion it makes, and
        (3) throughput at `--clients` concurrent kept-alive clients for
        `--seconds` per path; all of it `--rounds` times, with the median
        of each figure over the rounds. Writes OUT_DIR/overhead.json.
"""

import argparse
import http.client
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import common

BODY = {"model": "smollm2", "prompt": [1, 504, 3458, 282], "max_tokens": 1,
        "temperature": 0, "logprobs": 1}
HERE = pathlib.Path(__file__).resolve().parent


def post(conn, body, path="/v1/completions"):
    t = time.perf_counter()
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    assert r.status == 200, data
    return time.perf_counter() - t


def ms(s):
    return round(s * 1000, 3)


def stats(v):
    q = common.nearest_rank
    return {"p50": ms(q(v, 0.5)), "p90": ms(q(v, 0.9)), "p99": ms(q(v, 0.99)),
            "p99.9": ms(q(v, 0.999)), "mean": ms(statistics.mean(v)),
            "min": ms(min(v)), "max": ms(max(v))}


def diff(a, b):
    return {k: round(b[k] - a[k], 3) for k in ("p50", "p90", "p99", "p99.9", "mean")}


def interleaved(up, gw, body_up, body_gw, n, warm, path_gw="/v1/completions"):
    """`n` requests per path, one at a time, alternating which goes first."""
    cu = http.client.HTTPConnection("127.0.0.1", up)
    cg = http.client.HTTPConnection("127.0.0.1", gw)
    for _ in range(warm):
        post(cu, body_up)
        post(cg, body_gw, path_gw)
    direct, through = [], []
    for i in range(n):
        if i % 2:
            direct.append(post(cu, body_up))
            through.append(post(cg, body_gw, path_gw))
        else:
            through.append(post(cg, body_gw, path_gw))
            direct.append(post(cu, body_up))
    return direct, through


def legacy(argv):
    up, gw, n, out = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    body = json.dumps(BODY)
    direct, through = interleaved(up, gw, body, body, n, 20)
    result = {"requests_per_path": n,
              "direct_ms": {k: v for k, v in stats(direct).items() if k in ("p50", "p99", "mean")},
              "gateway_ms": {k: v for k, v in stats(through).items()
                             if k in ("p50", "p99", "mean")}}
    result["overhead_ms"] = {k: round(result["gateway_ms"][k] - result["direct_ms"][k], 3)
                             for k in ("p50", "p99", "mean")}
    json.dump(result, open(out, "w"), indent=2)
    print(json.dumps(result, indent=2))


def drive(port, clients, seconds, body, path="/v1/completions"):
    latencies, errors, wall = common.drive(port, clients, seconds, body, path, timeout=60)
    return {"requests": len(latencies), "errors": len(errors), "error_samples": errors[:3],
            "seconds": round(wall, 2), "requests_per_second": round(len(latencies) / wall, 1),
            "latency_ms": {k: v for k, v in stats(latencies).items()
                           if k in ("p50", "p90", "p99", "max", "mean")}}


DECIDE = {"state": "You are sorting support tickets for a bicycle shop. "
                   "The ticket: my rear brake squeaks when it rains.",
          "questions": [{"text": "Which team handles this ticket?",
                         "options": ["Repairs", "Sales", "Billing", "Shipping"]}]}


def measure(a, up, gw):
    """One round of (1), (2) and (3)."""
    out = {}
    # (1) The same completion, direct and through the gateway.
    body = json.dumps(BODY)
    direct, through = interleaved(up, gw, body, body, a.n, a.warm)
    out["completion"] = {"requests_per_path": a.n, "warm_up_per_path": a.warm,
                         "direct_ms": stats(direct), "gateway_ms": stats(through),
                         "overhead_ms": diff(stats(direct), stats(through))}

    # (2) /v1/decide of one state and one question through the gateway,
    # against the one completion it sends upstream, replayed direct: the
    # rendered prompt's length in tokens, the four letters named.
    c = http.client.HTTPConnection("127.0.0.1", gw)
    c.request("POST", "/v1/decide", json.dumps(DECIDE), {"Content-Type": "application/json"})
    r = c.getresponse()
    answer = json.loads(r.read())
    assert r.status == 200, answer
    prompt_tokens = answer["usage"]["prompt_tokens"]
    body_up = json.dumps({"model": "smollm2", "prompt": [1] * prompt_tokens,
                          "max_tokens": 1, "temperature": 0.0, "logprobs": 1,
                          "logprob_token_ids": [49, 50, 51, 52],
                          "return_tokens_as_token_ids": True})
    nd = a.decide if a.decide is not None else a.n
    if nd:
        direct, through = interleaved(up, gw, body_up, json.dumps(DECIDE), nd, a.warm,
                                      "/v1/decide")
        out["decide"] = {"requests_per_path": nd, "prompt_tokens": prompt_tokens,
                         "direct_ms": stats(direct), "gateway_ms": stats(through),
                         "overhead_ms": diff(stats(direct), stats(through))}

    # (3) Throughput at `clients` concurrent clients, each path in turn.
    if a.clients and a.seconds:
        out["throughput"] = {"clients": a.clients, "seconds_per_path": a.seconds,
                             "direct": drive(up, a.clients, a.seconds, body),
                             "gateway": drive(gw, a.clients, a.seconds, body)}
    return out


def replay(argv):
    ap = argparse.ArgumentParser(prog="vllm_overhead.py replay")
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("n", type=int)
    ap.add_argument("out")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--decide", type=int, default=None, help="decide requests (default: n)")
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of (1), (2) and (3)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    up, gw = common.free_port(), common.free_port()
    scratch = tempfile.mkdtemp(prefix="decisio-bench-")
    upstream = subprocess.Popen([sys.executable, str(HERE / "vllm_replay.py"), str(up),
                                 "--served-model-name", "smollm2"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gateway = None
    try:
        common.wait_healthy(up, upstream)
        gateway = subprocess.Popen(
            [a.binary, "serve", "--backend", "vllm", "--upstream", f"http://127.0.0.1:{up}",
             "--model", a.model, "--served-model-name", "smollm2", "--port", str(gw),
             "--max-queue", str(2 * a.clients), "--state-dir", os.path.join(scratch, "gw")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        common.wait_healthy(gw, gateway)
        home = os.path.expanduser("~")
        shown = [x.replace(home, "~", 1) if x.startswith(home) else x for x in argv]
        result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                              "python": platform.python_version()},
                  "command": "python3 scripts/bench/vllm_overhead.py replay " + " ".join(shown),
                  "request": BODY, "decide_body": DECIDE, "rounds": []}
        for _ in range(a.rounds):
            result["rounds"].append(measure(a, up, gw))
        rounds = result["rounds"]
        med = lambda f: round(statistics.median(f(r) for r in rounds), 3)
        result["median_over_rounds"] = {
            part: {"overhead_ms": {k: med(lambda r: r[part]["overhead_ms"][k])
                                   for k in ("p50", "p90", "p99", "p99.9", "mean")},
                   "direct_ms": {k: med(lambda r: r[part]["direct_ms"][k])
                                 for k in ("p50", "p99", "p99.9")}}
            for part in ("completion", "decide") if part in rounds[0]}
        if "throughput" in rounds[0]:
            result["median_over_rounds"]["throughput_rps"] = {
                k: med(lambda r: r["throughput"][k]["requests_per_second"])
                for k in ("direct", "gateway")}
    finally:
        if gateway is not None:
            gateway.kill()
        upstream.kill()
    with open(os.path.join(a.out, "overhead.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] == ["replay"]:
        replay(sys.argv[2:])
    else:
        legacy(sys.argv[1:])
