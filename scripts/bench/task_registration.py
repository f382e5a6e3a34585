"""Benchmark: task registration on the engine next to serving.

Usage: python scripts/bench/task_registration.py [--examples 120] [--decisions 80]

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
Writes runs/<date>_task-registration/{summary.md,results.json}.
"""

import argparse
import http.client
import json
import statistics
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=120)
    ap.add_argument("--decisions", type=int, default=80)
    args = ap.parse_args()
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
