"""Record: think when unsure on the fixture's MMLU questions, its cost and
its effect on accuracy and calibration.

Usage: python scripts/bench/think.py [--rows 100] [--budget 512] [--factor 1.0]

Asks `--rows` MMLU questions (every k-th row of the assets' file, so that
every topic is in) as System One choice questions of four options (the
question as the state, the four answers as the criteria) on the fixture's
MLX server, started with `--prefix-cache-mb 0` so that every request reads
its state anew: each row once with `"think": false` and once with
`"think": true` (in alternating order, round by round), at the served
defaults (`--think-factor`, `--think-budget`). Reports, for both: accuracy,
ECE (10 equal-width bins of the top probability), the mean negative
log-likelihood of the right answer and the wall time; for thinking, the
questions that thought, their reasoning's tokens and milliseconds, and the
accuracy and ECE on those questions alone, before and after.

Writes runs/<date>_think/{summary.md,results.json,seconds.png}.
"""

import argparse
import json
import math
import statistics

import common


def body(row, think):
    criteria = {k: str(row["answer_" + k.lower()]).strip() for k in "ABCD"}
    return {"state": row["question"].strip(), "think": think,
            "questions": {"answer": {"type": "choice", "instructions": "Which answer is correct?",
                                     "criteria": criteria}}}


def ece(pairs, bins=10):
    """Expected calibration error of (top probability, right) pairs."""
    total, n = 0.0, len(pairs)
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [(p, ok) for p, ok in pairs if lo < p <= hi or (b == 0 and p == 0)]
        if inside:
            conf = statistics.mean(p for p, _ in inside)
            acc = statistics.mean(1.0 if ok else 0.0 for _, ok in inside)
            total += len(inside) / n * abs(conf - acc)
    return total


def scores(answers, rows):
    pairs = [(max(a["probabilities"].values()), a["choice"] == r["correct_answer"])
             for a, r in zip(answers, rows)]
    nll = statistics.mean(-math.log(max(a["probabilities"][r["correct_answer"]], 1e-300))
                          for a, r in zip(answers, rows))
    return {"n": len(rows), "accuracy": statistics.mean(1.0 if ok else 0.0 for _, ok in pairs),
            "ece": ece(pairs), "nll": nll}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--factor", type=float, default=1.0)
    a = ap.parse_args()
    every = common.mmlu_rows(20000)
    step = max(1, len(every) // a.rows)
    rows = every[::step][: a.rows]
    proc, port = common.start_decisio(extra=["--prefix-cache-mb", "0", "--think-budget",
                                             str(a.budget), "--think-factor", str(a.factor)])
    plain, thought, records = [], [], []
    try:
        for i, row in enumerate(rows):
            timed = {}
            for think in ([False, True] if i % 2 == 0 else [True, False]):
                seconds, v = common.post(port, "/v1/systemone", body(row, think))
                timed[think] = (v, seconds)
            (p, tp), (t, tt) = timed[False], timed[True]
            plain.append(p["answers"]["answer"])
            thought.append(t["answers"]["answer"])
            per = t["x_thinking"]["per_question"]["answer"]
            records.append({"row": i, "topic": row["topic"], "gold": row["correct_answer"],
                            "plain": p["answers"]["answer"]["probabilities"],
                            "think": t["answers"]["answer"]["probabilities"],
                            "thought": per["thought"], "tokens": per.get("tokens", 0),
                            "why": per.get("why"), "think_ms": t["x_thinking"]["ms"],
                            "plain_s": tp, "think_s": tt})
            print(f"{i + 1}/{len(rows)}: thought={per['thought']} tokens={per.get('tokens', 0)} "
                  f"plain {tp:.2f}s think {tt:.2f}s", flush=True)
    finally:
        proc.kill()
    which = [i for i, r in enumerate(records) if r["thought"]]
    sub = lambda xs: [xs[i] for i in which]  # noqa: E731
    results = {
        "machine": common.machine(), "rows": len(rows), "budget": a.budget, "factor": a.factor,
        "plain": scores(plain, rows), "think": scores(thought, rows),
        "thought": len(which),
        "thought_plain": scores(sub(plain), sub(rows)) if which else None,
        "thought_think": scores(sub(thought), sub(rows)) if which else None,
        "tokens_per_thought": common.summarize([records[i]["tokens"] for i in which]) if which else None,
        "think_ms_per_thought": common.summarize([records[i]["think_ms"] for i in which]) if which else None,
        "plain_seconds": common.summarize([r["plain_s"] for r in records]),
        "think_seconds": common.summarize([r["think_s"] for r in records]),
        "ratio_seconds": common.summarize([r["think_s"] / r["plain_s"] for r in records]),
        "records": records,
    }
    out = common.run_dir("think")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    bars = [{"name": "median s / request", "a": results["plain_seconds"]["median"],
             "b": results["think_seconds"]["median"]}]
    common.paired_bars(bars, ["think off", "think on"], "seconds",
                       "Think when unsure: time per request (fixture, MLX)", out / "seconds.png")
    f = lambda s: f"{s['accuracy']:.3f} | {s['ece']:.3f} | {s['nll']:.3f}"  # noqa: E731
    lines = [
        "# Think when unsure on the fixture's MMLU questions",
        "",
        f"`make bench-think`: {len(rows)} MMLU rows (every {step}th of the assets' file) as System One",
        "choice questions of four options on the fixture's MLX server (`--prefix-cache-mb 0`, every",
        f"state read anew), each asked with thinking off and on (alternating order), factor {a.factor},",
        f"budget {a.budget} tokens. Machine: {results['machine']['cpus']} CPUs.",
        "",
        "| | n | accuracy | ECE | NLL |",
        "|---|---|---|---|---|",
        f"| think off, all | {len(rows)} | {f(results['plain'])} |",
        f"| think on, all | {len(rows)} | {f(results['think'])} |",
    ]
    if which:
        lines += [
            f"| think off, the {len(which)} that thought | {len(which)} | {f(results['thought_plain'])} |",
            f"| think on, the {len(which)} that thought | {len(which)} | {f(results['thought_think'])} |",
            "",
            f"Questions that thought: {len(which)} of {len(rows)}. Reasoning per question that thought:",
            f"median {results['tokens_per_thought']['median']} tokens "
            f"({results['tokens_per_thought']['min']} to {results['tokens_per_thought']['max']}), "
            f"median {results['think_ms_per_thought']['median']:.0f} ms.",
        ]
    lines += [
        "",
        f"Seconds per request, median (min to max): think off {results['plain_seconds']['median']:.2f} "
        f"({results['plain_seconds']['min']:.2f} to {results['plain_seconds']['max']:.2f}); think on "
        f"{results['think_seconds']['median']:.2f} ({results['think_seconds']['min']:.2f} to "
        f"{results['think_seconds']['max']:.2f}); the pair's ratio {results['ratio_seconds']['median']:.2f} "
        f"({results['ratio_seconds']['min']:.2f} to {results['ratio_seconds']['max']:.2f}).",
        "",
        "What the 135M fixture did, not a claim for the bases: compare the accuracies' difference with",
        f"its standard error (about {math.sqrt(0.25 * 0.75 / len(rows)):.3f} at this size).",
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
