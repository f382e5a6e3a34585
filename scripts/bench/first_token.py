"""Benchmark: one-token chat completion with top_logprobs 10 on a 1,000-token
prompt, decisio against mlx_lm.server 0.32.2 on the same MLX folder.

Usage: python scripts/bench/first_token.py [--prompts 12]

Both servers run on loopback at once; every prompt (a distinct ~1,000-token
conversation of MMLU questions, so no server can reuse an earlier prompt) is
sent to decisio and then to mlx_lm.server, alternating A B A B. The time is
the client's wall time of the whole HTTP request. Writes
runs/<date>_first-token/summary.md and results.json.
"""

import argparse
import json
import statistics

from transformers import AutoTokenizer

import common

TARGET_TOKENS = 1000


def build_prompts(n):
    tok = AutoTokenizer.from_pretrained(str(common.MODEL))
    rows = common.mmlu_rows()
    prompts, cursor = [], 0
    for _ in range(n):
        parts = []
        while True:
            parts.append(common.question_text(rows[cursor % len(rows)]))
            cursor += 1
            text = "\n\n".join(parts) + "\n\nWhich subject are these questions from? Answer in one word."
            messages = [{"role": "user", "content": text}]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            if len(ids) >= TARGET_TOKENS:
                break
        prompts.append((messages, len(ids)))
    return prompts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=12)
    args = ap.parse_args()
    prompts = build_prompts(args.prompts + 2)
    ours, our_port = common.start_decisio()
    theirs, their_port = common.start_mlx_lm()
    try:
        body = lambda m: {"model": "model", "messages": m, "max_tokens": 1, "temperature": 0,
                          "logprobs": True, "top_logprobs": 10}
        # Warm-up on two prompts not measured.
        for messages, _ in prompts[:2]:
            common.post(our_port, "/v1/chat/completions", body(messages))
            common.post(their_port, "/v1/chat/completions", body(messages))
        a, b, agree, lengths = [], [], 0, []
        for messages, n in prompts[2:]:
            ta, ra = common.post(our_port, "/v1/chat/completions", body(messages))
            tb, rb = common.post(their_port, "/v1/chat/completions", body(messages))
            a.append(ta)
            b.append(tb)
            lengths.append(n)
            agree += ra["choices"][0]["message"]["content"] == rb["choices"][0]["message"]["content"]
    finally:
        ours.terminate()
        theirs.terminate()
    ratio = statistics.median(a) / statistics.median(b)
    results = {
        "benchmark": "one-token chat completion, top_logprobs 10, ~1,000-token prompt",
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF converted to MLX, 4-bit/8-bit, group 32)",
        "backend": "MLX CPU (mlx-cpu 0.32.2)",
        "prompt_tokens": common.summarize(lengths),
        "decisio_seconds": common.summarize(a),
        "mlx_lm_server_seconds": common.summarize(b),
        "ratio_median": ratio,
        "same_first_token": f"{agree}/{len(a)}",
        "samples": {"decisio": a, "mlx_lm_server": b},
        "machine": common.machine(),
        "command": "make bench (python scripts/bench/first_token.py)",
    }
    out = common.run_dir("first-token")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "summary.md").write_text(f"""# One-token chat completion on a 1,000-token prompt

decisio against `mlx_lm.server` 0.32.2, both serving the same MLX folder
(SmolLM2-135M-Instruct, MLX CPU build 0.32.2), both running at once on
127.0.0.1. Each of {len(a)} distinct prompts (median {statistics.median(lengths):.0f} tokens)
went to decisio, then to mlx_lm.server (A B A B), after 2 warm-up prompts.
Request: `max_tokens` 1, `temperature` 0, `logprobs` true, `top_logprobs` 10.
Time: the client's wall time of the whole HTTP request.

| server | median (ms) | min (ms) | max (ms) |
|---|---|---|---|
| decisio | {statistics.median(a)*1e3:.1f} | {min(a)*1e3:.1f} | {max(a)*1e3:.1f} |
| mlx_lm.server | {statistics.median(b)*1e3:.1f} | {min(b)*1e3:.1f} | {max(b)*1e3:.1f} |

Ratio of medians (decisio / mlx_lm.server): **{ratio:.3f}** (target at most 1.0).
The two servers chose the same token on {agree} of {len(a)} prompts.

Machine: {common.machine()['platform']}, {common.machine()['cpus']} CPUs.
Command: `make bench`.
""")
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
