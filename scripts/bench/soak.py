"""Hostile load test: many clients of every route, one of them hostile.

Usage: python scripts/bench/soak.py [--clients 32] [--seconds 600]

One fresh server (`decisio serve`, default settings, MLX, the fixture) on
127.0.0.1. For `--seconds`, `--clients` - 1 well-formed clients, each with
its own connection per request, in turn by kind:
  - System One (`POST /v1/systemone`): one to three new questions (`noul`,
    a `choice` of 4, a `score` of 5 levels) on one of 8 documents;
  - OpenAI chat through the OpenAI Python SDK (no retries): a new question
    on a document, 8 tokens greedy;
  - `/v1/decide`: one to three new lettered questions on a document.
Every question is new: none is asked twice in the run. One more client is
hostile, in a loop: an oversize state (7 MB, 256 questions; 413 expected),
the heaviest request that fits (a document of ~5,300 tokens with 256
questions of 255 options, a new one every fourth round) left after 5 s
(mid-read, then mid-pass once its state is read), a body that is not
UTF-8, a truncated zstd body, a body that is not JSON (each a 4xx).

Checks: no 5xx to a well-formed request; no lost answer (every request
answered, or refused with a 4xx, none dropped); no hostile request
answered 5xx; resident memory within its bound (its size once loaded, the
prefix cache's budget, MLX's buffer cache cap and 512 MiB) and flat within
10 % once both caches have filled (the median of the minute from then
against that of the last). Writes
runs/<date>_soak/{summary.md,results.json,latency.png} (p50 and p99 of
the well-formed requests per minute, drawn by the paired_bars example);
exits 1 when a check fails.
"""

import argparse
import http.client
import itertools
import json
import socket
import statistics
import threading
import time

import common

# Numbers of the questions: each asked once in the run.
QUESTION = itertools.count()
LOCK = threading.Lock()


def next_n():
    with LOCK:
        return next(QUESTION)


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cache_bytes(port):
    """(bytes held, budget) of the prefix cache and the bytes MLX's buffer
    cache holds, from /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    value = lambda name: next(float(l.split()[1]) for l in text.splitlines()  # noqa: E731
                              if l.startswith(name + " "))
    return (value("decisio_prefix_cache_bytes"), value("decisio_prefix_cache_capacity_bytes"),
            value('decisio_mlx_memory_bytes{kind="cache"}'))


def send(port, path, data, headers, timeout=900):
    """(status, seconds) of one POST on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", path, data, {"Content-Type": "application/json", **headers})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, time.perf_counter() - t0


def systemone_body(doc, k):
    qs = {}
    for j in range(k):
        n = next_n()
        kind = n % 3
        if kind == 0:
            qs[f"q{j}"] = {"type": "noul", "instructions": f"Does the text mention item {n}?"}
        elif kind == 1:
            qs[f"q{j}"] = {"type": "choice", "instructions": f"Which topic fits case {n} best?",
                           "criteria": {"math": None, "history": None, "law": None,
                                        "biology": None}}
        else:
            qs[f"q{j}"] = {"type": "score", "instructions": f"How hard is case {n}?",
                           "criteria": ["very easy", "easy", "medium", "hard", "very hard"]}
    return {"state": doc, "questions": qs}


def decide_body(doc, k):
    return {"state": doc, "questions": [
        {"text": f"Which of these fits case {next_n()} best?",
         "options": ["math", "history", "law", "biology"]} for _ in range(k)]}


