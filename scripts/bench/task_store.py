"""Record: the shared task store (`--task-store`) on moto_server's S3 API.

Usage: python scripts/bench/task_store.py [--changes 100] [--poll 0.5] [--tasks 12]

Starts moto_server (an S3 API, from the test venv) and decisio replicas of
the fixture's MLX model on one `s3://` store, and measures:

- **Propagation lag**: three replicas; one task is fitted on A and
  exported; then `--changes` changes are made on A, alternately an import
  of that task under a new id and name (a new version in the store, no
  fitting) and the removal of the last one, each at a random moment of the
  replicas' polls (after a pause of up to one poll). For each change, the time from
  A's answer to the change being visible on B and on C (`GET
  /v1/tasks/{id}` answers 200, or 404 after a removal), read every 5 ms.
- **Registration throughput** with 1, 2 and 3 replicas: `--tasks`
  registrations of 6 examples each, sent at once and spread round-robin
  over the replicas (a fresh store prefix each time); the time until every
  task is ready on every replica.
- **The cost of the poll on an idle store**: two replicas, one with the
  store and one without, idle for `--idle` seconds: the CPU seconds each
  process used, and the store reads the first made
  (`decisio_task_store_polls_total`).

Writes runs/<date>_task-store/{summary.md,results.json,lag.png}.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import threading
import time

import common


def request(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    c.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    r = c.getresponse()
    data = r.read()
    return r.status, (json.loads(data) if data else None)


class Moto:
    def __init__(self):
        self.port = common.free_port()
        self.proc = subprocess.Popen(
            [str(common.CACHE / "venv/bin/moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("PUT", "/decisio")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("moto_server did not start")
            time.sleep(0.1)

    def env(self):
        return {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
                "AWS_ALLOW_HTTP": "true"}


def replica(moto, prefix, poll, store=True):
    extra = ["--task-store", f"s3://decisio/{prefix}", "--task-store-poll", str(poll)] if store else []
    return common.start_decisio(extra=extra, env=dict(os.environ, **moto.env()))


def registration(name, n=6):
    examples = []
    for i in range(n):
        if i % 2 == 0:
            examples.append({"state": f"Ticket {i}: the parcel arrived broken; I want my money back.",
                             "label": "refund"})
        else:
            examples.append({"state": f"Ticket {i}: the parcel is a week late; where is it?",
                             "label": "delivery"})
    return {"name": name, "kind": "choice", "question": "What does the customer ask for?",
            "options": ["refund", "delivery"], "examples": examples, "holdout": 0.25, "seed": 1}


def wait_ready(port, names, limit=600):
    deadline = time.time() + limit
    while time.time() < deadline:
        _, listed = request(port, "GET", "/v1/tasks")
        ready = {t["name"] for t in listed["data"] if t["status"] == "ready"}
        if set(names) <= ready:
            return
        time.sleep(0.05)
    raise RuntimeError(f"not ready on :{port}: {names}")


def seen(port, path, status, limit=60):
    """Seconds until GET `path` answers `status`, read every 5 ms."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        if request(port, "GET", path)[0] == status:
            return time.perf_counter() - start
        time.sleep(0.005)
    raise RuntimeError(f"{path} never answered {status} on :{port}")


