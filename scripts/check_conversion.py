#!/usr/bin/env python3
"""Checks a `decisio convert` folder with the Python reference stack.

    check_conversion.py FOLDER [--gguf FILE] [--prompt TEXT] [--expect WORD]

1. Loads FOLDER with mlx_lm.load and greedily generates up to 16 tokens for a
   chat prompt (default "What is the capital of France?", expecting "Paris").
   A wrong q/k row order still loads but answers gibberish.
2. Loads FOLDER/tokenizer.json with Python `tokenizers` and checks a few
   strings round-trip and that the chat specials are single tokens.
3. With --gguf, compares those token ids with the tokenizer transformers
   builds from the GGUF file itself, an independent reading of the same
   vocabulary.

Needs mlx-lm and tokenizers; --gguf also needs transformers and gguf.
Exits non-zero on the first failed check.
"""

import argparse
import json
import sys
from pathlib import Path

SAMPLES = [
    "Hello, world!",
    "The year 2024 had 366 days; 123 + 4567 = 4690.",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Unicode: café, naïve, 東京, Ελληνικά, emoji 🦙🚀",
    "<|im_start|>user\nHi<|im_end|>\n",
    "def f(x):\n    return x ** 2  # square",
]


def check(condition, message):
    if not condition:
        print(f"FAIL: {message}")
        sys.exit(1)
    print(f"ok: {message}")


def check_generation(folder, prompt, expect):
    from mlx_lm import generate, load

    model, tokenizer = load(str(folder))
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    output = generate(model, tokenizer, prompt=text, max_tokens=16, verbose=False)
    print(f"prompt: {prompt!r}")
    print(f"output: {output!r}")
    check(expect in output, f"generation mentions {expect!r}")


def check_tokenizer(folder):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for name in ("bos_token", "eos_token"):
        content = config.get(name)
        if content:
            ids = tok.encode(content, add_special_tokens=False).ids
            check(
                ids == [tok.token_to_id(content)],
                f"{name} {content!r} is the single token {ids}",
            )
    digits = tok.encode("123", add_special_tokens=False).tokens
    check(digits == ["1", "2", "3"], f"digits split one by one: {digits}")
    encodings = {}
    for s in SAMPLES:
        ids = tok.encode(s, add_special_tokens=False).ids
        back = tok.decode(ids, skip_special_tokens=False)
        check(back == s, f"round trip of {s!r} ({len(ids)} tokens)")
        encodings[s] = ids
    return encodings


def gguf_value(field):
    from gguf import GGUFValueType

    if field.types[0] == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode() for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode()
    return field.parts[field.data[0]].tolist()[0]


def check_against_gguf(gguf, encodings):
    """Token ids against the tokenizer transformers builds from the GGUF.

    transformers' own GGUF loader needs torch for the weights; only its
    tokenizer builder is used here, fed with metadata read by `gguf`.
    """
    from gguf import GGUFReader
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    reader = GGUFReader(str(gguf))
    tokenizer_dict = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        field = reader.fields.get(f"tokenizer.{key}")
        if field is not None:
            tokenizer_dict[name] = gguf_value(field)
    architecture = gguf_value(reader.fields["general.architecture"])
    reference, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    for s, ids in encodings.items():
        want = reference.encode(s, add_special_tokens=False).ids
        check(ids == want, f"ids of {s!r} match transformers' GGUF tokenizer")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--gguf", type=Path, help="the GGUF the folder came from")
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--expect", default="Paris")
    args = parser.parse_args()

    encodings = check_tokenizer(args.folder)
    if args.gguf:
        check_against_gguf(args.gguf, encodings)
    check_generation(args.folder, args.prompt, args.expect)
    print("all checks passed")


if __name__ == "__main__":
    main()