def well_formed(port, docs, i, stop, out):
    """Client `i`: its kind's requests until `stop`; each outcome in `out`."""
    from openai import OpenAI
    import openai
    kind = ("systemone", "chat", "decide")[i % 3]
    sdk = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                 timeout=900)
    r = 0
    while time.perf_counter() < stop:
        doc = docs[(i + r) % len(docs)]
        k = 1 + r % 3
        r += 1
        t0 = time.perf_counter()
        try:
            if kind == "chat":
                try:
                    sdk.chat.completions.create(
                        model="model", max_tokens=8, temperature=0,
                        messages=[{"role": "user",
                                   "content": f"{doc}\n\nIn one word: what is case {next_n()}?"}])
                    status = 200
                except openai.APIStatusError as e:
                    status = e.status_code
            else:
                path, body = (("/v1/systemone", systemone_body(doc, k)) if kind == "systemone"
                              else ("/v1/decide", decide_body(doc, k)))
                status, _ = send(port, path, json.dumps(body).encode(), {})
            out.append((kind, t0, time.perf_counter() - t0, status))
        except Exception as e:  # noqa: BLE001 - a lost answer, whatever the cause
            out.append((kind, t0, time.perf_counter() - t0, f"lost: {type(e).__name__}: {e}"))


def leave_mid_pass(port, data, after):
    """Sends `data` to /v1/systemone and closes the connection after
    `after` seconds, or once answered (its status then)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
              b"application/json\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n"
              + data)
    s.settimeout(after)
    try:
        head = s.recv(64)
        return int(head.split()[1]) if head else "closed"
    except socket.timeout:
        return None
    finally:
        s.close()


def hostile(port, rows, stop, out):
    """The hostile client's loop until `stop`; each outcome in `out`."""
    from backports import zstd
    oversize = json.dumps({"state": "word " * 1_400_000, "questions": {
        f"q{i}": {"type": "noul", "instructions": f"Is it {i}?"} for i in range(256)}}).encode()
    criteria = {f"option_{j:03d}": None for j in range(255)}
    small = json.dumps(systemone_body("A short note.", 1)).encode()
    docs = itertools.count()
    while time.perf_counter() < stop:
        # A new document every fourth round: the rounds between read on
        # from the part kept when the last one left, so that later ones
        # leave in the middle of its questions' passes.
        d = next(docs) // 4
        block = rows[(45 * d) % (len(rows) - 45):][:45]
        heavy = json.dumps({"state": "\n\n".join(common.mmlu_block(r) for r in block)
                            + f"\n\n(document {d})", "questions": {
            f"q{i}": {"type": "choice", "instructions": f"Which option is question {i} about?",
                      "criteria": criteria} for i in range(256)}}).encode()
        cases = [
            ("oversize", lambda: send(port, "/v1/systemone", oversize, {})[0]),
            ("left mid-pass", lambda: leave_mid_pass(port, heavy, 5.0)),
            ("bad utf-8", lambda: send(port, "/v1/systemone",
                                       b'{"state": "caf\xe9 \xff", "questions": {}}', {})[0]),
            ("truncated zstd", lambda: send(port, "/v1/systemone",
                                            zstd.compress(small)[:-7],
                                            {"Content-Encoding": "zstd"})[0]),
            ("not json", lambda: send(port, "/v1/decide", b'{"state": "x", "questions": [', {})[0]),
        ]
        for name, run in cases:
            if time.perf_counter() >= stop:
                break
            t0 = time.perf_counter()
            try:
                status = run()
            except Exception as e:  # noqa: BLE001
                status = f"lost: {type(e).__name__}: {e}"
            out.append((name, t0, time.perf_counter() - t0, status))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--mlx-cache-cap-mib", type=float, default=1024,
                    help="MLX's buffer cache cap on this device (CACHE_CAP on the CPU)")
    a = ap.parse_args()
    rows = common.mmlu_rows(600)
    docs = ["\n\n".join(common.mmlu_block(r) for r in rows[i * 3:(i + 1) * 3]) for i in range(8)]

    proc, port = common.start_decisio()
    rss, answers, attacks = [], [], []
    try:
        rss_loaded = rss_kib(proc.pid)
        start = time.perf_counter()
        stop = start + a.seconds
        threads = [threading.Thread(target=well_formed, args=(port, docs, i, stop, answers))
                   for i in range(a.clients - 1)]
        threads.append(threading.Thread(target=hostile, args=(port, rows[100:], stop, attacks)))
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            held, budget, mlx = cache_bytes(port)
            rss.append((time.perf_counter() - start, rss_kib(proc.pid) / 1024,
                        held / 2**20, budget / 2**20, mlx / 2**20))
            time.sleep(5)
        for t in threads:
            t.join()
        health = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        health.request("GET", "/health")
        healthy = health.getresponse().status
    finally:
        proc.terminate()
        proc.wait()

    ok = [x for x in answers if x[3] == 200]
    refused = [x for x in answers if isinstance(x[3], int) and 400 <= x[3] < 500]
    server_errors = [x for x in answers if isinstance(x[3], int) and x[3] >= 500]
    lost = [x for x in answers if not isinstance(x[3], int)]
    hostile_5xx = [x for x in attacks if isinstance(x[3], int) and x[3] >= 500]
    hostile_lost = [x for x in attacks if isinstance(x[3], str)]
    minutes = int(a.seconds // 60)
    per_minute = []
    for m in range(max(1, minutes)):
        lat = [x[2] for x in ok if m * 60 <= x[1] - start < (m + 1) * 60]
        per_minute.append({"minute": m + 1, "n": len(lat),
                           "p50": common.nearest_rank(lat, 0.5),
                           "p99": common.nearest_rank(lat, 0.99)})

    def median_rss(lo, hi):
        v = [r[1] for r in rss if lo <= r[0] < hi]
        return statistics.median(v) if v else None

    # The prefix cache fills to its budget (`--prefix-cache-mb`) with the
    # states read, and MLX's buffer cache to its cap (1 GiB on the CPU,
    # `CACHE_CAP` in src/engine/mlx/memory.rs); from then on the process
    # should hold what it holds.
    full_at = next((r[0] for r in rss
                    if r[2] >= 0.9 * r[3] > 0 and r[4] >= 0.9 * a.mlx_cache_cap_mib), None)
    since = 60 if full_at is None else full_at
    early, late = median_rss(since, since + 60), median_rss(a.seconds - 60, a.seconds + 1)
    drift = (late - early) / early if early and late else None
    # What the process may hold: its resident memory once loaded, the
    # prefix cache's budget, MLX's buffer cache cap, and 512 MiB of a
    # step's own arrays and the allocator's slack.
    bound = rss_loaded / 1024 + (rss[-1][3] if rss else 0) + a.mlx_cache_cap_mib + 512
    kinds = {}
    for k in ("systemone", "chat", "decide"):
        lat = [x[2] for x in ok if x[0] == k]
        kinds[k] = {"answered": len(lat), "p50": common.nearest_rank(lat, 0.5),
                    "p99": common.nearest_rank(lat, 0.99),
                    "refused": len([x for x in refused if x[0] == k])}
    attack_kinds = {}
    for x in attacks:
        attack_kinds.setdefault(x[0], {}).setdefault(str(x[3]), 0)
        attack_kinds[x[0]][str(x[3])] += 1
    lat_all = [x[2] for x in ok]
    checks = {
        "no 5xx to a well-formed request": not server_errors,
        "no lost answer": not lost and not hostile_lost,
        "no 5xx to a hostile request": not hostile_5xx,
        "resident memory flat within 10 % once its caches are full":
            drift is not None and abs(drift) <= 0.10,
        "resident memory within its bound": max((r[1] for r in rss), default=0) <= bound,
        "healthy after": healthy == 200,
    }
    rec = {
        "machine": common.machine(), "settings": vars(a),
        "requests": {"well_formed": len(answers), "answered": len(ok), "refused_4xx": len(refused),
                     "5xx": len(server_errors), "lost": len(lost)},
        "by_kind": kinds, "hostile": attack_kinds,
        "p50_s": common.nearest_rank(lat_all, 0.5), "p99_s": common.nearest_rank(lat_all, 0.99),
        "per_minute": per_minute,
        "rss_mib": {"loaded": rss_loaded / 1024, "cache_full_at_s": full_at,
                    "minute_after_full": early, "last_minute": late, "drift": drift,
                    "max": max((r[1] for r in rss), default=None),
                    "bound": bound,
                    "series": [{"t": t, "rss": m, "prefix_cache": c, "budget": b, "mlx_cache": x}
                               for t, m, c, b, x in rss]},
        "checks": checks,
        "failures": {"server_errors": server_errors[:20], "lost": lost[:20],
                     "hostile_5xx": hostile_5xx[:20], "hostile_lost": hostile_lost[:20]},
    }
    out = common.run_dir("soak")
    (out / "results.json").write_text(json.dumps(rec, indent=1))
    s = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [
        "# Hostile load test (MLX, the fixture)", "",
        f"Command: `python scripts/bench/soak.py --clients {a.clients} --seconds {a.seconds:g}`.",
        f"Machine: {rec['machine']['cpus']} CPUs, {rec['machine']['platform']}; MLX's CPU build.",
        "", f"{a.clients - 1} well-formed clients (System One, OpenAI chat through the OpenAI "
        "SDK, `/v1/decide`, in turn; every question new) and one hostile client (an oversize "
        "state, 256 questions of 255 options on a document left after 5 s, mid-read or mid-pass, a "
        f"body not UTF-8, a truncated zstd body, a body not JSON), for {a.seconds:g} s on 127.0.0.1.",
        "", "| check | result |", "|---|---|"]
    lines += [f"| {k} | {'pass' if v else '**FAIL**'} |" for k, v in checks.items()]
    r = rec["requests"]
    lines += ["", f"Well-formed requests: {r['well_formed']}; answered {r['answered']}, refused "
              f"4xx {r['refused_4xx']}, 5xx {r['5xx']}, lost {r['lost']}. Latency of the "
              f"answered: p50 {s(rec['p50_s'])} s, p99 {s(rec['p99_s'])} s.", "",
              "| kind | answered | refused 4xx | p50 s | p99 s |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {v['answered']} | {v['refused']} | {s(v['p50'])} | {s(v['p99'])} |"
              for k, v in kinds.items()]
    lines += ["", "Hostile requests, by answer (`None`: left mid-pass, unanswered as meant):", "",
              "| request | answers |", "|---|---|"]
    lines += [f"| {k} | {', '.join(f'{st}: {n}' for st, n in v.items())} |"
              for k, v in attack_kinds.items()]
    budget = rss[-1][3] if rss else 0
    full = ("did not both fill" if full_at is None
            else f"held 90 % of their bounds ({budget:.0f} and {a.mlx_cache_cap_mib:.0f} MiB) "
            f"from {full_at:.0f} s")
    lines += ["", f"Resident memory (MiB): {rec['rss_mib']['loaded']:.0f} loaded; the prefix "
              f"cache and MLX's buffer cache {full}; median {s(early)} in the minute from then "
              f"(from 60 s when they did not), {s(late)} in the last minute, max "
              f"{s(rec['rss_mib']['max'])} against a bound of {bound:.0f} (loaded, the prefix "
              "cache's budget, MLX's cache cap and 512 MiB); drift "
              f"{s(None if drift is None else drift * 100)} %.", "",
              "| s | RSS MiB | prefix cache MiB | MLX cache MiB |", "|---|---|---|---|"]
    lines += [f"| {t:.0f} | {m:.0f} | {c:.0f} | {x:.0f} |" for t, m, c, _, x in rss[::12]]
    lines += ["", "| minute | answered | p50 s | p99 s |", "|---|---|---|---|"]
    lines += [f"| {m['minute']} | {m['n']} | {s(m['p50'])} | {s(m['p99'])} |" for m in per_minute]
    bars = [{"name": f"min {m['minute']}", "a": m["p50"] or 0, "b": m["p99"] or 0}
            for m in per_minute]
    if common.paired_bars(bars, ["p50", "p99"], "s", "Well-formed requests under a hostile client",
                          out / "latency.png"):
        lines += ["", "`latency.png`: p50 and p99 per minute, drawn by the paired_bars example."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print((out / "summary.md").read_text())
    raise SystemExit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
