#!/usr/bin/env python3
"""Reference prompts and token ids for tests/prompt_conformance.rs.

Usage (in the project's venv, which has transformers, jinja2, tokenizers):

    python scripts/reference/prompts.py OUTDIR [TEMPLATE_FOLDER ...]

Writes OUTDIR/prompts.json. Each TEMPLATE_FOLDER holds a
tokenizer_config.json (or chat_template.jinja) and, optionally, a
tokenizer.json. With no folders, the DEFAULT_FOLDERS below that exist are used.

For every folder, a fixed set of conversations is rendered exactly as
`AutoTokenizer.from_pretrained(folder).apply_chat_template(messages,
tokenize=False, add_generation_prompt=..., **kwargs)` renders them, for
add_generation_prompt True/False and, where the template reads it,
enable_thinking absent/True/False. A folder without tokenizer.json gets a
`PreTrainedTokenizerFast` with a one-word vocabulary and the config's special
tokens, so the same apply_chat_template code runs. Where a tokenizer.json
exists, `tokenizers.Tokenizer.from_file(...)` token ids (add_special_tokens
False and True) and decodings are recorded for every rendering, for MMLU
questions and for hand-picked edge cases.

The output depends only on the inputs and the library versions (recorded).
"""

import copy
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import jinja2  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, models  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DECISIO_CACHE", Path.home() / ".cache" / "decisio"))
ASSETS = Path(os.environ.get("DECISIO_ASSETS", CACHE / "assets"))

# One line per template folder; missing ones are skipped when no folders are given.
DEFAULT_FOLDERS = [
    ASSETS / "qwen3",
    ASSETS / "gemma3",
    CACHE / "models" / "smollm2-135m-instruct",
    REPO / "tests" / "fixtures" / "chat-templates" / "pycompat",
]

MMLU_QUESTIONS = 250

SYSTEM = "You are a careful assistant. Answer briefly."

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    }
]

# (name, messages, template kwargs)
CONVERSATIONS = [
    ("system_user", [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ], {}),
    ("user_only", [
        {"role": "user", "content": "Hello! Who are you?"},
    ], {}),
    ("multi_turn", [
        {"role": "user", "content": "Pick a number between 1 and 10."},
        {"role": "assistant", "content": "7."},
        {"role": "user", "content": "Why that one?"},
    ], {}),
    ("assistant_last", [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"},
    ], {}),
    ("unicode_whitespace", [
        {"role": "system", "content": "Réponds en français, s'il te plaît. 🙂"},
        {"role": "user", "content": "  日本語 and emoji 👩‍💻 with\ttabs,\u00a0nbsp,\u3000ideographic space and trailing spaces   \n\n"},
    ], {}),
    ("empty_system", [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Hi"},
    ], {}),
    ("thinking_history", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"},
    ], {}),
    ("reasoning_field", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add the numbers."},
    ], {}),
    ("tools", [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}}},
        ]},
        {"role": "tool", "content": "{\"temp\": 21.5}"},
    ], {"tools": TOOLS}),
    ("content_parts", [
        {"role": "user", "content": [
            {"type": "text", "text": "Describe this in one word:"},
            {"type": "text", "text": " sunshine."},
        ]},
    ], {}),
    ("non_alternating", [
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ], {}),
    ("null_fields", [
        {"role": "user", "content": "Hi", "name": None},
        {"role": "assistant", "content": "Hello", "tool_calls": None},
    ], {}),
]

EDGE_CASES = [
    "",
    " ",
    "a",
    "Hello, world!",
    "1234567890",
    "3.14159 and 1,000,000 and 2024-02-29 and 0x1F",
    "99999999999999999999",
    "日本語のテキストです。中文文本。한국어 텍스트.",
    "Ça va? Größe, naïve café — “quotes” ‘single’ … «guillemets»",
    "Привет, мир! مرحبا بالعالم नमस्ते दुनिया",
    "😀 👍🏽 👩‍👩‍👧‍👦 🇫🇷 ❤️",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕋𝕖𝕩𝕥 🀄",
    "e\u0301 vs é (combining accent)",
    "a    b\t\tc\n\nd\r\ne   ",
    "    leading spaces",
    "trailing spaces    ",
    "\n\n\n",
    " \t \n \u00a0 \u3000 ",
    "tab\tseparated\tvalues",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_end|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "text<eos>more<pad>",
    "<s> </s> [INST] <<SYS>>",
    "almost special: <|im_start |> <|im_end>",
    "def f(x):\n    return x ** 2  # square\n",
    "https://example.com/path?q=1&r=two#frag",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "ALL CAPS TEXT and MiXeD CaSe",
    "don't can't won't it's we're they've I'm you'll she'd",
    "\x00\x01\x7f control characters",
    "\ue000\uf8ff private use",
    "\ufeffbyte order mark",
    "zero\u200bwidth\u200djoiner",
    "$$\\int_0^1 x^2 \\, dx = \\frac{1}{3}$$",
    "!!!???...,,,;;;:::---___***",
    "A" * 300,
    "ab " * 100,
]


def template_source(tok, kwargs):
    """The template transformers picks (see get_chat_template)."""
    template = tok.chat_template
    if isinstance(template, dict):
        if kwargs.get("tools") is not None and "tool_use" in template:
            return template["tool_use"]
        return template["default"]
    return template


