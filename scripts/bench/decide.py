"""Benchmark: decisions on a shared state, decisio against mlx_lm.server.

Usage: python scripts/bench/decide.py [--states 6]

On the fixture's dense copy (both servers on the same MLX CPU kernels, both
with OpenBLAS), for states of about 1,000 tokens built from MMLU:
  (a) one question on a new state,
  (b) one question not asked before, on that state seen before,
  (b') the question of (b) asked again (an identical prompt),
  (c) the time per question when 100 questions share one state.
decisio answers through POST /v1/decide (prefix cache on); mlx_lm.server
answers the same prompts through chat completions with max_tokens 1 and
top_logprobs 10, its prompt cache on: (a) a new state's prompt, (b) another
question on the state, (b') that prompt again, (c) 100 prompts sharing the
state, one request each. Every round of (c) uses 100 questions not asked
before, so that neither server recalls an answer.
Also records decisio's peak resident memory and prefix-cache bytes for
states of about 1k, 4k and 7.5k tokens (the fixture's context is 8,192).
Writes runs/<date>_decide/{summary.md,results.json,memory.json}.
"""

import argparse
import http.client
import json
import statistics
import time

from transformers import AutoTokenizer

import common
from first_token import dense_copy

CUE = "Answer with the letter of the correct option."
LETTERS = "ABCD"


def block(row):
    text = row["question"].strip()
    for k in "abcd":
        text += f"\n{k.upper()}. {str(row['answer_' + k]).strip()}"
    return text + "\n" + CUE


def states(tok, rows, n, target):
    """n states of about `target` tokens, each from distinct MMLU rows."""
    out, cursor = [], 0
    for _ in range(n):
        text = "Case file."
        while len(tok.encode(text)) < target:
            r = rows[cursor % len(rows)]
            cursor += 1
            text += "\n\n" + block(r) + "\nAnswer: " + r["correct_answer"]
        out.append(text)
    return out, cursor


