"""Benchmark: decisions on a shared state, decisio against mlx_lm.server and
llama.cpp's server.

Usage: python scripts/bench/decide.py [--states 6]

For states of about 1,000 tokens built from MMLU:
  (a) one question on a new state,
  (b) one question not asked before, on that state seen before,
  (b') the question of (b) asked again (an identical prompt),
  (c) the time per question when 100 questions share one state.
decisio answers through POST /v1/decide (prefix cache on), on the fixture's
dense copy. The peers answer the same prompts through chat completions with
max_tokens 1 and top_logprobs 10, their prompt caches on: (a) a new state's
prompt, (b) another question on the state, (b') that prompt again, (c) 100
prompts sharing the state, one request each. The peers: mlx_lm.server on the
same dense copy (the same MLX CPU kernels, both with OpenBLAS), and
llama.cpp's server (scripts/bench/llama_server.sh) on the fixture's GGUF at
float32 and as shipped (Q4_1). Every round of (c) uses 100 questions not
asked before, so that no server recalls an answer.
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

LETTERS = "ABCD"


def states(tok, rows, n, target):
    """n states of about `target` tokens, each from distinct MMLU rows."""
    out, cursor = [], 0
    for _ in range(n):
        text = "Case file."
        while len(tok.encode(text)) < target:
            r = rows[cursor % len(rows)]
            cursor += 1
            text += "\n\n" + common.mmlu_block(r) + "\nAnswer: " + r["correct_answer"]
        out.append(text)
    return out, cursor


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


def letters_seen(body):
    """How many of the option letters the peer's first token's top
    log-probabilities name (an answer read through its API)."""
    top = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return len({t["token"].strip() for t in top} & set(LETTERS))


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
    qa = questions[0]
    llama_dir, llama_version = common.llama_cpp()
    shipped = common.ASSETS / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

    ours, op = common.start_decisio(model)
    # The peers: (name, process, port), each answering chat completions.
    peers = []
    try:
        peers.append(("mlx_lm.server", *common.start_mlx_lm(model)))
        peers.append(("llama.cpp F32", *common.start_llama_server(
            llama_dir / "smollm2-135m-instruct-f32.gguf")))
        peers.append(("llama.cpp Q4_1", *common.start_llama_server(shipped)))
        res, letters = run_cases(args, op, peers, model, sts, questions)
    finally:
        for _, proc, _ in peers:
            proc.terminate()

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
    write(args, res, letters, memory, [name for name, _, _ in peers], llama_version)


def dq(q):
    return {"text": q["question"], "options": [str(q["answer_" + k]) for k in "abcd"]}


def run_cases(args, op, peers, model, sts, questions):
    """Times (a), (b), (b') on each state and (c) on the last, decisio and
    every peer in turn; returns the times and, per peer, how many option
    letters its answers' top log-probabilities named."""
    qa, qb = questions[0], questions[1]
    chat = lambda s, q: {"model": str(model), "max_tokens": 1, "temperature": 0, "logprobs": True,
                         "top_logprobs": 10,
                         "messages": [{"role": "user", "content": s + "\n\n" + common.mmlu_block(q)}]}
    who = ["decisio"] + [name for name, _, _ in peers]
    res = {k: {w: [] for w in who} for k in ("a", "b", "b'", "c")}
    letters = {name: [] for name, _, _ in peers}
    # Warm-up on a state not measured.
    common.post(op, "/v1/decide", {"state": sts[0], "questions": [dq(qa)]})
    for _, _, port in peers:
        common.post(port, "/v1/chat/completions", chat(sts[0], qa))
    for s in sts[1:]:
        for case, q, cached in (("a", qa, False), ("b", qb, True), ("b'", qb, True)):
            common.settle()
            t, r = common.post(op, "/v1/decide", {"state": s, "questions": [dq(q)]})
            assert r["state"]["cached"] is cached
            res[case]["decisio"].append(t)
            for name, _, port in peers:
                common.settle()
                t, body = common.post(port, "/v1/chat/completions", chat(s, q))
                res[case][name].append(t)
                letters[name].append(letters_seen(body))
    # (c): 100 new questions per round on the last state (seen before by all).
    s = sts[-1]
    for k in range(args.rounds):
        batch = questions[2 + 100 * k: 102 + 100 * k]
        common.settle()
        t, r = common.post(op, "/v1/decide", {"state": s, "questions": [dq(q) for q in batch]})
        assert r["usage"]["cached_tokens"] == r["state"]["tokens"], "no answer may be recalled"
        res["c"]["decisio"].append(t / len(batch))
        for name, _, port in peers:
            common.settle()
            t0 = time.perf_counter()
            for q in batch:
                _, body = common.post(port, "/v1/chat/completions", chat(s, q))
                letters[name].append(letters_seen(body))
            res["c"][name].append((time.perf_counter() - t0) / len(batch))
    return res, letters


def write(args, res, letters, memory, peers, llama_version):
    med = lambda k, who: statistics.median(res[k][who])
    summary = {k: {"decisio_ms": med(k, "decisio") * 1e3,
                   "peers_ms": {p: med(k, p) * 1e3 for p in peers},
                   "ratios": {p: med(k, "decisio") / med(k, p) for p in peers}} for k in res}
    ratios = {"b/a": med("b", "decisio") / med("a", "decisio"),
              "c/b": med("c", "decisio") / med("b", "decisio")}
    seen = {p: {"answers": len(v), "mean_letters_in_top10": statistics.mean(v)}
            for p, v in letters.items()}
    out = common.run_dir("decide")
    (out / "results.json").write_text(json.dumps(
        {"medians": summary, "ratios": ratios, "samples": res, "letters_in_top10": seen,
         "machine": common.machine(), "llama_cpp_python_sdist": llama_version,
         "model": "SmolLM2-135M-Instruct: decisio and mlx_lm.server on the dense copy "
                  "(mlx_lm convert --dequantize, float32); llama.cpp on the shipped Q4_1 GGUF "
                  "and on it requantized to F32 (llama-quantize --allow-requantize)",
         "command": "make bench"}, indent=2))
    (out / "memory.json").write_text(json.dumps(memory, indent=2))
    head = "| case | decisio (ms) | " + " | ".join(f"{p} (ms)" for p in peers) + " | " + \
        " | ".join(f"ratio to {p}" for p in peers) + " |"
    rule = "|---" * (2 + 2 * len(peers)) + "|"
    rows_md = "\n".join(
        f"| ({k}) | {summary[k]['decisio_ms']:.1f} | "
        + " | ".join(f"{summary[k]['peers_ms'][p]:.1f}" for p in peers) + " | "
        + " | ".join(f"**{summary[k]['ratios'][p]:.3f}**" for p in peers) + " |"
        for k in ("a", "b", "b'", "c"))
    seen_md = "; ".join(f"{p}: {v['mean_letters_in_top10']:.2f} of 4 over {v['answers']} answers"
                        for p, v in seen.items())
    mem_md = "\n".join(f"| {m['state_tokens']} | {m['prefix_cache_entry_bytes']/2**20:.1f} | {m['peak_rss_bytes']/2**20:.0f} |" for m in memory)
    (out / "summary.md").write_text(f"""# Decisions on a shared state

decisio (`POST /v1/decide`, prefix cache on) against two peers, all at once
on 127.0.0.1, each answering chat completions with `max_tokens` 1,
`top_logprobs` 10 and its prompt cache on:
- `mlx_lm.server` 0.32.2 on the fixture's dense copy (float32, as decisio),
  both on MLX's CPU build 0.32.2 with OpenBLAS;
- llama.cpp's server (built from the `llama-cpp-python` {llama_version} source
  distribution, `scripts/bench/llama_server.sh`; one slot, one thread per
  core) on the fixture's GGUF twice: **F32**, the shipped file's blocks
  dequantized by `llama-quantize` (the values decisio's dense copy holds, at
  its precision), and **Q4_1**, the file as shipped.

States of about 1,000 tokens from MMLU; {len(res['a']['decisio'])} states for (a) and (b),
{args.rounds} rounds of 100 questions for (c). Times: the client's wall time,
medians; each timed request starts after a one-second pause, so that another
server's idle threads have stopped spinning on the cores.

{head}
{rule}
{rows_md}

(a) one question on a new state; (b) one question not asked before, on that
state seen before; (b') the question of (b) again, an identical prompt
(decisio recalls the answer it keeps with the cached state; the peers' prompt
caches run the last token); (c) per question when 100 questions not asked
before share one state (decisio: one request of 100 questions; each peer: 100
requests).

Option letters among each peer's top 10 first-token log-probabilities (the
answer read through its API): {seen_md}.

decisio: **b/a = {ratios['b/a']:.3f}** (target at most 0.2), **c/b = {ratios['c/b']:.3f}**
(target at most 1.0). Targets against mlx_lm.server: at most 0.5x on (b) and
(c), at most 1.0x on (a). Against llama.cpp: reported, no target.

## Memory (decisio, memory.json)

| state tokens | prefix-cache entry (MiB) | peak resident memory (MiB) |
|---|---|---|
{mem_md}

Machine: {common.machine()['platform']}, {common.machine()['cpus']} CPUs. Command: `make bench`.
""")
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
