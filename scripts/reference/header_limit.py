"""The header limit, as the reference decisio 0.35.0 plans it.

Usage: python scripts/reference/header_limit.py OUT_DIR NAME=TOKENIZER_DIR ... [--count N] [--seed S]

Generates N System One requests of many questions with long instructions
(3 to 14 questions, each instruction 4 to 60 words) on states of a few to a
few hundred words, each with a prompt ceiling, a padding block and a
`--header-limit` setting (auto, a cap of tokens, or off), and asks the
reference's own code what the header layout does with them:
`decisio.serve.vllm_engine.LettersEngine.header_plan` on an engine of the
Gemma bases' prompt format (the header layout), with the questions mapped
by `SystemOne.engine_question`; where a row cannot be answered,
`decisio.serve.header_limit.refusal` gives the refusal's words.

Writes OUT_DIR/header_limit/NAME.json for each tokenizer: a list of
{"request", "limit", "reserve", "mode", "cap", "plan", "input_tokens"}, the
plan null where the request is not touched, else {"limited", "listed",
"of", "fits", "report", "refusal"}; `input_tokens` what the reference's
`usage.input_tokens` counts with the header as listed. With the fixture's tokenizer it also writes
OUT_DIR/header_limit/served/fixture.json: requests for the fixture served
with `--layout header` (the served defaults' format with the header
layout) at one ceiling and no padding. The Rust test
`tests/header_limit.rs` plans the same requests and compares them.

Needs the `decisio` 0.35.0 wheel's code on the path, pydantic and
transformers (as scripts/reference/systemone_prompts.py).
"""

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path

from transformers import AutoTokenizer

from decisio.families import GEMMA4_31B, QWEN
from decisio.serve import header_limit as hl
from decisio.serve import systemone as so
from decisio.serve import vllm_engine as ve

from systemone_prompts import WORDS, phrase, reference_engine, served


def question(rng, kind):
    words = rng.randint(4, 60)
    q = {"type": kind, "instructions": phrase(rng, words).capitalize() + "?"}
    if kind == "choice":
        q["criteria"] = {f"{rng.choice(WORDS).title()} {i}": None for i in range(rng.randint(2, 5))}
    elif kind == "score":
        q["criteria"] = [rng.choice(WORDS) for _ in range(rng.randint(2, 4))]
    return q


def requests(count, seed, limits, reserves, settings):
    rng = random.Random(seed)
    kinds = ["noul", "choice", "score"]
    for i in range(count):
        n = rng.randint(3, 14)
        qs = {f"q{j}": question(rng, kinds[(i + j) % 3]) for j in range(n)}
        state = ". ".join(phrase(rng, rng.randint(4, 14)).capitalize()
                          for _ in range(rng.randint(1, 25))) + "."
        body = {"model": "jev-latest", "state": state, "questions": qs}
        yield body, rng.choice(limits), rng.choice(reserves), rng.choice(settings)


def plan(tok, fmt, noul, body, limit, reserve, setting):
    """What the reference's header limit does with `body`: the entry written."""
    eng = reference_engine(tok, GEMMA4_31B)
    eng.fmt = fmt
    eng.over_limit_tokens = limit
    eng.prompt_limit = lambda: limit
    eng.pad_unit = reserve or None
    mode, cap = hl.parse(setting)
    eng.header_limit_setting = (mode, cap)
    server = served(noul)
    req = so.SystemOneRequest.model_validate(body)
    qs = [so.SystemOne.engine_question(server, req.questions[n])[0] for n in req.questions]
    hp = ve.LettersEngine.header_plan(eng, req.state, qs)
    lines = hp["listed"] if hp and hp["limited"] else None
    entry = {"request": body, "limit": limit, "reserve": reserve, "mode": mode, "cap": cap, "plan": None,
             "input_tokens": ve.counted_tokens(tok, fmt, req.state, qs, lines)["total"]}
    if hp is not None:
        entry["plan"] = {
            "limited": hp["limited"], "listed": hp["listed"], "of": hp["of"], "fits": hp["fits"],
            "report": hp["report"],
            "refusal": None if hp["fits"] else hl.refusal(hp["limit"], hp["pieces"], bool(hp.get("off"))),
        }
    return entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("tokenizers", nargs="+", help="NAME=FOLDER")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--served", type=int, default=512)
    ap.add_argument("--served-count", type=int, default=12)
    args = ap.parse_args()
    out = Path(args.out) / "header_limit"
    out.mkdir(parents=True, exist_ok=True)
    gemma = reference_engine(None, GEMMA4_31B).fmt
    for spec in args.tokenizers:
        name, folder = spec.split("=", 1)
        tok = AutoTokenizer.from_pretrained(folder)
        cases = requests(args.count, args.seed, [256, 384, 512, 768, 1024, 2048], [0, 0, 16],
                         ["auto", "auto", "auto", "64", "200", "off"])
        rows = [plan(tok, gemma, GEMMA4_31B.noul_rendering, *c) for c in cases]
        (out / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False))
        limited = sum(1 for r in rows if r["plan"] and r["plan"]["limited"] and r["plan"]["fits"])
        refused = sum(1 for r in rows if r["plan"] and not r["plan"]["fits"])
        print(f"[header_limit] {name}: {len(rows)} requests, {limited} limited, {refused} refused",
              file=sys.stderr)
        if name == "fixture":
            fmt = dataclasses.replace(reference_engine(None, QWEN).fmt, layout="header")
            cases = requests(args.served_count, args.seed + 1, [args.served], [0], ["auto"])
            rows = [plan(tok, fmt, QWEN.noul_rendering, *c) for c in cases]
            (out / "served").mkdir(exist_ok=True)
            (out / "served" / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False))


if __name__ == "__main__":
    main()
