"""Benchmark: small requests beside a heavy one (the fixture).

Usage: python scripts/bench/heavy.py [--clients 8] [--seconds 40] [--states 4]
                                     [--backend mlx|vllm]

One fresh server (`decisio serve`, default settings; with `--backend vllm`,
the vLLM backend in front of vLLM's CPU build serving the fixture at a
context of 4,096, so the heavy request's document is cut to fit). Then, in
order:
  1. time to refusal: three System One requests of an oversize state (7 MB
     of text, 256 questions), each timed to its 413;
  2. unloaded: `--clients` clients, each with its own connection, send
     small System One requests (one new `noul` question on one of
     `--states` documents of ~300 tokens, read once first) for `--seconds`,
     while a probe asks `GET /health` every 0.2 s;
  3. loaded: the same, while one more client sends the heaviest request the
     limits allow (a new document of 45 MMLU questions, 256 questions of
     255 options) and leaves after `--seconds` (its work is cancelled);
  4. memory: the server's resident memory (`VmRSS`) before the heavy
     request, its peak (`VmHWM`), and a second after the engine's queue
     emptied once the heavy client left.
Every small request is new work: a question never asked before.

Writes runs/<date>_heavy[-vllm]/{summary.md,results.json,latency.png}: p50 and p99
of the small requests and of `/health` in both phases, the p99 factor, the
time to 413, the memory; the plot with the project's `paired_bars` example
when built.
"""

import argparse
import http.client
import sys
import itertools
import json
import select
import threading
import time

import common

sys.path.insert(0, str(common.ROOT / "tests" / "e2e"))
from conftest import start_vllm, stop_vllm  # noqa: E402


