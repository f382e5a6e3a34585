"""Benchmark: the host kernels (attention's softmax, the SiLU gate) against
MLX's own CPU ops.

Usage: python scripts/bench/host_kernels.py [--questions 8]

1. In a child with OpenBLAS preloaded, MLX 0.32.2's CPU ops for one layer of
   SmolLM2-135M when a 120-token question reads a 1,255-token state: `exp`
   and a multiply over the 9 x 120 x 1,255 attention scores, the fused
   attention, the two products around its softmax, and SiLU over the
   120 x 1,536 gate.
2. decisio on the fixture's dense copy with `--host-kernels off` and `on`,
   side by side: a new ~1,000-token state, then questions not asked before
   on it (one request each); median times.
Writes runs/<date>_host-kernels/{summary.md,results.json}.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import common
from common import OPENBLAS

L, T, HEADS, KV_HEADS, HEAD_DIM, FFN = 120, 1255, 9, 3, 64, 1536


def measure_ops():
    import mlx.core as mx
    mx.random.seed(0)
    out = {}

    def t(name, f, n=20):
        out[name] = common.median_ms(f, n)

    scores = mx.random.normal((HEADS, L, T))
    q = mx.random.normal((1, HEADS, L, HEAD_DIM))
    k = mx.random.normal((1, KV_HEADS, T, HEAD_DIM))
    v = mx.random.normal((1, KV_HEADS, T, HEAD_DIM))
    gate = mx.random.normal((1, L, FFN))
    qg = q.reshape(1, KV_HEADS, HEADS // KV_HEADS * L, HEAD_DIM)
    probs = mx.softmax(scores, axis=-1).reshape(1, KV_HEADS, HEADS // KV_HEADS * L, T)
    mx.eval(scores, q, k, v, gate, qg, probs)
    t("exp over the scores", lambda: mx.exp(scores))
    t("multiply over the scores", lambda: scores * scores)
    t("softmax over the scores", lambda: mx.softmax(scores, axis=-1, precise=True))
    t("fused attention (causal)", lambda: mx.fast.scaled_dot_product_attention(
        q, k, v, scale=HEAD_DIM ** -0.5, mask="causal"))
    t("product q k^T", lambda: qg @ k.swapaxes(-1, -2))
    t("product p v", lambda: probs @ v)
    t("SiLU over the gate", lambda: gate * mx.sigmoid(gate))
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(measure_ops()))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=8)
    args = ap.parse_args()
    env = dict(os.environ)
    if os.path.exists(OPENBLAS):
        env["LD_PRELOAD"] = OPENBLAS
    ops = json.loads(subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                                    capture_output=True, text=True).stdout)

    from transformers import AutoTokenizer
    from decide import states
    from first_token import dense_copy
    model = dense_copy()
    tok = AutoTokenizer.from_pretrained(str(common.MODEL))
    rows = common.mmlu_rows()
    sts, cursor = states(tok, rows, 1, 1000)
    questions = rows[cursor: cursor + 1 + args.questions]
    dq = lambda q: {"text": q["question"], "options": [str(q["answer_" + k]) for k in "abcd"]}

    servers = {mode: common.start_decisio(model, ["--host-kernels", mode]) for mode in ("off", "on")}
    res = {mode: {"new_state_ms": None, "question_ms": []} for mode in servers}
    try:
        for mode, (_, port) in servers.items():
            t, r = common.post(port, "/v1/decide", {"state": sts[0], "questions": [dq(questions[0])]})
            assert r["state"]["cached"] is False
            res[mode]["new_state_ms"] = t * 1e3
        # Alternate the two servers question by question.
        for q in questions[1:]:
            for mode, (_, port) in servers.items():
                t, r = common.post(port, "/v1/decide", {"state": sts[0], "questions": [dq(q)]})
                assert r["usage"]["cached_tokens"] == r["state"]["tokens"]
                res[mode]["question_ms"].append(t * 1e3)
    finally:
        for proc, _ in servers.values():
            proc.terminate()

    med = {mode: statistics.median(res[mode]["question_ms"]) for mode in res}
    out = common.run_dir("host-kernels")
    (out / "results.json").write_text(json.dumps(
        {"mlx_ops_ms": ops, "decisio": res, "question_median_ms": med,
         "machine": common.machine(), "command": "python scripts/bench/host_kernels.py"}, indent=2))
    ops_md = "\n".join(f"| {name} | {ms:.2f} |" for name, ms in ops.items())
    (out / "summary.md").write_text(f"""# Host kernels against MLX's CPU ops

## MLX 0.32.2 CPU ops for one layer of a question on a state

SmolLM2-135M shapes: a {L}-token question reading a {T}-token state
({HEADS} query heads, {KV_HEADS} key-value heads, head size {HEAD_DIM}; gate
{L} x {FFN}). Median milliseconds, OpenBLAS preloaded.

| op | ms |
|---|---|
{ops_md}

`exp` costs far more than a multiply of the same size, and the fused
attention costs about the softmax plus the two products: the softmax, not
the products, is most of it.

## decisio, `--host-kernels off` against `on`

Fixture's dense copy, one ~{r['state']['tokens']}-token MMLU state, then
{args.questions} questions not asked before on it, one request each, the
two servers alternating.

| | off (MLX ops) | on (host kernels) | ratio on/off |
|---|---|---|---|
| new state + first question (ms) | {res['off']['new_state_ms']:.0f} | {res['on']['new_state_ms']:.0f} | {res['on']['new_state_ms'] / res['off']['new_state_ms']:.3f} |
| question on the cached state, median (ms) | {med['off']:.0f} | {med['on']:.0f} | **{med['on'] / med['off']:.3f}** |

Machine: {common.machine()['platform']}, {common.machine()['cpus']} CPUs.
Command: `python scripts/bench/host_kernels.py`.
""")
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
