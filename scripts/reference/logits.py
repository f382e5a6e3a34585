"""Reference logits from mlx-lm for the numerical conformance test.

Usage: python scripts/reference/logits.py MODEL_DIR OUT_DIR

For 24 prompts of 5 to 500 tokens (MMLU questions through the model's chat
template, cut to length), writes OUT_DIR/logits.safetensors holding, for each
prompt i, `ids_i` (int32 token ids) and `logits_i` (float32 logits of the last
position) as mlx-lm 0.32.2 computes them on MLX's CPU build. The Rust test
(tests/conformance.rs) runs the same ids through decisio's engine.
"""

import json
import os
import sys

import mlx.core as mx
from mlx_lm import load

LENGTHS = [5, 7, 9, 12, 16, 20, 27, 35, 48, 64, 80, 100, 128, 160, 200, 240,
           280, 320, 360, 400, 430, 460, 480, 500]


def mmlu_rows(path, n):
    rows = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("correct_answer") in ("A", "B", "C", "D"):
                rows.append(row)
            if len(rows) >= n:
                break
    return rows


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    assets = os.environ.get("DECISIO_ASSETS", os.path.expanduser("~/.cache/decisio/assets"))
    model, tokenizer = load(model_dir)
    rows = mmlu_rows(os.path.join(assets, "mmlu.jsonl"), 400)
    out = {}
    cursor = 0
    for i, length in enumerate(LENGTHS):
        ids = []
        while len(ids) < length:
            row = rows[cursor % len(rows)]
            cursor += 1
            text = row["question"] + "\n" + "\n".join(
                f"{k}. {row['answer_' + k.lower()]}" for k in "ABCD")
            messages = [{"role": "user", "content": text}]
            ids += tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = ids[-length:]
        tokens = mx.array(ids, dtype=mx.int32)
        logits = model(tokens[None])[0, -1].astype(mx.float32)
        out[f"ids_{i}"] = tokens
        out[f"logits_{i}"] = logits
    mx.eval(out)
    os.makedirs(out_dir, exist_ok=True)
    mx.save_safetensors(os.path.join(out_dir, "logits.safetensors"), out,
                        metadata={"prompts": str(len(LENGTHS)), "reference": "mlx-lm 0.32.2"})
    print(f"[reference] {len(LENGTHS)} prompts of {LENGTHS[0]} to {LENGTHS[-1]} tokens -> {out_dir}/logits.safetensors")


if __name__ == "__main__":
    main()