def propagation(moto, changes, poll):
    servers = [replica(moto, "lag", poll) for _ in range(3)]
    ports = [p for _, p in servers]
    status, t = request(ports[0], "POST", "/v1/tasks", registration("template"))
    assert status == 202, t
    wait_ready(ports[0], ["template"])
    _, export = request(ports[0], "GET", "/v1/tasks?full=1")
    template = next(e for e in export["tasks"] if e["record"]["spec"]["name"] == "template")
    applied, removed = [], []
    last = None
    for i in range(changes):
        # A change at a random moment of the replicas' polls: made right
        # after the last one was seen, it would always fall just after a
        # poll.
        time.sleep(random.uniform(0, poll))
        if i % 2 == 0:
            entry = json.loads(json.dumps(template))
            last = f"task-lag-{i:04d}"
            entry["record"]["id"] = last
            entry["record"]["spec"]["name"] = f"lag-{i}"
            body = dict(export, tasks=[entry])
            status, answer = request(ports[0], "POST", "/v1/tasks/import", body)
            assert status == 200, answer
            want, into = 200, applied
        else:
            status, answer = request(ports[0], "DELETE", f"/v1/tasks/{last}")
            assert status == 200, answer
            want, into = 404, removed
        # B and C read side by side, from the answer on A.
        out = [None, None]
        threads = [threading.Thread(target=lambda k=k: out.__setitem__(
            k, seen(ports[k + 1], f"/v1/tasks/{last}", want))) for k in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        into.extend(out)
    health = [request(p, "GET", "/health")[1]["task_store"] for p in ports]
    for proc, _ in servers:
        proc.kill()
    return {"applied_seconds": applied, "removed_seconds": removed, "health": health}


def throughput(moto, tasks, poll, replicas):
    servers = [replica(moto, f"throughput-{replicas}", poll) for _ in range(replicas)]
    ports = [p for _, p in servers]
    names = [f"t{replicas}-{i}" for i in range(tasks)]
    start = time.perf_counter()
    threads = [threading.Thread(target=request, args=(ports[i % replicas], "POST", "/v1/tasks",
                                                      registration(n)))
               for i, n in enumerate(names)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for p in ports:
        wait_ready(p, names)
    seconds = time.perf_counter() - start
    for proc, _ in servers:
        proc.kill()
    return {"replicas": replicas, "tasks": tasks, "seconds": seconds,
            "tasks_per_second": tasks / seconds}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def idle(moto, poll, seconds):
    shared, plain = replica(moto, "idle", poll), replica(moto, "idle", poll, store=False)
    time.sleep(2)
    polls = lambda: sum(float(l.rsplit(" ", 1)[1]) for l in common_metrics(shared[1])
                        if l.startswith("decisio_task_store_polls_total"))
    before = (cpu_seconds(shared[0].pid), cpu_seconds(plain[0].pid), polls())
    time.sleep(seconds)
    after = (cpu_seconds(shared[0].pid), cpu_seconds(plain[0].pid), polls())
    for proc, _ in (shared, plain):
        proc.kill()
    return {"seconds": seconds, "poll": poll,
            "cpu_seconds_with_store": after[0] - before[0],
            "cpu_seconds_without_store": after[1] - before[1],
            "reads": after[2] - before[2]}


def common_metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    return c.getresponse().read().decode().splitlines()


def pct(values, q):
    return common.nearest_rank(values, q)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=100)
    ap.add_argument("--poll", type=float, default=0.5)
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--idle", type=float, default=60.0)
    args = ap.parse_args()
    moto = Moto()
    try:
        lag = propagation(moto, args.changes, args.poll)
        runs = [throughput(moto, args.tasks, args.poll, k) for k in (1, 2, 3)]
        quiet = idle(moto, 5.0, args.idle)
    finally:
        moto.proc.kill()
    out = common.run_dir("task-store")
    results = {"machine": common.machine(), "poll_seconds": args.poll, "propagation": lag,
               "throughput": runs, "idle": quiet}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    a, r = lag["applied_seconds"], lag["removed_seconds"]
    rows = [{"name": name, "a": pct(a, q), "b": pct(r, q)}
            for name, q in (("median", 0.5), ("p90", 0.9), ("p99", 0.99))]
    common.paired_bars(rows, ["new version applied", "removal applied"], "seconds",
                       f"Propagation lag on two replicas (poll {args.poll} s)", out / "lag.png")
    lines = [
        "# The shared task store on moto_server's S3 API",
        "",
        f"`make bench-task-store`: decisio replicas of the fixture's MLX model on one `s3://` store "
        f"served by moto_server on 127.0.0.1, `--task-store-poll {args.poll}`. Machine: "
        f"{common.machine()['cpus']} CPUs; every replica and moto share them.",
        "",
        f"## Propagation lag ({args.changes} changes made on A, each read on B and C)",
        "",
        "| change | n | median s | p90 s | p99 s | max s |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in (("a new version (import)", a), ("a removal", r), ("both", a + r)):
        lines.append(f"| {name} | {len(v)} | {statistics.median(v):.3f} | {pct(v, 0.9):.3f} | "
                     f"{pct(v, 0.99):.3f} | {max(v):.3f} |")
    lines += [
        "",
        f"A change is applied at a replica's next poll: the lag is bounded by one poll ({args.poll} s, "
        "jittered by 10 %) plus the reads of the manifest and the object and the applying.",
        "",
        f"## Registration throughput ({args.tasks} registrations of 6 examples, sent at once)",
        "",
        "| replicas | seconds until all ready everywhere | registrations per second |",
        "|---|---|---|",
    ]
    for run in runs:
        lines.append(f"| {run['replicas']} | {run['seconds']:.1f} | {run['tasks_per_second']:.3f} |")
    lines += [
        "",
        "Each registration is fitted once, on the replica that took it; the replicas share these "
        f"{common.machine()['cpus']} CPUs, so more replicas add no compute here: the figures show "
        "what the store costs, not what more machines would give.",
        "",
        f"## The poll on an idle store ({quiet['seconds']:.0f} s, `--task-store-poll 5`)",
        "",
        f"- reads of the manifest: {quiet['reads']:.0f} (each an empty 304)",
        f"- CPU seconds of the replica with the store: {quiet['cpu_seconds_with_store']:.2f}; "
        f"without: {quiet['cpu_seconds_without_store']:.2f}",
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