def load_tokenizer(folder):
    if (folder / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(folder)), "AutoTokenizer"
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    jinja_path = folder / "chat_template.jinja"
    if jinja_path.is_file():
        template = jinja_path.read_text(encoding="utf-8")
    else:
        template = config.get("chat_template")
        if isinstance(template, list):
            template = {t["name"]: t["template"] for t in template}
    if template is None:
        raise SystemExit(f"{folder}: no chat template (tokenizer_config.json or chat_template.jinja)")
    tokens = {}
    for key, value in config.items():
        if isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            tokens[key] = value
    vocab = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=vocab, chat_template=template, **tokens), "PreTrainedTokenizerFast"


def render(tok, messages, add_generation_prompt, kwargs):
    try:
        text = tok.apply_chat_template(
            copy.deepcopy(messages),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **copy.deepcopy(kwargs),
        )
        return {"text": text}
    except Exception as e:  # recorded: the Rust side must fail the same way
        return {
            "error": {
                # raise_exception() raises a plain TemplateError; anything else is a failure of the template itself
                "raised": type(e) is jinja2.exceptions.TemplateError,
                "type": type(e).__name__,
                "message": str(e),
            }
        }


def mmlu_texts():
    path = ASSETS / "mmlu.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    step = len(rows) / MMLU_QUESTIONS
    picked = [rows[int(i * step)] for i in range(min(MMLU_QUESTIONS, len(rows)))]
    return [
        (
            f"mmlu:{int(i * step)}:{row['topic']}",
            f"{row['question']}\nA. {row['answer_a']}\nB. {row['answer_b']}\nC. {row['answer_c']}\nD. {row['answer_d']}\nAnswer:",
        )
        for i, row in enumerate(picked)
    ]


def tokenize(raw, label, text):
    ids = raw.encode(text, add_special_tokens=False).ids
    entry = {"label": label, "text": text, "ids": ids}
    with_special = raw.encode(text, add_special_tokens=True).ids
    if with_special != ids:
        entry["ids_with_special"] = with_special
    decoded = raw.decode(ids, skip_special_tokens=False)
    if decoded != text:
        entry["decoded"] = decoded
    skipped = raw.decode(ids, skip_special_tokens=True)
    if skipped != decoded:
        entry["decoded_skip_special"] = skipped
    return entry


def vocabulary(raw):
    size = raw.get_vocab_size(with_added_tokens=True)
    added = raw.get_added_tokens_decoder()
    sample = sorted(set(range(0, 300)) | set(range(0, size, max(1, size // 500))) | set(list(added)[:100]))
    return {
        "size": size,
        "tokens": [[i, raw.id_to_token(i)] for i in sample],
        "special_ids": sorted(i for i, t in added.items() if t.special),
    }


def folder_reference(folder):
    tok, loader = load_tokenizer(folder)
    source = template_source(tok, {})
    thinking = re.search(r"(?<![\w])enable_thinking(?![\w])", source) is not None
    thinking_values = [None, True, False] if thinking else [None]
    renderings = []
    for name, messages, kwargs in CONVERSATIONS:
        for add_generation_prompt in (False, True):
            for enable_thinking in thinking_values:
                args = dict(kwargs)
                if enable_thinking is not None:
                    args["enable_thinking"] = enable_thinking
                entry = {
                    "case": name,
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "kwargs": args,
                }
                entry.update(render(tok, messages, add_generation_prompt, args))
                renderings.append(entry)

    out = {
        "name": folder.name,
        "path": str(folder),
        "loader": loader,
        "special_tokens": {k: v for k, v in tok.special_tokens_map.items() if isinstance(v, str)},
        "supports_enable_thinking": thinking,
        "renderings": renderings,
        "tokenized": [],
    }
    tokenizer_json = folder / "tokenizer.json"
    if tokenizer_json.is_file():
        raw = Tokenizer.from_file(str(tokenizer_json))
        seen = set()
        strings = []
        for r in renderings:
            if "text" in r and r["text"] not in seen:
                seen.add(r["text"])
                flags = f"agp={int(r['add_generation_prompt'])}"
                if "enable_thinking" in r["kwargs"]:
                    flags += f",think={int(r['kwargs']['enable_thinking'])}"
                strings.append((f"render:{r['case']}:{flags}", r["text"]))
        strings += mmlu_texts()
        strings += [(f"edge:{i}", text) for i, text in enumerate(EDGE_CASES)]
        out["tokenized"] = [tokenize(raw, label, text) for label, text in strings]
        out["vocabulary"] = vocabulary(raw)
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = Path(argv[1])
    if len(argv) > 2:
        folders = [Path(f).resolve() for f in argv[2:]]
        for folder in folders:
            if not folder.is_dir():
                print(f"not a folder: {folder}", file=sys.stderr)
                return 2
    else:
        folders = [f for f in DEFAULT_FOLDERS if f.is_dir()]
    reference = {
        "generator": "scripts/reference/prompts.py",
        "versions": {
            "transformers": transformers.__version__,
            "jinja2": jinja2.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "folders": [folder_reference(f) for f in folders],
    }
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "prompts.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    for folder in reference["folders"]:
        ok = sum("text" in r for r in folder["renderings"])
        print(
            f"{folder['name']}: {len(folder['renderings'])} renderings ({ok} ok, "
            f"{len(folder['renderings']) - ok} errors), {len(folder['tokenized'])} strings tokenized"
        )
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
