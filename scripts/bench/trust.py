"""Run record: certified answers and prediction sets on the fixture, over
repeated draws of examples never used to fit.

Usage: python scripts/bench/trust.py [--per-subject 60] [--answers 300] [--pool 400]
           [--draws 500] [--server URL --out DIR]

One decisio server on the fixture model, two tasks:
  - `subjects`: an intent task (a head on the hidden state) over ten MMLU
    subjects, "Which subject is this question from?", the state the
    question; half of each subject's `per-subject` questions registered,
    the other half the pool;
  - `answer`: an MMLU choice task ("Which answer to this question is
    correct?", options A to D, the state the question with its answers
    lettered), `answers` questions registered (4 rotations, the letter-bias
    removal), `pool` others the pool.
Each task's registration reports its holdout accuracy and ECE before and
after (and, for `answer`, the letter bias and the per-letter answer rates).
Every pool example is then asked through POST /v1/decide naming the task
(its answers as served), and `examples/trust_draws.rs` draws the pool
`draws` times into a calibration half and a test half: certified answers
(decisio's Learn-then-Test, delta 0.1) on the first, the share certified,
the error among them and whether it stayed at most alpha on the second;
prediction sets (split conformal, LAC and APS) calibrated on the first,
their coverage and size on the second.
Writes runs/<date>_trust/{summary.md,results.json,trust.json,*.png}. With
`--server URL --out DIR` it asks a server already running (registering the
two tasks there) and writes into DIR, a suite run record's folder: its
`trust.json` is then gated by `decisio gate` (docs/gates.md).
"""

import argparse
import json
import pathlib
import subprocess
import time

import common
import letter_bias

SUBJECT_QUESTION = "Which subject is this question from?"
SUBJECTS = ["professional law", "moral scenarios", "elementary mathematics",
            "high school biology", "high school macroeconomics", "prehistory", "nutrition",
            "high school chemistry", "world religions", "astronomy"]
ALPHAS = [0.05, 0.1, 0.2, 0.3, 0.5, 0.7]
COVERAGES = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
DELTA = 0.1


def register(port, body):
    task = letter_bias.call(port, "POST", "/v1/tasks", body)
    while task["status"] in ("queued", "running"):
        time.sleep(2)
        task = letter_bias.call(port, "GET", f"/v1/tasks/{task['id']}")
    if task["status"] != "ready":
        raise RuntimeError(f"{body['name']}: {task.get('error')}")
    return task


def served(port, name, examples, keys):
    """Each example's probabilities as the task serves them, in `keys`' order."""
    out = []
    for e in examples:
        reply = letter_bias.call(port, "POST", "/v1/decide", {
            "state": e["state"], "questions": [{"task": name}]})
        p = reply["answers"][0]["probabilities"]
        out.append([p[k] for k in keys])
    return out


