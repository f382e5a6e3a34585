"""A new state's read on MLX by `--prefill-chunk`: the fixture served once
per chunk size, each reading new states of ~1,000 and ~3,500 tokens (one
question each; the same states, new to each server), after one untimed request.

Usage: python scripts/bench/prefill_chunk.py [CHUNK ...]   (default 256 512 1024)

Writes runs/<today>_prefill-chunk/summary.md and results.json.
"""

import json
import random
import statistics
import sys
import time
import urllib.request

import common


def documents():
    d = json.loads((common.ROOT / "target/reference/decisions.json").read_text())
    texts = [s["state"] for s in d["states"]]

    def doc(seed, chars):
        r = random.Random(seed)
        out = []
        while sum(len(t) for t in out) < chars:
            out.append(f"{r.choice(texts)} (note {r.random():.6f})")
        return "\n\n".join(out)
    return doc


def decide(port, state):
    body = {"state": state, "questions": [{"text": "Which is it?", "options": ["the first", "the second"]}]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/decide", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=1800) as r:
        answer = json.loads(r.read())
    return time.perf_counter() - t, answer["state"]["tokens"]


def main():
    chunks = [int(c) for c in sys.argv[1:]] or [256, 512, 1024]
    doc = documents()
    rows = []
    for chunk in chunks:
        proc, port = common.start_decisio(extra=["--prefill-chunk", str(chunk)])
        try:
            decide(port, doc(7, 4200))
            for i in range(3):
                t, n = decide(port, doc(1000 + i, 4200))
                rows.append({"chunk": chunk, "size": "1k", "seconds": t, "tokens": n})
            t, n = decide(port, doc(1009, 12600))
            rows.append({"chunk": chunk, "size": "3.5k", "seconds": t, "tokens": n})
            print(json.dumps(rows[-4:]), flush=True)
        finally:
            proc.kill()
    out = common.run_dir("prefill-chunk")
    (out / "results.json").write_text(json.dumps({"machine": common.machine(), "rows": rows}, indent=1))
    lines = ["# A new state's read on MLX by `--prefill-chunk`", "",
             f"Command: `python scripts/bench/prefill_chunk.py {' '.join(map(str, chunks))}`. Machine: "
             f"{common.machine()['cpus']} CPUs; the fixture (SmolLM2-135M-Instruct, float32), `/v1/decide`, "
             "one question a state, the same new states on every server; one server per chunk size, one untimed request first.", "",
             "| chunk | ~1,000-token state: median of 3 (s) | ~3,500-token state: one (s) |", "|---:|---:|---:|"]
    for chunk in chunks:
        small = [r for r in rows if r["chunk"] == chunk and r["size"] == "1k"]
        large = [r for r in rows if r["chunk"] == chunk and r["size"] == "3.5k"]
        lines.append(f"| {chunk} | {statistics.median(r['seconds'] for r in small):.2f} "
                     f"({small[0]['tokens']} to {small[-1]['tokens']} tokens) | "
                     f"{large[0]['seconds']:.2f} ({large[0]['tokens']} tokens) |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
