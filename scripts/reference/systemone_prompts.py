"""System One prompts as the reference decisio 0.35.0 builds them.

Usage: python scripts/reference/systemone_prompts.py OUT_DIR NAME=TOKENIZER_DIR ... [--count N] [--seed S]

Generates N System One requests (seeded: every question type, states as
strings, objects and arrays, instructions and descriptions as text,
objects, arrays and null, index keys, snake_case labels, Unicode, 2 to 255
options, 2 to 10 levels, yes/no criteria absent, one- and two-sided), and
asks the reference's own code how it would put each question to the model:
`decisio.serve.systemone` validates the request and maps each question
(`SystemOne.engine_question`, with the served defaults: index keys hidden,
snake_case labels shown with spaces, options shown by their descriptions,
yes/no as `letters-keys`), and `decisio.serve.vllm_engine.LettersEngine`
builds the rows (`_rows`: the state's prefix, each question's own tokens, the
label token ids) and counts the request's input tokens (`counted_tokens`).
Each tokenizer's prompts are built in two formats, without padding
(`--pad-to none`, MLX's default):

- the one the reference gives a model of the Qwen base and the fixture
  (`decisio.families.QWEN`: the spaced tail, `Answer:` prefilled, one token
  per label, no system turn, the plain layout, yes/no as `letters-keys`);
- the Gemma bases' (`decisio.families.GEMMA4_31B`, as `GEMMA4`: the spaced
  tail, the system turn of `decisio.readout.system_prompt`, the label read
  at the template's own answer slot, every single-token form of a label
  read and summed, the header layout with every question listed, yes/no as
  `letters`).

Writes OUT_DIR/systemone/NAME.json (the Qwen format) and
OUT_DIR/systemone/gemma/NAME.json (the Gemma format) for each tokenizer
folder (a `tokenizer.json` and a `tokenizer_config.json` with the chat
template): a list of {"request": {...}, "questions": {id: {"ids": [...],
"labels": [...], "prefix": n, "keys": [...], "kind": "noul|choice|score"}},
"input_tokens": n}; a label is one token id, or under summed forms the list
of its forms' ids. The Rust test `tests/systemone.rs` builds the same
prompts and compares them id for id.

Needs the `decisio` 0.35.0 wheel's code on the path (installed without its
dependencies by scripts/setup.sh), numpy, pydantic and transformers.
"""

import argparse
import json
import random
import string
import sys
import types
from pathlib import Path

from transformers import AutoTokenizer

from decisio.families import GEMMA4_31B, QWEN
from decisio.readout.letters import PromptFormat
from decisio.serve import systemone as so
from decisio.serve import vllm_engine as ve

WORDS = ("refund charge card account delivery parcel invoice password login outage bug "
         "price plan upgrade cancel address order late broken missing double twice urgent "
         "angry calm polite rude question complaint request").split()
UNICODE = ["환불 요청", "배송 문의", "🙂 기타", "Überweisung", "façade", "日本語のテキスト", "emoji 🎯"]


def phrase(rng, n=None):
    n = n or rng.randint(2, 8)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def text_value(rng, allow_null=False):
    """Instructions or a description: text mostly, sometimes structured."""
    r = rng.random()
    if allow_null and r < 0.15:
        return None
    if r < 0.7:
        return phrase(rng).capitalize() + rng.choice(["?", ".", "", "!"])
    if r < 0.8:
        return rng.choice(UNICODE)
    if r < 0.9:
        return {"task": phrase(rng), "include": [phrase(rng, 2), phrase(rng, 2)]}
    return [phrase(rng), phrase(rng, 3)]


def state(rng):
    r = rng.random()
    if r < 0.6:
        return ". ".join(phrase(rng, rng.randint(4, 14)).capitalize() for _ in range(rng.randint(1, 6))) + "."
    if r < 0.8:
        return {"subject": phrase(rng), "body": phrase(rng, 20), "_id": rng.randint(1, 99),
                "customer": {"plan": rng.choice(["pro", "free"]), "tickets": rng.randint(0, 9)}}
    return [phrase(rng, 6) + "." for _ in range(rng.randint(1, 4))]