def subject_rows(per):
    per_subject = {s: [] for s in SUBJECTS}
    with open(common.ASSETS / "mmlu.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r["topic"] in per_subject and len(per_subject[r["topic"]]) < per:
                per_subject[r["topic"]].append({"state": r["question"], "label": r["topic"]})
    fit = [e for group in per_subject.values() for e in group[: per // 2]]
    pool = [e for group in per_subject.values() for e in group[per // 2:]]
    return fit, pool


def answer_rows(n, pool):
    rows = common.mmlu_rows(5 * (n + pool))[::5]
    ex = [{"state": common.question_text(r), "label": r["correct_answer"]} for r in rows]
    return ex[:n], ex[n:n + pool]


def fmt(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}"


def summary(args, tasks, draws):
    lines = [
        "# Certified answers and prediction sets on the fixture",
        "",
        f"decisio on the fixture model (SmolLM2-135M-Instruct, 4-bit, MLX CPU build), one server "
        f"on 127.0.0.1, {common.machine()['cpus']} CPUs. Command: `make bench-trust` (`python "
        f"scripts/bench/trust.py --per-subject {args.per_subject} --answers {args.answers} "
        f"--pool {args.pool} --draws {args.draws}`). Each task is registered on its own "
        "examples; its pool (examples never used to fit it) is answered through "
        "`POST /v1/decide` naming the task, and drawn "
        f"{args.draws} times into a calibration half and a test half "
        "(`examples/trust_draws.rs`, decisio's own certification and conformal code).",
        "",
        "## The tasks as registered (their holdout)",
        "",
        "| task | kind | examples | holdout accuracy before / after | ECE before / after | "
        "T | letter bias kept |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, t in tasks.items():
        r = t["result"]
        kept = (r.get("debias") or {}).get("kept", "—") if "debias" in r else "— (no letters)"
        lines.append(
            f"| {name} | {t['kind']} | {t['examples']} | {r['before']['accuracy']:.3f} / "
            f"{r['after']['accuracy']:.3f} | {r['before']['ece']:.3f} / {r['after']['ece']:.3f} "
            f"| {r['temperature']:.3f} | {kept} |")
    rates = tasks["answer"]["result"]["letter_rates"]
    lines += [
        "",
        "`answer`'s held-out answers at each letter (A, B, C, D): labels "
        + ", ".join(f"{v:.3f}" for v in rates["labels"]) + "; before "
        + ", ".join(f"{v:.3f}" for v in rates["before"]) + "; after "
        + ", ".join(f"{v:.3f}" for v in rates["after"]) + ". Reason: "
        + tasks["answer"]["result"]["debias"]["reason"] + ".",
        "",
    ]
    for d in draws["tasks"]:
        name = d["name"]
        lines += [
            f"## `{name}`: {d['examples']} pool examples (accuracy {d['accuracy']:.3f}), "
            f"{d['calibration']} to calibrate, {d['test']} to test, per draw",
            "",
            f"Certified answers (delta {DELTA}; `trust-certified-{name}.png`): the promise is an "
            "error rate at most alpha among certified answers with probability at least "
            f"{1 - DELTA:.2f}; a draw *held* when the test half's error among certified answers "
            "was at most alpha (a draw certifying nothing holds).",
            "",
            "| alpha | certified share (mean) | error among certified (mean) | (max) | "
            "draws where it held | draws certifying nothing |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for c in d["certified"]:
            lines.append(
                f"| {c['alpha']} | {fmt(c['certified_share_mean'])} | "
                f"{fmt(c['error_among_certified_mean'])} | {fmt(c['error_among_certified_max'])} "
                f"| {fmt(c['promise_held'])} | {fmt(c['nothing_certified'])} |")
        lines += [
            "",
            f"Prediction sets (`trust-coverage-{name}.png`, LAC): mean coverage on the test "
            "halves against the promised level (sd over draws), and the mean set size.",
            "",
            "| score | promised 1 − alpha | coverage (mean) | sd | mean size |",
            "|---|---:|---:|---:|---:|",
        ]
        for c in d["coverage"]:
            lines.append(
                f"| {c['score']} | {c['level']} | {fmt(c['coverage_mean'])} | "
                f"{fmt(c['coverage_sd'])} | {fmt(c['size_mean'], 2)} |")
        lines.append("")
    lines.append("`reliability-<task>.png`: each task's holdout reliability before and after. "
                 "`results.json`: the tasks as registered and the pools' answers; `trust.json`: "
                 "every figure above (the record `decisio gate` gates).\n")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-subject", type=int, default=60)
    ap.add_argument("--answers", type=int, default=300)
    ap.add_argument("--pool", type=int, default=400)
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--server", help="a running server's URL, http://127.0.0.1:PORT")
    ap.add_argument("--out", help="the folder to write into (with --server)")
    args = ap.parse_args()
    subjects_fit, subjects_pool = subject_rows(args.per_subject)
    answer_fit, answer_pool = answer_rows(args.answers, args.pool)
    if args.server:
        proc, port = None, int(args.server.rsplit(":", 1)[1].strip("/"))
    else:
        proc, port = common.start_decisio()
    try:
        tasks = {
            "subjects": register(port, {
                "name": "subjects", "kind": "intent", "question": SUBJECT_QUESTION,
                "labels": SUBJECTS, "examples": subjects_fit, "holdout": 0.2, "seed": 0}),
            "answer": register(port, {
                "name": "answer", "question": letter_bias.QUESTION,
                "options": letter_bias.LETTERS, "examples": answer_fit, "holdout": 0.2,
                "seed": 0}),
        }
        pools = [
            ("subjects", subjects_pool, SUBJECTS),
            ("answer", answer_pool, letter_bias.LETTERS),
        ]
        read = []
        for name, pool, keys in pools:
            read.append({"name": name, "probabilities": served(port, name, pool, keys),
                         "labels": [keys.index(e["label"]) for e in pool]})
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
    out = pathlib.Path(args.out) if args.out else common.run_dir("trust")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        "machine": common.machine(), "args": vars(args), "tasks": tasks, "pools": read},
        indent=2))
    spec = {"pools": read, "spec": {"alphas": ALPHAS, "delta": DELTA, "coverages": COVERAGES,
                                    "draws": args.draws, "seed": 1}}
    (out / "pools.json").write_text(json.dumps(spec))
    bin_dir = common.DECISIO.parent / "examples"
    subprocess.run([str(bin_dir / "trust_draws"), str(out / "pools.json"),
                    str(out / "trust.json"), str(out / "trust")], check=True)
    (out / "pools.json").unlink()
    for name, t in tasks.items():
        (out / f"task-{name}.json").write_text(json.dumps(t, indent=2))
        subprocess.run([str(bin_dir / "task_figures"), "reliability",
                        str(out / f"task-{name}.json"), str(out / f"reliability-{name}.png"),
                        letter_bias.FONT], check=True)
        (out / f"task-{name}.json").unlink()
    draws = json.loads((out / "trust.json").read_text())
    (out / "summary.md").write_text(summary(args, tasks, draws))
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
