"""Benchmark: the reference decisio's headline case, 50 questions of the
three System One types about one document of about 3,000 tokens, asked as
one request.

Usage: python scripts/bench/systemone.py [--reps 5] [--tokens 3000]

Servers, all on the fixture on this machine's CPUs, started once:
  - decisio on MLX (the fixture as `make serve` serves it);
  - decisio's vLLM backend in front of vLLM's CPU build (the real vLLM of
    `make setup`, blocks of 32, serving the fixture's float32 copy);
  - the reference decisio 0.35.0 on its own vLLM (its recipe,
    ../shared/reference/reference-on-cpu.md: `--base qwen3.6-35b-a3b`,
    its default padding, blocks of 32).
Each decisio answers the request on `POST /v1/systemone` and the same work
on `POST /v1/decide` (each yes/no question as the options No and Yes, each
score as its levels); the reference answers `/v1/systemone`. Every round
asks each server about a document it has not seen (a new state: the
document is read, then the 50 questions), then the same request again (a
seen state), the servers in turn, so the machine's noise falls on all of
them alike. Medians over the rounds, and each decisio figure as a ratio of
the reference's.

Writes runs/<date>_systemone-bench/{summary.md,results.json,times.png}.
"""

import argparse
import json
import statistics
import subprocess
import sys

import common

sys.path.insert(0, str(common.ROOT / "tests" / "e2e"))
from conftest import start_reference, start_vllm, stop_vllm  # noqa: E402

TOPICS = ["mathematics", "history", "biology", "law", "medicine", "physics", "chemistry",
          "economics", "philosophy", "computer science", "geography", "psychology",
          "astronomy", "music", "ethics", "statistics", "engineering"]
LEVELS = ["none at all", "a little", "some", "much", "very much"]


def questions():
    """50 questions: 17 yes/no, 17 choices of four options, 16 scores of
    five levels, keyed q00..q49."""
    qs = {}
    for i, t in enumerate(TOPICS):
        qs[f"q{len(qs):02d}"] = {"type": "noul",
                                 "instructions": f"Does the document ask about {t}?",
                                 "criteria": {"true": f"at least one question is about {t}"}}
    for i in range(17):
        four = [TOPICS[(i + k * 4) % len(TOPICS)] for k in range(4)]
        qs[f"q{len(qs):02d}"] = {"type": "choice",
                                 "instructions": f"Which subject does question {i + 1} belong to?",
                                 "criteria": {t.replace(" ", "_"): None for t in four}}
    for i in range(16):
        qs[f"q{len(qs):02d}"] = {"type": "score",
                                 "instructions": f"How much does the document rely on {TOPICS[i]}?",
                                 "criteria": LEVELS}
    return qs


def as_decide(qs):
    """The same questions on /v1/decide: each as lettered options."""
    out = []
    for q in qs.values():
        c = q["criteria"]
        if q["type"] == "noul":
            options = ["No", "Yes"]
        elif q["type"] == "choice":
            options = [k.replace("_", " ") for k in c]
        else:
            options = list(c)
        out.append({"text": q["instructions"], "options": options})
    return out


def documents(port, rows, n, target):
    """n documents of about `target` tokens (as the fixture counts them),
    each of distinct MMLU questions, numbered."""
    docs, at = [], 0
    for _ in range(n):
        parts = []
        while True:
            parts.append(f"Question {len(parts) + 1}. {common.question_text(rows[at])}")
            at += 1
            text = "\n\n".join(parts)
            if len(text) >= target * 3.6:
                break
        _, t = common.post(port, "/tokenize", {"model": "model", "prompt": text})
        docs.append((text, t["count"]))
    return docs


