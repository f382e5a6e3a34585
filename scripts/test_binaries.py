"""Runs decisio's Rust test binaries side by side, as `cargo test` would run
them one after another.

Usage: python3 scripts/test_binaries.py [-j JOBS] [--times FILE] [--json FILE] [FILTER ...]

Builds every test target (`cargo test --release --locked --no-run`), then
runs the binaries JOBS at a time (default 3 on 2 CPUs: most test time is a
server starting, a registration or an upstream answering, not arithmetic),
the longest first by the durations of the last run kept in FILE
(`--times`, default `$CARGO_TARGET_DIR/test-times.json`; on a machine
without one, those of `scripts/test-times.json`, committed from a CI run). Each binary runs
in the package root with the environment cargo gives tests, its output
kept in a log that is printed whole when it fails and summed up by its
closing `test result:` line when it passes. FILTER arguments are passed to
every binary (as `cargo test -- FILTER` would).

Ends with the totals and each binary's wall time; exits non-zero when a
binary failed, crashed, or ran no test at all.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = re.compile(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")
# libtest's per-test times (`--report-time`, asked for below).
TEST_TIME = re.compile(r"^test (\S+) \.\.\. (ok|FAILED) <([\d.]+)s>", re.M)


def build():
    """Compiles the test targets; returns [(name, executable)]."""
    out = subprocess.run(
        ["cargo", "test", "--release", "--locked", "--no-run", "--message-format=json-render-diagnostics"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"error: building the tests failed ({out.returncode})")
    found = []
    for line in out.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = target["kind"][0]
        name = target["name"] if kind == "test" else f"{kind}:{target['name']}"
        found.append((name, msg["executable"]))
    return found


def env():
    e = dict(os.environ)
    e.update({
        "CARGO_MANIFEST_DIR": str(ROOT),
        "CARGO_PKG_NAME": "decisio",
        "RUST_BACKTRACE": e.get("RUST_BACKTRACE", "1"),
        # The binaries run JOBS at a time on few cores, each with servers
        # of its own: OpenBLAS's threads, which spin while they wait for
        # the next product, would take turns from the other processes. One
        # BLAS thread a process changes no bit (OpenBLAS splits a product
        # by rows and columns, never along its inner side); `systemone`
        # alone took 65.5 s and 112.6 s of CPU with it against 77.1 s and
        # 143.8 s without. Set it to run them otherwise.
        "OPENBLAS_NUM_THREADS": e.get("OPENBLAS_NUM_THREADS", "1"),
        # Lets the stable test harness take `-Z unstable-options
        # --report-time` (each test's time); read by the harness at run
        # time only, it changes nothing that was compiled.
        "RUSTC_BOOTSTRAP": "1",
    })
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=max(2, (os.cpu_count() or 1) + 1))
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    ap.add_argument("--times", type=Path, default=target_dir / "test-times.json")
    ap.add_argument("--json", type=Path, help="write each binary's figures here")
    ap.add_argument("filters", nargs="*")
    a = ap.parse_args()

    started = time.time()
    binaries = build()
    build_s = time.time() - started
    print(f"[tests] built {len(binaries)} test binaries in {build_s:.0f} s; running {a.jobs} at a time",
          flush=True)
    # The last run's durations here, else those committed (a run on a
    # fresh machine), so that the longest binaries start first.
    previous = {}
    for times in (a.times, ROOT / "scripts/test-times.json"):
        try:
            previous = json.loads(times.read_text())
            break
        except (OSError, ValueError):
            continue
    binaries.sort(key=lambda b: -previous.get(b[0], 1e9))
    logs = Path(tempfile.mkdtemp(prefix="decisio-tests-"))
    lock = threading.Lock()

    def run(binary):
        name, exe = binary
        log = logs / f"{name.replace(':', '_')}.log"
        t0 = time.time()
        with open(log, "w") as f:
            child = subprocess.Popen([exe, "-Z", "unstable-options", "--report-time", *a.filters],
                                     cwd=ROOT, env=env(), stdout=f,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            # wait4: the binary's own CPU time with that of the servers it
            # started and reaped (user and system).
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = code = os.waitstatus_to_exitcode(status)
        seconds = time.time() - t0
        cpu = usage.ru_utime + usage.ru_stime
        text = log.read_text(errors="replace")
        counts = [0, 0, 0]
        for m in RESULT.finditer(text):
            counts = [c + int(m.group(i)) for c, i in zip(counts, (2, 3, 4))]
        ok = code == 0
        tests = sorted(((f"{name}::{m.group(1)}", float(m.group(3)))
                        for m in TEST_TIME.finditer(text)), key=lambda t: -t[1])
        with lock:
            if ok:
                line = RESULT.search(text)
                print(f"[tests] {name}: {line.group(0) if line else 'no result line'} "
                      f"({seconds:.1f} s)", flush=True)
            else:
                print(f"[tests] {name} FAILED (exit {code}, {seconds:.1f} s); its output:\n{text}",
                      flush=True)
        return {"name": name, "seconds": round(seconds, 1), "cpu_s": round(cpu, 1), "exit": code,
                "passed": counts[0],
                "failed": counts[1], "ignored": counts[2],
                "tests": [{"name": t, "seconds": sec} for t, sec in tests]}

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(run, binaries))
    wall = time.time() - started

    passed = sum(r["passed"] for r in results)
    failed = sum(r["failed"] for r in results)
    ignored = sum(r["ignored"] for r in results)
    bad = [r for r in results if r["exit"] != 0]
    print("\n[tests] wall time and CPU time (user and system, with the servers it started)"
          " of each binary (s), longest first:")
    for r in sorted(results, key=lambda r: -r["seconds"]):
        status = "ok" if r["exit"] == 0 else f"FAILED ({r['exit']})"
        print(f"  {r['seconds']:7.1f}  {r['cpu_s']:7.1f} cpu  {r['name']:<28} {r['passed']:>4} passed  {status}")
    slowest = sorted((t for r in results for t in r["tests"]), key=lambda t: -t["seconds"])[:15]
    print("[tests] the slowest tests (s, each on a machine shared with the others):")
    for t in slowest:
        print(f"  {t['seconds']:7.1f}  {t['name']}")
    print(f"[tests] build {build_s:.0f} s, run {wall - build_s:.0f} s, {len(results)} binaries, "
          f"{sum(r['cpu_s'] for r in results):.0f} s of CPU")
    if not a.filters:
        a.times.parent.mkdir(parents=True, exist_ok=True)
        a.times.write_text(json.dumps({r["name"]: r["seconds"] for r in results}, indent=1))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"build_s": round(build_s, 1), "run_s": round(wall - build_s, 1),
                                      "jobs": a.jobs, "binaries": results}, indent=1))
    # The plain closing line: every passed and failed test of every binary.
    print(f"rust: {passed} passed, {failed + len([r for r in bad if r['failed'] == 0])} failed, "
          f"{ignored} skipped")
    if bad:
        sys.exit(1)
    if passed == 0:
        sys.exit("error: no test ran")


if __name__ == "__main__":
    main()
