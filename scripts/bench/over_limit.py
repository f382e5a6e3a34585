"""Record: over-long System One states cut as the reference decisio cuts them.

Usage: python scripts/bench/over_limit.py [--states 200] [--limit 512] [--seed 7]

Generates `--states` fresh System One requests on the fixture whose states
run from half to three times the ceiling (`scripts/reference/over_limit.py`'s
generator, a seed no test uses), and has the reference decisio 0.35.0 cut
each (`SystemOne.truncated_request`, run here in its environment) at the
ceiling `--limit` without padding. Then, on the fixture's MLX server and on
a vLLM-backend gateway in front of it, each started with
`--over-limit-tokens LIMIT`, each request is sent with
`"over_limit": "truncate"`, and the reference's kept text is sent as the
state of the same questions. Counted per backend: the reports equal to the
reference's (`kept_tokens`, `of_tokens`, `limit`), the refusals equal, the
answers of the cut state equal to those of the kept text bit for bit (so
the text decisio kept is the reference's, token for token), and the time of
the two requests (the kept text first, read anew; then the cut request,
whose kept part is found read: what the cut itself costs).

Writes runs/<date>_over-limit/{summary.md,results.json,seconds.png}.
Needs `make setup` and the reference decisio's code (the venv of
scripts/setup.sh).
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import time

import common

sys.path.insert(0, str(common.ROOT / "scripts" / "reference"))

from transformers import AutoTokenizer  # noqa: E402

import over_limit as ref  # noqa: E402


def cases(n, limit, seed):
    """`n` fresh requests, with the reference's cut of each."""
    tok = AutoTokenizer.from_pretrained(str(common.MODEL))
    family = ref.FORMATS[0][1]  # the Qwen format, the fixture's
    rng = random.Random(seed)
    kinds = ["noul", "choice", "score"]
    out = []
    for i in range(n):
        qs = {f"q{j}": ref.question(rng, kinds[(i + j) % 3]) for j in range(rng.randint(1, 3))}
        for q in qs.values():  # questions that leave room for a state
            if q["type"] == "choice" and len(q["criteria"]) > 26:
                q["criteria"] = dict(list(q["criteria"].items())[:26])
        body = {"model": "jev-latest", "state": ref.prose(rng, rng.randint(limit // 2, limit * 3)),
                "questions": qs}
        out.append(ref.cut(tok, family, body, limit, 0))
    return out


def timed(port, body):
    t0 = time.perf_counter()
    status, v = post(port, body)
    return status, v, time.perf_counter() - t0


def post(port, body):
    """(status, parsed body) of a System One request."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/systemone", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read())


def run(port, entries):
    """Each case on one server: what agreed, and the seconds of each pair."""
    agreed = {"reports": 0, "refusals": 0, "answers": 0, "whole": 0}
    seconds = []
    for e in entries:
        body = dict(e["request"], over_limit="truncate")
        if "error" in e or e["state"] is None:
            status, v, _ = timed(port, body)
            if "error" in e:
                agreed["refusals"] += status == 413 and v["detail"]["message"] == e["error"]
            else:
                agreed["whole"] += status == 200 and "x_truncated" not in v
            continue
        # The reference's kept text first, a state never read; then the
        # whole state to cut, whose kept part is then found read.
        whole = {"model": "jev-latest", "state": e["state"], "questions": e["request"]["questions"]}
        status_w, w, kept_s = timed(port, whole)
        status, v, cut_s = timed(port, body)
        got = v.get("x_truncated", {})
        agreed["reports"] += all(got.get(k) == e["report"][k] for k in ("kept_tokens", "of_tokens", "limit"))
        agreed["answers"] += (status, status_w) == (200, 200) and v["answers"] == w["answers"] \
            and v["usage"] == w["usage"]
        seconds.append({"of_tokens": e["report"]["of_tokens"], "kept": kept_s, "cut": cut_s})
    return agreed, seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=200)
    ap.add_argument("--limit", type=int, default=512)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    t0 = time.perf_counter()
    entries = cases(a.states, a.limit, a.seed)
    reference_s = time.perf_counter() - t0
    flags = ["--over-limit-tokens", str(a.limit)]
    mlx, mlx_port = common.start_decisio(extra=flags)
    gw, gw_port = common.start_decisio(extra=["--backend", "vllm", "--upstream", f"http://127.0.0.1:{mlx_port}",
                                              *flags])
    try:
        results = {}
        for name, port in (("mlx", mlx_port), ("vllm-backend", gw_port)):
            agreed, seconds = run(port, entries)
            results[name] = {"agreed": agreed, "seconds": seconds}
    finally:
        for p in (gw, mlx):
            p.kill()
    cut = sum(1 for e in entries if e.get("state") is not None)
    refused = sum(1 for e in entries if "error" in e)
    whole = len(entries) - cut - refused
    out = common.run_dir("over-limit")
    record = {"states": len(entries), "limit": a.limit, "seed": a.seed, "cut": cut, "refused": refused,
              "whole": whole, "reference_seconds": reference_s, "machine": common.machine(),
              "backends": results}
    (out / "results.json").write_text(json.dumps(record, indent=1))
    lines = [f"# Over-long states cut as the reference decisio 0.35.0 cuts them ({len(entries)} states)", "",
             f"Command: `make bench-over-limit` (`scripts/bench/over_limit.py --states {a.states} "
             f"--limit {a.limit} --seed {a.seed}`), on {common.machine()['cpus']} CPUs.", "",
             f"{len(entries)} fresh System One requests on the fixture (states of "
             f"{a.limit // 2} to {a.limit * 3} words; 1 to 3 questions, choices of at most 26 options), "
             f"cut by the reference's own `SystemOne.truncated_request` at a ceiling of {a.limit} tokens "
             f"without padding: {cut} cut, {whole} kept whole, {refused} refused (questions alone over "
             "the ceiling). Each sent to decisio with `\"over_limit\": \"truncate\"` on a server started "
             f"with `--over-limit-tokens {a.limit}`, and the reference's kept text sent whole beside it.", "",
             "| backend | reports equal (kept, of, limit) | answers of the cut = answers of the reference's "
             "kept text, bit for bit | refusals equal (status and words) | kept whole | median s, cut "
             "request (its kept part read) | median s, kept text sent (read anew) |", "|---|---|---|---|---|---|---|"]
    bars = []
    for name, r in results.items():
        g = r["agreed"]
        ks = statistics.median(s["kept"] for s in r["seconds"])
        cs = statistics.median(s["cut"] for s in r["seconds"])
        lines.append(f"| {name} | {g['reports']} of {cut} | {g['answers']} of {cut} | "
                     f"{g['refusals']} of {refused} | {g['whole']} of {whole} | {cs:.3f} | {ks:.3f} |")
        bars.append({"name": name, "a": cs, "b": ks})
    lines += ["", "An answer equal bit for bit to the kept text's means decisio's prompt is the "
              "reference's cut, token for token (the state's tokens, `x_state.tokens` and "
              "`usage.input_tokens` with it). Of each pair, the reference's kept text is sent first, "
              "a state never read (the model reads it); the whole state is sent second, to be cut: "
              "its kept part is then found already read, so its time is what the cut itself costs "
              "(sending and tokenizing a state up to three times the ceiling, finding the cut, "
              "rendering the row without a state).", "",
              f"The reference computed its {len(entries)} cuts in {reference_s:.1f} s (its "
              "tokenizer in Python, with its question rendering).", "",
              "`seconds.png`: the median seconds of the two requests on each backend."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    common.paired_bars(bars, ["the cut alone", "the kept text read"], "seconds (median)",
                       "What a cut costs beside reading the kept state", out / "seconds.png")
    print("\n".join(lines))
    ok = all(r["agreed"]["reports"] == cut and r["agreed"]["answers"] == cut
             and r["agreed"]["refusals"] == refused for r in results.values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
