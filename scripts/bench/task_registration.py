"""Benchmark: task registration on the engine next to serving.

Usage: python scripts/bench/task_registration.py [--examples 120] [--decisions 80]
           [--only choice|intent] [--shots 10] [--draws 6] [--fit-per-label 20]
           [--holdout-per-label 4] [--pairs 4] [--block 48] [--fit-rows 10000]

On the fixture model, with MMLU questions as states (the question and its
four answers lettered, the task asking which letter is correct):
  (1) plain forward throughput: the registration's examples decided one by
      one through POST /v1/decide on an idle server (examples per second);
  (2) registration throughput: the same examples registered through
      POST /v1/tasks on an idle server (examples per second, from the
      task's own timing), and its ratio to (1);
  (3) decision latency (one question on a new state, through
      POST /v1/decide, one request after another) on an idle server, and
      while a registration of the same examples runs: p50 and p99.
Intent heads (`--only intent`, or after the above): an intent task over
MMLU's 57 subjects ("which subject is this question from?"), per subject
`fit-per-label + holdout-per-label` questions (draws sample `shots` of the
`fit-per-label`; with `fit-per-label == shots` every draw is the same set):
  (4) plain forward against registration scoring on the same examples, in
      interleaved blocks (A, B, A, B, ...; `pairs` of each, `block`
      examples each): A decides each example through POST /v1/decide
      naming a ready intent task with the same question (the same prompt
      and hidden state the registration reads), B registers the block as
      an intent task (its scoring rate); medians of the per-block rates and
      their ratio;
  (5) the head's holdout accuracy and ECE over `draws` draws of `shots`
      examples per label (mean and standard deviation), and the served
      head's (fitted on the fit split) figures before and after its
      temperature, and the registration's scoring rate over all examples;
  (6) the head's fit time on `fit-rows` (10,000) synthetic rows of the fixture's width
      (576) and 57 labels (examples/task_figures.rs), and the served head's
      reliability diagram as a PNG (plotters).
Writes runs/<date>_task-registration/{summary.md,results.json} (choice) and
{intent.md,intent.json,intent-task.json,reliability.png} (intent).
"""

import argparse
import http.client
import json
import statistics
import subprocess
import tempfile
import time

import common

QUESTION = "Which answer to this question is correct?"
LETTERS = ["A", "B", "C", "D"]


def example(row):
    return {"state": common.question_text(row), "label": row["correct_answer"]}


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", path)
    r = c.getresponse()
    return json.loads(r.read())


def decide(port, state):
    dt, body = common.post(port, "/v1/decide", {
        "state": state, "questions": [{"text": QUESTION, "options": LETTERS}]})
    return dt


def percentile(values, q):
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def latency(values):
    return {"p50_ms": 1000 * percentile(values, 0.5), "p99_ms": 1000 * percentile(values, 0.99),
            "max_ms": 1000 * max(values), "mean_ms": 1000 * statistics.mean(values),
            "n": len(values)}


def register(port, name, examples):
    body = {"name": name, "question": QUESTION, "options": LETTERS, "examples": examples,
            "holdout": 0.2, "seed": 0}
    data = json.dumps(body).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/tasks", data, {"Content-Type": "application/json"})
    r = c.getresponse()
    reply = json.loads(r.read())
    if r.status != 202:
        raise RuntimeError(f"registration refused: {reply}")
    return reply["id"]


SUBJECT_QUESTION = "Which subject is this question from?"
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def subject_examples(per):
    """The first `per` questions of each MMLU subject, labelled with it."""
    labels, counts, examples = [], {}, []
    with open(common.ASSETS / "mmlu.jsonl") as f:
        for line in f:
            row = json.loads(line)
            t = row["topic"]
            if t not in counts:
                labels.append(t)
                counts[t] = 0
            if counts[t] < per:
                counts[t] += 1
                examples.append({"state": row["question"], "label": t})
    return labels, examples


def figures_example(*args):
    out = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "--example", "task_figures", "--", *args],
        cwd=common.ROOT, check=True, capture_output=True, text=True)
    return out.stdout


def post_task(port, body):
    data = json.dumps(body).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/tasks", data, {"Content-Type": "application/json"})
    r = c.getresponse()
    reply = json.loads(r.read())
    if r.status != 202:
        raise RuntimeError(f"registration refused: {reply}")
    return reply["id"]


def wait_ready(port, tid, poll):
    while True:
        task = get(port, f"/v1/tasks/{tid}")
        if task["status"] not in ("queued", "running"):
            break
        time.sleep(poll)
    if task["status"] != "ready":
        raise RuntimeError(f"the registration ended {task['status']}: {task}")
    return task


