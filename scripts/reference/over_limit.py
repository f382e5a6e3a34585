"""Over-long System One states, cut as the reference decisio 0.35.0 cuts them.

Usage: python scripts/reference/over_limit.py OUT_DIR NAME=TOKENIZER_DIR ... [--count N] [--seed S]

Generates N System One requests whose states run from a few tokens to
several times a prompt ceiling (prose with newlines, runs of spaces and
tabs, Unicode, long unbroken words; strings, objects and arrays), each with
a ceiling and a padding block, and asks the reference's own code what it
does with them under `over_limit: truncate`:
`decisio.serve.systemone.SystemOne.truncated_request`, with the questions
mapped by `SystemOne.engine_question` and an engine of the family's prompt
format whose header limit is off (every question listed under the header
layout, as decisio lists them). `decisio.serve.over_limit.fit_state` is
watched to record the row's tokens without a state (`overhead`) it was
given.

Writes OUT_DIR/over_limit/NAME.json (the Qwen format) and
OUT_DIR/over_limit/gemma/NAME.json (the Gemma bases') for each tokenizer: a
list of {"request", "limit", "reserve", "overhead", "state" (the text kept,
null when the whole state fits), "report" (kept_tokens, of_tokens, part,
limit) or "error" (the refusal's text)}. With `--served L`, the fixture's
first requests are also written with the ceiling L and no padding
(OUT_DIR/over_limit/served-L/NAME.json), for a server started with
`--over-limit-tokens L`. The Rust test `tests/over_limit.rs` cuts the same
states and compares them character for character.

Needs the `decisio` 0.35.0 wheel's code on the path, pydantic and
transformers (as scripts/reference/systemone_prompts.py).
"""

import argparse
import json
import random
import sys
import types
from pathlib import Path

from transformers import AutoTokenizer

from decisio.serve import over_limit as over
from decisio.serve import systemone as so

from systemone_prompts import FORMATS, UNICODE, WORDS, question, reference_engine, served

PUNCT = [". ", ", ", "; ", "! ", "? ", ".\n", ".\n\n", " - ", "  ", "\t", ": "]


def prose(rng, words):
    """About `words` words of text, with the whitespace a real state has."""
    out = []
    for i in range(words):
        r = rng.random()
        if r < 0.03:
            out.append(rng.choice(UNICODE))
        elif r < 0.04:
            out.append("".join(rng.choice("abcdefghij") for _ in range(rng.randint(30, 90))))
        else:
            out.append(rng.choice(WORDS))
        out.append(rng.choice(PUNCT) if rng.random() < 0.15 else " ")
    return "".join(out).strip().capitalize()


def state(rng, words):
    r = rng.random()
    if r < 0.7:
        return prose(rng, words)
    if r < 0.85:
        return {"subject": prose(rng, 6), "body": prose(rng, words), "_id": rng.randint(1, 99)}
    n = rng.randint(2, 5)
    return [prose(rng, words // n + 1) for _ in range(n)]


def requests(count, seed):
    """(request, limit, reserve): ceilings of 160 to 2,048 tokens, states up
    to about four times the ceiling, paddings of 0, 16 or 32."""
    rng = random.Random(seed)
    kinds = ["noul", "choice", "score"]
    for i in range(count):
        limit = rng.choice([160, 256, 384, 512, 768, 1024, 2048])
        words = rng.randint(limit // 8, limit * 3)
        qs = {}
        for j in range(rng.randint(1, 3)):
            kind = kinds[(i + j) % 3]
            qs[f"q{j}"] = question(rng, kind)
        body = {"model": "jev-latest", "state": state(rng, words), "questions": qs}
        yield body, limit, rng.choice([0, 0, 16, 32])


def cut(tok, family, body, limit, reserve):
    """What the reference does with `body` under `truncate`: the entry written."""
    eng = reference_engine(tok, family)
    eng.over_limit_tokens = limit
    eng.pad_unit = reserve or None
    eng.header_limit_setting = ("off", None)
    server = served(family.noul_rendering)
    server.truncated = {"requests": 0, "largest_state_tokens": 0}
    req = so.SystemOneRequest.model_validate(body)
    qs = [so.SystemOne.engine_question(server, req.questions[n])[0] for n in req.questions]
    seen = {}
    original = over.fit_state

    def watched(tok_, text, overhead, limit_, reserve=0):
        seen["overhead"] = overhead
        return original(tok_, text, overhead, limit_, reserve)

    over.fit_state = watched
    entry = {"request": body, "limit": limit, "reserve": reserve}
    try:
        new, report = so.SystemOne.truncated_request(server, req, qs, eng)
        entry["state"] = None if report is None else new.state
        entry["report"] = report
    except over.OverLimit as e:
        entry["error"] = str(e)
    finally:
        over.fit_state = original
    entry["overhead"] = seen["overhead"]
    return entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("tokenizers", nargs="+", help="NAME=FOLDER")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--served", type=int, default=512)
    ap.add_argument("--served-count", type=int, default=16)
    args = ap.parse_args()
    out = Path(args.out) / "over_limit"
    for spec in args.tokenizers:
        name, folder = spec.split("=", 1)
        tok = AutoTokenizer.from_pretrained(folder)
        for sub, family in FORMATS:
            rows = [cut(tok, family, *r) for r in requests(args.count, args.seed)]
            (out / sub).mkdir(parents=True, exist_ok=True)
            (out / sub / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False))
            cuts = sum(1 for r in rows if r.get("state") is not None)
            errors = sum(1 for r in rows if "error" in r)
            print(f"[over_limit] {sub}{name} ({family.key}): {len(rows)} states, {cuts} cut, "
                  f"{errors} refused", file=sys.stderr)
        if name == "fixture":
            # the served cases: the Qwen format, one ceiling, no padding
            rng = random.Random(args.seed + 1)
            rows = []
            for i in range(args.served_count):
                kinds = ["noul", "choice", "score"]
                qs = {f"q{j}": question(rng, kinds[(i + j) % 3]) for j in range(rng.randint(1, 3))}
                body = {"model": "jev-latest", "state": prose(rng, rng.randint(args.served, args.served * 3)),
                        "questions": qs}
                rows.append(cut(tok, FORMATS[0][1], body, args.served, 0))
            folder_out = out / f"served-{args.served}"
            folder_out.mkdir(parents=True, exist_ok=True)
            (folder_out / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False))


if __name__ == "__main__":
    main()
