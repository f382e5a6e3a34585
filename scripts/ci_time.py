"""The run record of CI's time: `.ci/run` on a fresh clone, on a brand-new
set-up and on a cached one, stage by stage.

Usage: python3 scripts/ci_time.py [--rev REV] [--modes new cached] [--out DIR] [--label NAME]

For each revision, clones the repository afresh (as CI does) into a
temporary folder and runs its test command twice:

- `new`: with an empty `DECISIO_CACHE` (MLX's CPU wheel, mlx-c, the
  assets, the Python venv, the fixture's conversion, the build folder and
  the reference figures all made anew). What a brand-new machine has to
  install beyond that (Debian's packages, bindgen-cli, crates in cargo's
  download cache) is already on this machine and is not counted: the
  record says how long it took here, once.
- `cached`: a second fresh clone with the cache the first run left, as
  CI on a machine that ran it before.

A revision whose `make test` times its own stages (scripts/test.sh) is
run as `.ci/run` with `DECISIO_STAGE_TIMES`; an older one is run stage by
stage through its Makefile (setup, reference, the Rust tests, e2e), which
is what its `make test` did. Writes `results.json` (every stage's seconds,
the Rust binaries' own times where recorded) into DIR, default
`runs/<today>_ci-time/`, merging with what is there, so revisions can be
recorded one after another; `summary.md` is written from it by
scripts/ci_time_summary.py.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sh(args, **kw):
    return subprocess.run(args, check=True, text=True, **kw)


def portable(line, env, cwd):
    """A log line with this machine's folders named as the run knew them:
    the cache as `$DECISIO_CACHE`, the clone as `$CLONE`, the home as `~`."""
    for path, name in ((env.get("DECISIO_CACHE"), "$DECISIO_CACHE"), (str(cwd), "$CLONE"),
                       (str(Path.home()), "~")):
        if path:
            line = line.replace(path, name)
    return line


def timed(cmd, cwd, env, log):
    """Runs `cmd`, its output into `log` with each line's time since the
    start (so the log shows where the time went); (seconds, exit code)."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                             errors="replace")
        for line in p.stdout:
            f.write(f"[{time.time() - t0:7.1f}s] {portable(line, env, cwd)}")
            f.flush()
        code = p.wait()
    return round(time.time() - t0, 1), code


def run_once(rev, cache, work, log):
    """One fresh clone of `rev` and its test command; the stages' times."""
    clone = work / f"clone-{int(time.time() * 1000)}"
    sh(["git", "clone", "--quiet", "--no-local", str(ROOT), str(clone)])
    sh(["git", "-C", str(clone), "checkout", "--quiet", rev])
    env = {k: v for k, v in os.environ.items()
           if k not in ("CARGO_TARGET_DIR", "DECISIO_REFERENCE_DIR", "DECISIO_MODEL",
                        "DECISIO_ASSETS", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env.update({"DECISIO_CACHE": str(cache), "CI": "true"})
    stages_file = work / "stages.json"
    stages_file.unlink(missing_ok=True)
    t0 = time.time()
    if (clone / "scripts" / "test.sh").exists():
        env["DECISIO_STAGE_TIMES"] = str(stages_file)
        _, code = timed(["bash", ".ci/run"], clone, env, log)
        stages = json.loads(stages_file.read_text())["stages"] if stages_file.exists() else []
        rust_file = stages_file.with_name("stages.rust.json")
        rust = json.loads(rust_file.read_text()) if rust_file.exists() else None
    else:
        stages, code, rust = [], 0, None
        for name, target in [("setup", ["make", "setup"]),
                             ("reference", ["make", "-o", "setup", "reference"]),
                             ("rust", ["make", "-o", "setup", "-o", "reference", "cargo-test"]),
                             ("e2e", ["make", "-o", "setup", "e2e"])]:
            seconds, code = timed(target, clone, env, log)
            stages.append({"stage": name, "seconds": seconds, "exit": code})
            if code != 0:
                break
    total = round(time.time() - t0, 1)
    shutil.rmtree(clone, ignore_errors=True)
    return {"exit": code, "total_s": total, "stages": stages, "rust": rust}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--label", help="the name of this revision in the record (default: its hash)")
    ap.add_argument("--modes", nargs="+", default=["new", "cached"], choices=["new", "cached"])
    ap.add_argument("--out", type=Path,
                    default=ROOT / "runs" / f"{datetime.date.today()}_ci-time")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("--hog", type=int, default=0,
                    help="run N CPU-bound processes beside each run (a busy machine: the "
                         "tests must pass all the same; the times are then not the budget's)")
    ap.add_argument("--repeat", type=int, default=1, help="run each mode this many times")
    ap.add_argument("--cache", type=Path,
                    help="with --modes cached alone: an existing DECISIO_CACHE to run with "
                         "(default: the one the `new` run made)")
    a = ap.parse_args()
    rev = sh(["git", "-C", str(ROOT), "rev-parse", a.rev], stdout=subprocess.PIPE).stdout.strip()
    work = a.work or Path(tempfile.mkdtemp(prefix="decisio-ci-time-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = a.cache or work / "cache"
    if a.cache and "new" in a.modes:
        sys.exit("error: --cache goes with --modes cached alone")
    a.out.mkdir(parents=True, exist_ok=True)
    results_file = a.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {"runs": []}
    machine = {"cpus": os.cpu_count(), "uname": " ".join(os.uname()),
               "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}
    runs = [(mode, i) for mode in a.modes for i in range(a.repeat)]
    for mode, i in runs:
        name = mode + (f"+hog{a.hog}" if a.hog else "") + (f"-{i + 1}" if a.repeat > 1 else "")
        log = a.out / f"{(a.label or rev[:8])}-{name}.log"
        log.unlink(missing_ok=True)
        print(f"[ci-time] {rev[:8]} {name}: .ci/run on a fresh clone (log: {log})", flush=True)
        if mode == "new":
            shutil.rmtree(cache, ignore_errors=True)
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(a.hog)]
        try:
            r = run_once(rev, cache, work, log)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        mode = name
        r.update({"revision": rev, "label": a.label or rev[:8], "mode": mode, "machine": machine,
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "command": f"python3 scripts/ci_time.py --rev {a.rev}"
                             + (f" --label {a.label}" if a.label else "")
                             + f" --modes {' '.join(a.modes)}"
                             + (f" --hog {a.hog}" if a.hog else "")
                             + (f" --repeat {a.repeat}" if a.repeat > 1 else "")
                             + (f" --cache {str(a.cache).replace(str(Path.home()), '~')}" if a.cache else "")})
        results["runs"] = [x for x in results["runs"]
                           if not (x["revision"] == rev and x["mode"] == mode)] + [r]
        results_file.write_text(json.dumps(results, indent=1) + "\n")
        print(f"[ci-time] {mode}: exit {r['exit']}, {r['total_s']:.0f} s: "
              + ", ".join(f"{s['stage']} {s['seconds']:.0f} s" for s in r["stages"]), flush=True)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    sh([sys.executable, str(ROOT / "scripts" / "ci_time_summary.py"), str(a.out)])


if __name__ == "__main__":
    main()
