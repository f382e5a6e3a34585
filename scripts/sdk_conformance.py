"""A run record's chat questions asked again through the OpenAI Python SDK.

Usage: python3 scripts/sdk_conformance.py --record runs/<date>_<name> --server URL [--api-key KEY]

`decisio suite run` asks a suite's chat questions (JSONL items written as
`messages`) through the chat completions' `decisio` object, and asks a
seeded sample of them again, keeping each request in the record's
`conformance`. This asks each of those again as a user's client does,
`client.chat.completions.create(..., extra_body={"decisio": ...})`, and
writes what came back to RECORD/sdk-conformance.json, which `decisio gate`
reads: each answer's float32 values must be the record's bit for bit, the
content the answer's letter, and `top_logprobs` every option's letter.
Run it against the server the record was made on, while it is up.

Exit status: 0 when every answer is the record's, 1 when one differs, 2 when
the record cannot be checked (no chat question, unreadable).
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import openai

SDK_FILE = "sdk-conformance.json"


def f32_bits(x):
    """The float32 bits of a JSON number (the server's float32 values)."""
    return struct.unpack("<I", struct.pack("<f", x))[0]


def letters(n):
    return [chr(ord("A") + i) for i in range(n)]


def ask(client, request):
    """One chat question through the SDK: (values, content, top tokens)."""
    reply = client.chat.completions.create(
        model=request["model"],
        messages=request["messages"],
        extra_body={"decisio": request["decisio"]},
    )
    answer = reply.to_dict()["decisio"]["answer"]
    n = len(request["decisio"]["options"])
    choice = reply.choices[0]
    return {
        "probabilities": [answer["probabilities"][l] for l in letters(n)],
        "letter_logprobs": [answer["letter_logprobs"][l] for l in letters(n)],
        "content": choice.message.content or "",
        "top_logprobs": [t.token for t in choice.logprobs.content[0].top_logprobs],
    }


def same(got, want):
    """Bit for bit the record's answer, its letter as the content, every
    option's letter listed."""
    n = len(want["probabilities"])
    values = all(
        list(map(f32_bits, got[k])) == list(map(f32_bits, want[k]))
        for k in ("probabilities", "letter_logprobs")
    )
    letter = "" if want["index"] is None else letters(n)[want["index"]]
    return values and got["content"] == letter and sorted(got["top_logprobs"]) == letters(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", type=Path, required=True, help="a record folder")
    ap.add_argument("--server", default="http://127.0.0.1:8000", help="the server's base URL")
    ap.add_argument("--api-key", default=None, help="sent as the SDK's api_key")
    a = ap.parse_args()

    try:
        record = json.loads((a.record / "record.json").read_text())
    except (OSError, ValueError) as e:
        print(f"cannot read the record in {a.record}: {e}", file=sys.stderr)
        return 2
    chat = [c for c in record.get("conformance", []) if c.get("surface") == "chat"]
    if not chat:
        print(f"{a.record}: the record has no chat question asked again; nothing to check",
              file=sys.stderr)
        return 2
    answers = {(s["name"], x["id"]): x for s in record["choice_sets"] for x in s["answers"]}

    client = openai.OpenAI(base_url=a.server.rstrip("/") + "/v1", api_key=a.api_key or "none",
                           max_retries=5, timeout=600)
    items, differ = [], []
    for c in chat:
        got = ask(client, c["request"])
        items.append({"set": c["set"], "id": c["id"], **got})
        if not same(got, answers[(c["set"], c["id"])]):
            differ.append(f"{c['set']}/{c['id']}")
    out = {"client": f"openai-python {openai.__version__}", "server": a.server, "items": items}
    (a.record / SDK_FILE).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(items) - len(differ)} of {len(items)} chat questions asked again through "
          f"openai-python {openai.__version__} gave the record's float32 values bit for bit"
          + (f"; differ: {', '.join(differ)}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