def choice_criteria(rng):
    n = rng.choice([2, 2, 3, 4, 5, 8, 26, 27, 40, 64, 128, 255])
    style = rng.choice(["named", "null", "index", "snake", "unicode", "mixed", "same"])
    if style == "index":
        stem = rng.choice(["option_", "opt", "", "label-"])
        start = rng.choice([0, 1])
        return {f"{stem}{i + start}": phrase(rng, 2) for i in range(n)}
    if style == "snake":
        return {f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{i}" if i % 7 == 6 else
                f"{rng.choice(WORDS)}_{rng.choice(WORDS)}{'_x' * (i % 3)}" + "abcdefghijklmnopqrstuvwxyz"[i % 26] * (i // 26 + 1): None
                for i in range(n)}
    if style == "unicode":
        n = min(n, len(UNICODE))
        return {UNICODE[i]: (None if i % 2 else phrase(rng, 3)) for i in range(max(n, 2))}
    if style == "same":
        return {f"Queue {i:03d}": "the same queue" for i in range(n)}
    out = {}
    for i in range(n):
        key = f"{phrase(rng, rng.randint(1, 2)).title()} {i}"
        out[key] = None if style == "null" else text_value(rng, allow_null=(style == "mixed"))
    return out


def question(rng, kind):
    q = {"type": kind}
    if rng.random() < 0.85:
        q["instructions"] = text_value(rng)
    if kind == "noul":
        r = rng.random()
        if r < 0.25:
            pass
        elif r < 0.35:
            q["criteria"] = None
        elif r < 0.6:
            q["criteria"] = {"true": text_value(rng), "false": text_value(rng)}
        elif r < 0.8:
            q["criteria"] = {"true": text_value(rng)}
        else:
            q["criteria"] = {"false": text_value(rng)}
    elif kind == "choice":
        q["criteria"] = choice_criteria(rng)
    else:
        q["criteria"] = [text_value(rng) for _ in range(rng.randint(2, 10))]
    return q


def requests(count, seed):
    rng = random.Random(seed)
    kinds = ["noul", "choice", "score"]
    for i in range(count):
        qs = {}
        for j in range(rng.randint(1, 4)):
            kind = kinds[(i + j) % 3]
            qid = rng.choice([f"q{j}", f"{kind}-{j}", f"질문 {j}", f"🎯{j}", f"id.{j}"])
            qs[qid] = question(rng, kind)
        yield {"model": "jev-latest", "state": state(rng), "questions": qs}


# the formats written: the file's folder under systemone/, and the family whose prompt format it is
FORMATS = (("", QWEN), ("gemma/", GEMMA4_31B))


def reference_engine(tok, family):
    """A LettersEngine with a family's prompt format, as far as `_rows` reads it (the layout the family serves when
    nothing holds it at plain: header for the Gemma bases, plain for the Qwen one)."""
    eng = object.__new__(ve.LettersEngine)
    eng.tok = tok
    eng.fmt = PromptFormat(tail=family.prompt_tail, slot=family.answer_slot, variants=family.label_variants,
                           system_prompt=family.system_prompt, layout=family.layout)
    return eng


def served(noul_rendering):
    """What SystemOne.engine_question reads of a server: its served defaults."""
    return types.SimpleNamespace(noul_rendering=noul_rendering, hide_index_keys=True,
                                 desnake_labels=True, describe_options=True)


def prompts(folder, family, count, seed):
    """The reference's rows of `count` seeded requests on one tokenizer, in a family's prompt format."""
    tok = AutoTokenizer.from_pretrained(folder)
    eng = reference_engine(tok, family)
    server = served(family.noul_rendering)
    out = []
    for body in requests(count, seed):
        req = so.SystemOneRequest.model_validate(body)
        names = list(req.questions)
        asked = [so.SystemOne.engine_question(server, req.questions[n]) for n in names]
        qs = [eq for eq, _, _ in asked]
        rows, n, _ = ve.LettersEngine._rows(eng, req.state, qs, with_plan=False)
        counted = ve.counted_tokens(tok, eng.fmt, req.state, qs)
        entry = {"request": body, "questions": {}, "input_tokens": counted["total"]}
        for name, (eq, keys, swapped), (ids, labels) in zip(names, asked, rows):
            labels = [list(g) if isinstance(g, tuple) else g for g in labels]
            entry["questions"][name] = {"ids": ids, "labels": labels, "prefix": n, "keys": keys,
                                        "kind": req.questions[name].type, "swapped": swapped}
        out.append(entry)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("tokenizers", nargs="+", help="NAME=FOLDER")
    ap.add_argument("--count", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out) / "systemone"
    out.mkdir(parents=True, exist_ok=True)
    for spec in args.tokenizers:
        name, folder = spec.split("=", 1)
        for sub, family in FORMATS:
            rows = prompts(folder, family, args.count, args.seed)
            (out / sub).mkdir(parents=True, exist_ok=True)
            (out / sub / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False))
            kinds = [q["kind"] for e in rows for q in e["questions"].values()]
            print(f"[systemone] {sub}{name} ({family.key}): {len(rows)} requests, "
                  + ", ".join(f"{k} {kinds.count(k)}" for k in ("noul", "choice", "score")), file=sys.stderr)


if __name__ == "__main__":
    main()