def intent_body(name, examples, holdout, **extra):
    labels = list(dict.fromkeys(e["label"] for e in examples))
    return {"name": name, "kind": "intent", "question": SUBJECT_QUESTION, "labels": labels,
            "examples": examples, "holdout": holdout, "seed": 0, "head": {"layer": -1},
            **extra}


def throughput(port, examples, pairs, size):
    """Plain forward (A) and registration scoring (B) on the same examples,
    in interleaved blocks A, B, A, B, ...: `pairs` blocks of `size` examples
    each, spread over the subjects. A decides each example through
    POST /v1/decide naming a ready intent task with the same question, so
    the prompt and the hidden state read are the registration's; B registers
    the block as an intent task and reads its scoring rate (progress.rate),
    waiting for it to be ready before the next block."""
    probe = [e for e in examples if e["label"] == examples[0]["label"]][:2] + \
        [e for e in examples if e["label"] != examples[0]["label"]][:2]
    wait_ready(port, post_task(port, intent_body("probe", probe, 0.5)), 0.2)
    stride = len(examples) // size
    if pairs > stride:
        raise RuntimeError(f"{pairs} blocks of {size} examples do not fit {len(examples)}")
    blocks = []
    for b in range(pairs):
        block = [examples[j] for j in range(b, len(examples), stride)][:size]
        t0 = time.perf_counter()
        for e in block:
            common.post(port, "/v1/decide", {"state": e["state"],
                                             "questions": [{"task": "probe"}]})
        plain = len(block) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        task = wait_ready(port, post_task(port, intent_body(f"block-{b}", block, 0.2)), 0.2)
        blocks.append({"examples": len(block), "plain_forward_examples_per_second": plain,
                       "registration_scoring_examples_per_second": task["progress"]["rate"],
                       "registration_wall_seconds": time.perf_counter() - t0})
    a = statistics.median(x["plain_forward_examples_per_second"] for x in blocks)
    b = statistics.median(x["registration_scoring_examples_per_second"] for x in blocks)
    return {"pairs": pairs, "block_examples": size, "blocks": blocks,
            "plain_forward_median": a, "registration_scoring_median": b, "ratio": b / a}


