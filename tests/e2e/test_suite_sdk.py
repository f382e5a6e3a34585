"""A suite's chat questions through the OpenAI SDK: `decisio suite run`
asks them through the chat completions' `decisio` object and records a
sample asked again; scripts/sdk_conformance.py asks that sample again with
the OpenAI Python SDK, and `decisio gate` holds the SDK's answers to the
record's float32 values bit for bit, failing when one differs."""

import json
import shutil
import struct
import subprocess
import sys

from conftest import API_KEY, BIN, ROOT

SDK = ROOT / "scripts/sdk_conformance.py"


def suite(tmp_path):
    data = ROOT / "suites/data"
    path = tmp_path / "suite.yaml"
    path.write_text(
        "version: 1\nname: sdk\nseed: 11\nconformance: 4\nchoice_sets:\n"
        f"  - name: everyday\n    format: jsonl\n    file: {data / 'everyday.jsonl'}\n    limit: 4\n"
        f"  - name: chat\n    format: jsonl\n    file: {data / 'everyday-chat.jsonl'}\n    limit: 8\n")
    return path


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)


def record_of(server, tmp_path):
    """A suite run on the e2e server: the record's folder and its JSON."""
    rec = tmp_path / "record"
    r = run(BIN, "suite", "run", "--server", server, "--api-key", API_KEY,
            "--suite", suite(tmp_path), "--out", rec)
    assert r.returncode == 0, r.stderr
    return rec, json.loads((rec / "record.json").read_text())


def gate(record, against):
    return run(BIN, "gate", "--record", record, "--against", against, "--bitwise")


def test_chat_questions_asked_again_through_the_sdk_are_the_records_bits(server, tmp_path):
    rec, record = record_of(server, tmp_path)
    chat = [c for c in record["conformance"] if c["surface"] == "chat"]
    assert len(chat) == 4 and all(c["equal"] for c in chat), chat

    # Before the SDK has asked, the gate says what to run.
    g = gate(rec, rec)
    assert g.returncode == 1, g.stdout
    assert "FAIL  conformance (chat questions again through the OpenAI SDK)" in g.stdout
    assert "scripts/sdk_conformance.py" in g.stdout

    s = run(sys.executable, SDK, "--record", rec, "--server", server, "--api-key", API_KEY)
    assert s.returncode == 0, s.stdout + s.stderr
    assert "4 of 4 chat questions" in s.stdout, s.stdout
    sdk = json.loads((rec / "sdk-conformance.json").read_text())
    assert sdk["client"].startswith("openai-python ")
    assert sorted(i["id"] for i in sdk["items"]) == sorted(c["id"] for c in chat)
    for item in sdk["items"]:
        assert item["content"] in "ABCD" and len(item["content"]) == 1
        assert sorted(item["top_logprobs"]) == ["A", "B", "C", "D"]
    g = gate(rec, rec)
    assert g.returncode == 0, g.stdout + g.stderr
    assert "pass  conformance (chat questions again through the OpenAI SDK)" in g.stdout
    assert "candidate      4/4" in g.stdout


def test_a_record_the_sdk_does_not_reproduce_fails(server, tmp_path):
    rec, record = record_of(server, tmp_path)
    # One chat answer's first probability moved by one float32 step.
    target = next(c["id"] for c in record["conformance"] if c["surface"] == "chat")
    chat = next(s for s in record["choice_sets"] if s["name"] == "chat")
    answer = next(a for a in chat["answers"] if a["id"] == target)
    bits = struct.unpack("<I", struct.pack("<f", answer["probabilities"][0]))[0]
    answer["probabilities"][0] = struct.unpack("<f", struct.pack("<I", bits ^ 1))[0]
    moved = tmp_path / "moved"
    shutil.copytree(rec, moved)
    (moved / "record.json").write_text(json.dumps(record))

    s = run(sys.executable, SDK, "--record", moved, "--server", server, "--api-key", API_KEY)
    assert s.returncode == 1, s.stdout + s.stderr
    assert f"differ: chat/{target}" in s.stdout, s.stdout
    g = gate(moved, moved)
    assert g.returncode == 1
    assert "FAIL  conformance (chat questions again through the OpenAI SDK)" in g.stdout
    assert "candidate      3/4" in g.stdout, g.stdout