def timed(port, path, body):
    common.settle()
    seconds, answer = common.post(port, path, body)
    return seconds, answer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=3000)
    a = ap.parse_args()
    out = common.run_dir("systemone-bench")

    mlx, mlx_port = common.start_decisio()
    vllm_port = common.free_port()
    vllm = start_vllm(vllm_port, block_size=32)
    gw, gw_port = common.start_decisio(
        extra=["--backend", "vllm", "--upstream", f"http://127.0.0.1:{vllm_port}"])
    ref_port = common.free_port()
    ref = start_reference(ref_port, pad_to=None)
    try:
        qs = questions()
        decide_qs = as_decide(qs)
        docs = documents(mlx_port, common.mmlu_rows(), a.reps + 1, a.tokens)
        cases = [
            ("decisio MLX, /v1/systemone", mlx_port, "/v1/systemone"),
            ("decisio MLX, /v1/decide", mlx_port, "/v1/decide"),
            ("decisio vLLM backend, /v1/systemone", gw_port, "/v1/systemone"),
            ("decisio vLLM backend, /v1/decide", gw_port, "/v1/decide"),
            ("reference decisio 0.35.0, /v1/systemone", ref_port, "/v1/systemone"),
        ]

        def body(path, doc):
            if path == "/v1/systemone":
                return {"state": doc, "questions": qs}
            return {"state": doc, "questions": decide_qs}

        times = {name: {"new": [], "seen": []} for name, _, _ in cases}
        answers = {}
        for r, (doc, _) in enumerate(docs):
            for name, port, path in cases:
                new, first = timed(port, path, body(path, doc))
                seen, again = timed(port, path, body(path, doc))
                n = len(first["answers"])
                if n != 50:
                    raise RuntimeError(f"{name}: {n} answers of 50")
                if r == 0:
                    continue  # the warm-up round: not timed
                times[name]["new"].append(new)
                times[name]["seen"].append(seen)
                if r == 1:
                    answers[name] = first["answers"]
            if r:
                print(f"[bench] round {r} of {a.reps}, new state: " + ", ".join(
                    f"{name} {times[name]['new'][-1]:.2f} s" for name, _, _ in cases), flush=True)
    finally:
        stop_vllm(ref)
        stop_vllm(vllm)
        for p in (gw, mlx):
            p.kill()

    ref_name = cases[-1][0]
    summary = {name: {k: common.summarize(v) for k, v in t.items()} for name, t in times.items()}
    ratios = {name: {k: summary[name][k]["median"] / summary[ref_name][k]["median"]
                     for k in ("new", "seen")} for name in summary}
    # The wire's answers beside the reference's: the same top option?
    agree = {}
    for name in ("decisio MLX, /v1/systemone", "decisio vLLM backend, /v1/systemone"):
        same = 0
        for qid, theirs in answers[ref_name].items():
            ours = answers[name][qid]
            if theirs["type"] == "choice":
                same += ours["choice"] == theirs["choice"]
            elif theirs["type"] == "noul":
                same += (ours["noul"] >= 0.5) == (theirs["noul"] >= 0.5)
            else:
                top = lambda p: max(p, key=lambda k: (p[k], -int(k)))  # noqa: E731
                same += top(ours["probabilities"]) == top(theirs["probabilities"])
        agree[name] = same
    tokens = [t for _, t in docs[1:]]
    record = {"machine": common.machine(), "reps": a.reps, "document_tokens": tokens,
              "questions": {"noul": 17, "choice": 17, "score": 16}, "seconds": times,
              "summary": summary, "ratio_to_reference": ratios,
              "same_top_answer_as_reference": agree}
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")

    short = ["MLX wire", "MLX decide", "vLLM wire", "vLLM decide", "reference"]
    rows = [{"name": label, "a": summary[name]["new"]["median"],
             "b": summary[name]["seen"]["median"]} for label, name in zip(short, summary)]
    plot = out / "times.png"
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "paired_bars"],
                   cwd=common.ROOT, check=True)
    subprocess.run([str(common.DECISIO.parent / "examples" / "paired_bars"),
                    json.dumps({"rows": rows, "names": ["new state", "seen state"],
                                "y": "seconds per request (median)",
                                "title": "50 System One questions on one ~3,000-token document"}),
                    str(plot)], check=True)

    lines = [
        "# System One: 50 questions on one document, decisio beside the reference decisio",
        "",
        f"Command: `python scripts/bench/systemone.py --reps {a.reps} --tokens {a.tokens}`"
        " (`make bench`).",
        f"Machine: {common.machine()['cpus']} CPUs, {common.machine()['processor'] or 'x86_64'};"
        f" the fixture (SmolLM2-135M-Instruct); documents of {min(tokens)} to {max(tokens)} tokens"
        " (MMLU questions); 17 yes/no, 17 four-option choices, 16 five-level scores.",
        "",
        "Each server was asked about a document it had not seen (new state), then the same request"
        f" again (seen state), the servers in turn; {a.reps} rounds after one untimed round."
        " Seconds per whole request, median (min to max); ratio = decisio's median over the"
        " reference's.",
        "",
        "| server, route | new state s | ratio | seen state s | ratio |",
        "|---|---|---|---|---|",
    ]
    for name in summary:
        n, s = summary[name]["new"], summary[name]["seen"]
        lines.append(f"| {name} | {n['median']:.2f} ({n['min']:.2f} to {n['max']:.2f}) |"
                     f" {ratios[name]['new']:.2f} | {s['median']:.2f} ({s['min']:.2f} to"
                     f" {s['max']:.2f}) | {ratios[name]['seen']:.2f} |")
    lines += ["", "On MLX a state's prefix-cache entry keeps the answers already read on it, so the"
              " same questions again are looked up, not computed (the seen-state figure); vLLM"
              " caches the state's blocks but computes every question's last positions again."]
    lines += ["", "Same top answer as the reference on the first timed document (of 50):"]
    lines += [f"- {name}: {k}" for name, k in agree.items()]
    lines += ["", "`times.png`: the medians (wire: `/v1/systemone`; decide: `/v1/decide`;"
              " vLLM: decisio's vLLM backend). `results.json`: every time.", ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