def intent(args):
    per = args.fit_per_label + args.holdout_per_label
    labels, examples = subject_examples(per)
    holdout = args.holdout_per_label / per
    out = common.run_dir("task-registration")
    state_dir = tempfile.mkdtemp(prefix="decisio-bench-intent-")
    proc, port = common.start_decisio(extra=("--state-dir", state_dir))
    try:
        # (4) plain forward against registration scoring, interleaved.
        tp = throughput(port, examples, args.pairs, args.block)
        # (5) the registration of all examples, with the draws.
        body = intent_body("mmlu-subject", examples, holdout, draws=args.draws,
                           shots=args.shots)
        assert body["labels"] == labels
        t0 = time.perf_counter()
        task = wait_ready(port, post_task(port, body), 1.0)
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait()
    (out / "intent-task.json").write_text(json.dumps(task, indent=2) + "\n")
    figures_example("reliability", str(out / "intent-task.json"), str(out / "reliability.png"),
                    FONT)
    fit = json.loads(figures_example("fit-time", str(args.fit_rows), "57", "576"))
    r = task["result"]
    d = r["draws"]
    reg_rate = task["progress"]["rate"]
    command = ("python scripts/bench/task_registration.py --only intent "
               f"--fit-per-label {args.fit_per_label} --holdout-per-label "
               f"{args.holdout_per_label} --shots {args.shots} --draws {args.draws} "
               f"--pairs {args.pairs} --block {args.block} --fit-rows {args.fit_rows}")
    calibration = r["head"]["calibration_indices"]
    results = {
        "examples": len(examples), "labels": len(labels), "shots": args.shots,
        "fit_per_label": args.fit_per_label,
        "draws": args.draws, "holdout_per_label": args.holdout_per_label,
        "throughput": tp,
        "registration_all_examples_scoring_examples_per_second": reg_rate,
        "registration_all_in_seconds": r["seconds"], "registration_wall_seconds": wall,
        "draws_report": d,
        "served_head": {"head": r["head"], "fit_examples": r["fit_examples"],
                        "holdout_examples": r["holdout_examples"],
                        "before": {k: r["before"][k] for k in ("accuracy", "nll", "ece")},
                        "after": {k: r["after"][k] for k in ("accuracy", "nll", "ece")},
                        "temperature": r["temperature"]},
        "head_fit_time": fit,
        "machine": common.machine(),
        "command": command,
    }
    (out / "intent.json").write_text(json.dumps(results, indent=2) + "\n")
    head_n = r["head"]["head_examples"]
    summary = f"""# Intent heads: MMLU subjects

decisio on the fixture model (SmolLM2-135M-Instruct, MLX CPU build), one
server on 127.0.0.1. An intent task over MMLU's {len(labels)} subjects, the
question "{SUBJECT_QUESTION}" on each MMLU question (the question text
alone as the state): {per} questions per subject, {args.holdout_per_label}
per subject held out ({r['holdout_examples']} holdout examples), the rest
({r['fit_examples']}) the fit split. Features: the final norm's output at the
answer position (576 wide). Chance is 1/57 = 0.018.

Each head's fit split is split again, per label and seeded: the head is
fitted (C by 3-fold cross-validation, then the final fit) on about 80% of
it, and its temperature on that head's logits of the other 20% (the served
head: {head_n} examples for the head, {len(calibration)} for the temperature,
listed in `intent-task.json` as `result.head.calibration_indices`; a draw
of {args.shots} shots per label: {d['per_draw'][0]['fit_examples'] - d['per_draw'][0]['calibration_examples']} and {d['per_draw'][0]['calibration_examples']}).

| | figure |
|---|---|
| **head over {args.draws} draws of {args.shots} shots per label: holdout accuracy** | **{d['accuracy_mean']:.4f} ± {d['accuracy_sd']:.4f}** (mean ± sd) |
| **... holdout ECE (after each draw's temperature)** | **{d['ece_mean']:.4f} ± {d['ece_sd']:.4f}** |
| served head (C = {r['head']['c']}): accuracy | {r['after']['accuracy']:.4f} |
| served head: ECE before (T = 1) / after (T = {r['temperature']:.3f}) | {r['before']['ece']:.4f} / {r['after']['ece']:.4f} |
| served head: NLL before / after | {r['before']['nll']:.4f} / {r['after']['nll']:.4f} |
| plain forward: /v1/decide naming an intent task with the same question (median of {args.pairs} blocks of {args.block} examples) | {tp['plain_forward_median']:.3f} examples/s |
| intent registration scoring, the same blocks (median) | {tp['registration_scoring_median']:.3f} examples/s |
| **registration / plain forward** | **{tp['ratio']:.3f}** (target at least 0.9) |
| intent registration scoring, all {len(examples)} examples | {reg_rate:.3f} examples/s |
| registration all in (scoring, served head, {args.draws} draw heads) | {r['seconds']:.1f} s |
| head fit, {args.fit_rows:,} synthetic rows x 57 labels x 576 ({fit['fits']} L-BFGS fits: {len(fit['cross_validation'])} C x 3 folds + final, on {fit['head_examples']} rows; T on {fit['calibration_examples']}) | {fit['fit_seconds']:.1f} s |
| head applied to one hidden state | {fit['apply_microseconds_per_example']:.0f} µs |

Throughput blocks, in the order run (plain forward, then registration, of
the same examples):

| block | examples | plain forward (ex/s) | registration scoring (ex/s) | ratio |
|---|---|---|---|---|
""" + "".join(f"| {i} | {b['examples']} | {b['plain_forward_examples_per_second']:.3f} | "
              f"{b['registration_scoring_examples_per_second']:.3f} | "
              f"{b['registration_scoring_examples_per_second'] / b['plain_forward_examples_per_second']:.3f} |\n"
              for i, b in enumerate(tp["blocks"])) + """
Per draw (seed, fit examples of which calibration, C, T, accuracy, ECE):

| seed | fit (calibration) | C | T | accuracy | ECE |
|---|---|---|---|---|---|
""" + "".join(f"| {p['seed']} | {p['fit_examples']} ({p['calibration_examples']}) | {p['c']} | "
              f"{p['temperature']:.3f} | {p['accuracy']:.4f} | {p['ece']:.4f} |\n"
              for p in d["per_draw"]) + f"""
`reliability.png`: the served head's holdout reliability diagram, before and
after its temperature (drawn by `examples/task_figures.rs` with plotters).

Machine: {results['machine']['platform']}, {results['machine']['cpus']} CPUs, shared with other
work while it ran. Command: `{command}`.
"""
    (out / "intent.md").write_text(summary)
    if args.only == "intent":
        (out / "summary.md").write_text(summary)
    print(summary)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=120)
    ap.add_argument("--decisions", type=int, default=80)
    ap.add_argument("--only", choices=("choice", "intent"))
    ap.add_argument("--shots", type=int, default=10)
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--holdout-per-label", type=int, default=4)
    ap.add_argument("--fit-per-label", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--block", type=int, default=48)
    ap.add_argument("--fit-rows", type=int, default=10000)
    args = ap.parse_args()
    if args.only != "intent":
        choice(args)
    if args.only != "choice":
        intent(args)


def choice(args):
    rows = common.mmlu_rows(4000)
    examples = [example(r) for r in rows[: 4000 : 4000 // args.examples][: args.examples]]
    # Decision states: other MMLU questions, each new to the server.
    probes = [common.question_text(r) for r in rows[1::7]]

    state_dir = tempfile.mkdtemp(prefix="decisio-bench-tasks-")
    proc, port = common.start_decisio(extra=("--state-dir", state_dir))
    try:
        # (1) the examples decided one by one.
        t0 = time.perf_counter()
        for e in examples:
            decide(port, e["state"])
        plain_seconds = time.perf_counter() - t0
        plain_rate = len(examples) / plain_seconds

        # (3a) decision latency on the idle server.
        idle = [decide(port, s) for s in probes[: args.decisions]]

        # (2) + (3b): a registration, decisions one after another meanwhile.
        t0 = time.perf_counter()
        tid = register(port, "bench", examples)
        during = []
        i = args.decisions
        while True:
            task = get(port, f"/v1/tasks/{tid}")
            if task["status"] not in ("queued", "running"):
                break
            during.append(decide(port, probes[i % len(probes)]))
            i += 1
        wall = time.perf_counter() - t0
        if task["status"] != "ready":
            raise RuntimeError(f"the registration ended {task['status']}: {task}")
        # The registration alone, on the idle server.
        tid2 = register(port, "bench-alone", examples)
        while True:
            alone = get(port, f"/v1/tasks/{tid2}")
            if alone["status"] not in ("queued", "running"):
                break
            time.sleep(0.2)
        reg_rate = len(examples) / alone["result"]["seconds"]
    finally:
        proc.terminate()
        proc.wait()

    results = {
        "examples": len(examples),
        "plain_forward": {"seconds": plain_seconds, "examples_per_second": plain_rate},
        "registration_alone": {"seconds": alone["result"]["seconds"],
                               "examples_per_second": reg_rate,
                               "ratio_to_plain": reg_rate / plain_rate},
        "registration_with_decisions": {"seconds": task["result"]["seconds"],
                                        "wall_seconds": wall,
                                        "examples_per_second":
                                            len(examples) / task["result"]["seconds"]},
        "decision_latency_idle": latency(idle),
        "decision_latency_during_registration": latency(during),
        "fitted_temperature": alone["result"]["temperature"],
        "holdout": {k: {m: alone["result"][k][m] for m in ("accuracy", "nll", "ece")}
                    for k in ("before", "after")},
        "machine": common.machine(),
        "command": "python scripts/bench/task_registration.py",
    }
    out = common.run_dir("task-registration")
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    li, ld = results["decision_latency_idle"], results["decision_latency_during_registration"]
    summary = f"""# Task registration next to serving

decisio on the fixture model (SmolLM2-135M-Instruct, MLX CPU build), one
server on 127.0.0.1. {len(examples)} MMLU questions as states (the question
and its four answers lettered); the task asks which letter is correct.
Decisions: one question on a state new to the server, one request after
another.

| | figure |
|---|---|
| plain forward (the examples through /v1/decide, idle server) | {plain_rate:.2f} examples/s |
| registration alone (idle server) | {reg_rate:.2f} examples/s |
| **registration / plain forward** | **{reg_rate / plain_rate:.3f}** (target at least 0.9) |
| registration while decisions run | {results['registration_with_decisions']['examples_per_second']:.2f} examples/s |

Decision latency (client wall time):

| | p50 (ms) | p99 (ms) | max (ms) | n |
|---|---|---|---|---|
| idle server | {li['p50_ms']:.1f} | {li['p99_ms']:.1f} | {li['max_ms']:.1f} | {li['n']} |
| during a registration | {ld['p50_ms']:.1f} | {ld['p99_ms']:.1f} | {ld['max_ms']:.1f} | {ld['n']} |

A registration runs one engine job per example, so a decision waits for at
most the example being scored when it arrives, not for the registration.

Fitted temperature {results['fitted_temperature']:.4f}; holdout ECE
{results['holdout']['before']['ece']:.4f} before, {results['holdout']['after']['ece']:.4f} after
(accuracy {results['holdout']['before']['accuracy']:.4f}; the fixture answers MMLU near chance).

Machine: {results['machine']['platform']}, {results['machine']['cpus']} CPUs. Command:
`python scripts/bench/task_registration.py`.
"""
    (out / "summary.md").write_text(summary)
    print(summary)


if __name__ == "__main__":
    main()