def status_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def request(port, method, path, body=None, timeout=600):
    """(status, seconds) of one request on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    t0 = time.perf_counter()
    c.request(method, path, data, {"Content-Type": "application/json"} if data else {})
    r = c.getresponse()
    r.read()
    dt = time.perf_counter() - t0
    c.close()
    return r.status, dt


# Numbers of the small requests' questions: each asked once in the run.
QUESTION = itertools.count()


def queue_depth(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    line = next(l for l in text.splitlines() if l.startswith("decisio_queue_depth "))
    return float(line.split()[1])


def tokens(port, text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/tokenize", json.dumps({"prompt": text}),
              {"Content-Type": "application/json"})
    return json.loads(c.getresponse().read())["count"]


def small_body(doc, n):
    return {"state": doc, "questions": {"q": {
        "type": "noul", "instructions": f"Does the text mention item number {n}?"}}}


def phase(port, docs, clients, seconds, heavy=None):
    """Small requests from `clients` threads and /health probes for
    `seconds`; `heavy` (a body) sent by one more client that leaves at the
    end. Returns the latencies and errors."""
    small, health, errors = [], [], []
    stop = time.perf_counter() + seconds
    lock = threading.Lock()

    def client(i):
        while time.perf_counter() < stop:
            with lock:
                n = next(QUESTION)
            try:
                s, dt = request(port, "POST", "/v1/systemone", small_body(docs[i % len(docs)], n))
            except OSError as e:
                errors.append(str(e))
                continue
            (small if s == 200 else errors).append(dt if s == 200 else s)

    def probe():
        while time.perf_counter() < stop:
            s, dt = request(port, "GET", "/health")
            (health if s == 200 else errors).append(dt if s == 200 else s)
            time.sleep(0.2)

    heavy_answer = []

    def heavy_client():
        data = json.dumps(heavy).encode()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/systemone", data, {"Content-Type": "application/json"})
        while time.perf_counter() < stop:  # still at work unless it answered
            if select.select([c.sock], [], [], 0.1)[0]:
                heavy_answer.append(c.getresponse().status)
                break
        c.close()  # leaves: its work is cancelled

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    threads.append(threading.Thread(target=probe))
    if heavy:
        threads.append(threading.Thread(target=heavy_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if heavy and heavy_answer:
        raise RuntimeError(f"the heavy request was answered {heavy_answer[0]} before the end")
    return {"small_s": small, "health_s": health, "errors": errors}


def figures(values):
    return {"n": len(values), "p50": common.nearest_rank(values, 0.5),
            "p99": common.nearest_rank(values, 0.99), "max": max(values) if values else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--states", type=int, default=4)
    ap.add_argument("--backend", choices=("mlx", "vllm"), default="mlx")
    a = ap.parse_args()
    rows = common.mmlu_rows(400)
    docs = ["\n\n".join(common.mmlu_block(r) for r in rows[i * 3:(i + 1) * 3])
            for i in range(a.states)]
    # The heaviest request that fits the fixture's 8,192 tokens: a state of
    # 45 MMLU questions and 256 questions of 255 options, each ~1,400
    # tokens (option descriptions would take it over the context: 413).
    # In front of vLLM (a context of 4,096), 12 MMLU questions.
    big_doc = "\n\n".join(common.mmlu_block(r)
                          for r in rows[100:145 if a.backend == "mlx" else 112])
    criteria = {f"option_{j:03d}": None for j in range(255)}
    heavy = {"state": big_doc, "questions": {
        f"q{i}": {"type": "choice", "instructions": f"Which option is question {i} about?",
                  "criteria": criteria} for i in range(256)}}
    oversize = {"state": "word " * 1_400_000, "questions": {
        f"q{i}": {"type": "noul", "instructions": f"Is it {i}?"} for i in range(256)}}

    upstream = None
    if a.backend == "vllm":
        up = common.free_port()
        upstream = start_vllm(up)
        proc, port = common.start_decisio(
            extra=["--backend", "vllm", "--upstream", f"http://127.0.0.1:{up}"])
    else:
        proc, port = common.start_decisio()
    try:
        refusals = []
        for _ in range(3):
            s, dt = request(port, "POST", "/v1/systemone", oversize)
            assert s == 413, s
            refusals.append(dt)
        big_tokens = tokens(port, big_doc)
        for i, d in enumerate(docs):  # each document read once, untimed
            assert request(port, "POST", "/v1/systemone", small_body(d, -1 - i))[0] == 200
        unloaded = phase(port, docs, a.clients, a.seconds)
        rss_before = status_kib(proc.pid, "VmRSS")
        loaded = phase(port, docs, a.clients, a.seconds, heavy=heavy)
        left = time.perf_counter()
        while queue_depth(port) > 0 and time.perf_counter() - left < 300:
            time.sleep(0.05)  # the cancelled work stops within a step
        drained = time.perf_counter() - left
        time.sleep(1)
        rss_after = status_kib(proc.pid, "VmRSS")
        hwm = status_kib(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.wait()
        if upstream is not None:
            stop_vllm(upstream)

    rec = {
        "machine": common.machine(),
        "settings": vars(a),
        "time_to_413_s": refusals,
        "heavy_state_tokens": big_tokens,
        "unloaded": {k: figures(unloaded[k]) for k in ("small_s", "health_s")},
        "loaded": {k: figures(loaded[k]) for k in ("small_s", "health_s")},
        "errors": {"unloaded": unloaded["errors"], "loaded": loaded["errors"]},
        "rss_mib": {"before": rss_before / 1024, "peak": hwm / 1024, "after": rss_after / 1024},
        "drained_s": drained,
        "raw": {"unloaded": unloaded, "loaded": loaded},
    }
    p99 = rec["loaded"]["small_s"]["p99"] / rec["unloaded"]["small_s"]["p99"]
    rec["p99_factor"] = p99
    out = common.run_dir("heavy" if a.backend == "mlx" else "heavy-vllm")
    backend = ("MLX" if a.backend == "mlx"
               else "the vLLM backend in front of vLLM's CPU build; memory is the gateway's")
    (out / "results.json").write_text(json.dumps(rec, indent=1))
    ms = lambda v: f"{v * 1e3:.0f}"  # noqa: E731
    lines = [
        f"# Small requests beside the heaviest one ({backend.split(';')[0]}, the fixture)", "",
        "Command: `python scripts/bench/heavy.py "
        f"--clients {a.clients} --seconds {a.seconds:g} --states {a.states} "
        f"--backend {a.backend}`.",
        f"Machine: {rec['machine']['cpus']} CPUs, {rec['machine']['platform']}; {backend}.",
        "", f"{a.clients} clients, each one new `noul` question a request on one of {a.states} "
        "documents of ~300 tokens (read once before), `GET /health` every 0.2 s; loaded: one "
        f"more client sends a new document of {big_tokens} tokens with 256 questions of 255 "
        f"options (the most that fits the context) and leaves after {a.seconds:g} s (its work "
        "cancelled).", "",
        "| phase | small requests | p50 ms | p99 ms | max ms | /health p50 ms | /health p99 ms "
        "| /health max ms |", "|---|---|---|---|---|---|---|---|"]
    for name in ("unloaded", "loaded"):
        s, h = rec[name]["small_s"], rec[name]["health_s"]
        lines.append(f"| {name} | {s['n']} | {ms(s['p50'])} | {ms(s['p99'])} | {ms(s['max'])} "
                     f"| {ms(h['p50'])} | {ms(h['p99'])} | {ms(h['max'])} |")
    lines += ["", f"p99 factor (loaded over unloaded): **{p99:.2f}**. Errors: "
              f"{len(unloaded['errors'])} unloaded, {len(loaded['errors'])} loaded.", "",
              "Time to 413 for a 7 MB state with 256 questions (s): "
              + ", ".join(f"{t:.3f}" for t in refusals) + ".", "",
              f"Resident memory (MiB): {rec['rss_mib']['before']:.0f} before the heavy request, "
              f"peak {rec['rss_mib']['peak']:.0f}, {rec['rss_mib']['after']:.0f} a second after "
              f"the engine's queue was empty (its client left at the phase's end; the queue was "
              f"empty {drained:.2f} s after the phase's last small request).", ""]
    bars = [{"name": f"{w} {q}", "a": rec["unloaded"][k][q] * 1e3, "b": rec["loaded"][k][q] * 1e3}
            for k, w in (("small_s", "small"), ("health_s", "/health")) for q in ("p50", "p99")]
    if common.paired_bars(bars, ["unloaded", "beside the heavy request"], "ms",
                          "Latency beside a 256 x 255 request", out / "latency.png"):
        lines.append("`latency.png`: p50 and p99, unloaded and loaded, drawn by the paired_bars "
                     "example.")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
