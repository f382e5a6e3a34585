"""Tokenizers for the tiny conversions (tests/bases_serve.rs): real chat
templates over a vocabulary that fits a tiny model's 1,024 ids.

Usage: python scripts/reference/tiny_tokenizers.py OUT_DIR QWEN3_DIR GEMMA3_DIR

For each family (Qwen3 for the Qwen3.6 base, Gemma 3 for the Gemma 4 bases:
the family tokenizers that registry packages ship), writes
OUT_DIR/tiny/tokenizer-<family>/ with
  - tokenizer.json: a byte-level BPE over the 256 byte tokens (ids 0 to
    255) whose only merges make the letter codes one token each, as a
    family's own vocabulary has them: ` A` to ` Z` and the first 229
    two-letter codes ` AA`, ` AB`, ... (System One's 255 codes), and the
    same codes bare (`A` is a byte already; `AA`, ... decisio's own layout
    reads after the assistant turn's start); then, as special tokens, every
    added token of the family's tokenizer that its chat template writes,
    plus its beginning, end and padding tokens;
  - tokenizer_config.json: the family's own chat template and special-token
    settings.
Prompts then render exactly as with the family's tokenizer, and every
token id is under 1,024.
"""

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

KEEP = ("chat_template", "bos_token", "eos_token", "pad_token", "unk_token",
        "add_bos_token", "add_eos_token", "clean_up_tokenization_spaces",
        "model_max_length")


def token_text(t):
    return t["content"] if isinstance(t, dict) else t


SPACE = "\u0120"  # the byte-level alphabet's space
LETTERS = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
CODES = 255  # System One's most options


def letter_code_merges():
    """The merges, by rank, that make the codes one token: every ` X`
    first, then ` XY` from ` X`, then bare `XY`, so that ` XY` is never
    split as ` ` and `XY`."""
    pairs = [a + b for a in LETTERS for b in LETTERS][: CODES - len(LETTERS)]
    spaced = [(SPACE, c) for c in LETTERS]
    spaced += [(SPACE + p[0], p[1]) for p in pairs]
    return spaced + [(p[0], p[1]) for p in pairs]


def build(source, out):
    config = json.loads((source / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    specials = [token_text(config[k]) for k in ("bos_token", "eos_token", "pad_token")
                if config.get(k)]
    for t in config.get("added_tokens_decoder", {}).values():
        if t["content"] in template and t["content"] not in specials:
            specials.append(t["content"])
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = letter_code_merges()
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    kept = {k: config[k] for k in KEEP if k in config}
    kept["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(kept, indent=2) + "\n")
    print(f"[reference] {out.name}: {tok.get_vocab_size()} tokens ({len(specials)} special)")


def main():
    out = Path(sys.argv[1]) / "tiny"
    build(Path(sys.argv[2]), out / "tokenizer-qwen3")
    build(Path(sys.argv[3]), out / "tokenizer-gemma3")


if __name__ == "__main__":
    main()