def settle():
    """Waits before a timed request: on two cores, the other server's BLAS
    threads keep spinning for a moment after its own request, and would be
    timed as part of this one."""
    time.sleep(1.0)


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of 100 questions for (c)")
    args = ap.parse_args()
    model = dense_copy()
    tok = AutoTokenizer.from_pretrained(str(common.MODEL))
    rows = common.mmlu_rows()
    sts, cursor = states(tok, rows, args.states + 1, 1000)
    questions = rows[cursor: cursor + 2 + 100 * args.rounds]
    qa, qb = questions[0], questions[1]

    ours, op = common.start_decisio(model)
    theirs, tp = common.start_mlx_lm(model)
    q0 = {"text": questions[0]["question"], "options": [str(questions[0]["answer_" + k]) for k in "abcd"]}
    dq = lambda q: {"text": q["question"], "options": [str(q["answer_" + k]) for k in "abcd"]}
    chat = lambda s, q: {"model": str(model), "max_tokens": 1, "temperature": 0, "logprobs": True,
                         "top_logprobs": 10,
                         "messages": [{"role": "user", "content": s + "\n\n" + block(q)}]}
    res = {k: {"decisio": [], "mlx_lm": []} for k in ("a", "b", "b'", "c")}
    try:
        # Warm-up on a state not measured.
        common.post(op, "/v1/decide", {"state": sts[0], "questions": [q0]})
        common.post(tp, "/v1/chat/completions", chat(sts[0], questions[0]))
        for s in sts[1:]:
            for case, q, cached in (("a", qa, False), ("b", qb, True), ("b'", qb, True)):
                settle()
                t, r = common.post(op, "/v1/decide", {"state": s, "questions": [dq(q)]})
                assert r["state"]["cached"] is cached
                res[case]["decisio"].append(t)
                settle()
                t, _ = common.post(tp, "/v1/chat/completions", chat(s, q))
                res[case]["mlx_lm"].append(t)
        # (c): 100 new questions per round on the last state (seen before by both).
        s = sts[-1]
        for k in range(args.rounds):
            batch = questions[2 + 100 * k: 102 + 100 * k]
            settle()
            t, r = common.post(op, "/v1/decide", {"state": s, "questions": [dq(q) for q in batch]})
            assert r["usage"]["cached_tokens"] == r["state"]["tokens"], "no answer may be recalled"
            res["c"]["decisio"].append(t / len(batch))
            settle()
            t0 = time.perf_counter()
            for q in batch:
                common.post(tp, "/v1/chat/completions", chat(s, q))
            res["c"]["mlx_lm"].append((time.perf_counter() - t0) / len(batch))
    finally:
        theirs.terminate()

    # Memory against state length, on decisio alone.
    memory = []
    try:
        # The fixture's context is 8,192 tokens: the longest state leaves room
        # for a question.
        for target in (1000, 4000, 7500):
            (s,), _ = states(tok, rows[cursor + 100 + target // 10:], 1, target)
            before = metric(op, "decisio_prefix_cache_bytes")
            _, r = common.post(op, "/v1/decide", {"state": s, "questions": [dq(qa)]})
            memory.append({"state_tokens": r["state"]["tokens"],
                           "prefix_cache_entry_bytes": metric(op, "decisio_prefix_cache_bytes") - before,
                           "peak_rss_bytes": peak_rss(ours.pid)})
    finally:
        ours.terminate()

    med = lambda k, who: statistics.median(res[k][who])
    summary = {k: {"decisio_ms": med(k, "decisio") * 1e3, "mlx_lm_ms": med(k, "mlx_lm") * 1e3,
                   "ratio": med(k, "decisio") / med(k, "mlx_lm")} for k in res}
    ratios = {"b/a": med("b", "decisio") / med("a", "decisio"),
              "c/b": med("c", "decisio") / med("b", "decisio")}
    out = common.run_dir("decide")
    (out / "results.json").write_text(json.dumps(
        {"medians": summary, "ratios": ratios, "samples": res, "machine": common.machine(),
         "model": "SmolLM2-135M-Instruct, dense copy (mlx_lm convert --dequantize)",
         "command": "make bench"}, indent=2))
    (out / "memory.json").write_text(json.dumps(memory, indent=2))
    rows_md = "\n".join(
        f"| ({k}) | {summary[k]['decisio_ms']:.1f} | {summary[k]['mlx_lm_ms']:.1f} | **{summary[k]['ratio']:.3f}** |"
        for k in ("a", "b", "b'", "c"))
    mem_md = "\n".join(f"| {m['state_tokens']} | {m['prefix_cache_entry_bytes']/2**20:.1f} | {m['peak_rss_bytes']/2**20:.0f} |" for m in memory)
    (out / "summary.md").write_text(f"""# Decisions on a shared state

decisio (`POST /v1/decide`, prefix cache on) against `mlx_lm.server` 0.32.2
(chat completions, `max_tokens` 1, `top_logprobs` 10, its prompt cache on),
both at once on 127.0.0.1, both serving the fixture's dense copy on MLX's
CPU build 0.32.2 with OpenBLAS. States of about 1,000 tokens from MMLU;
{len(res['a']['decisio'])} states for (a) and (b), {args.rounds} rounds of 100 questions for (c).
Times: the client's wall time, medians; each timed request starts after a
one-second pause, so that the other server's idle BLAS threads have stopped
spinning on the two cores.

| case | decisio (ms) | mlx_lm.server (ms) | ratio |
|---|---|---|---|
{rows_md}

(a) one question on a new state; (b) one question not asked before, on that
state seen before; (b') the question of (b) again, an identical prompt
(decisio recalls the answer it keeps with the cached state; mlx_lm.server's
prompt cache runs the last token); (c) per question when 100 questions not
asked before share one state (decisio: one request of 100 questions;
mlx_lm.server: 100 requests).

decisio: **b/a = {ratios['b/a']:.3f}** (target at most 0.2), **c/b = {ratios['c/b']:.3f}**
(target at most 1.0). Targets against mlx_lm.server: at most 0.5x on (b) and
(c), at most 1.0x on (a).

## Memory (decisio, memory.json)

| state tokens | prefix-cache entry (MiB) | peak resident memory (MiB) |
|---|---|---|
{mem_md}

Machine: {common.machine()['platform']}, {common.machine()['cpus']} CPUs. Command: `make bench`.
""")
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
