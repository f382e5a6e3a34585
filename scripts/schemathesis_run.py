"""Schemathesis against real servers on the fixture: the served
description (`GET /openapi.json`) checked by property-based testing, once
without an API key and once with one.

Usage: python3 scripts/schemathesis_run.py [--examples N] [--seed S]
           [--configs open keyed] [--out DIR]

For each configuration, starts `decisio serve` on the fixture
(`--max-model-len`, a fresh `--state-dir`, port 0), runs `st run` on its
`/openapi.json` with every check but the response-time one
(docs/design/openapi.md), the hooks of tests/e2e/st_hooks.py, one worker
and a fixed seed, and stops the server. Prints one line per configuration
(cases generated, failures, seconds) and exits non-zero when any
configuration has a failure or an error. With `--out`, writes
`results.json` and `summary.md` there, and Schemathesis's own JUnit
report and output for each configuration.
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from conftest import MODEL, start_server, stop_server  # noqa: E402

API_KEY = "schemathesis-key"
# Every check of Schemathesis 4.32 but `max_response_time`, which times the
# machine rather than the description, and `object_level_authorization`,
# which needs two users: a server has one key.
CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance",
    "response_headers_conformance", "response_schema_conformance",
    "negative_data_rejection", "positive_data_acceptance", "missing_required_header",
    "unsupported_method", "allow_header_conformance", "use_after_free",
    "ensure_resource_availability", "ignored_auth",
])
GENERATED = re.compile(r"(\d+) generated")
SUMMARY = re.compile(r"^=+ (.*) in ([0-9.]+)s =+$", re.M)


def st_binary():
    return str(pathlib.Path(sys.executable).with_name("st"))


def run_config(name, examples, seed, context, out):
    """One server, one `st run`; a dict of figures."""
    keyed = name == "keyed"
    state = tempfile.mkdtemp(prefix="decisio-st-state-")
    # The shortest reasoning: a generated request may ask to think on every
    # one of its questions.
    args = ["--model", str(MODEL), "--max-model-len", str(context), "--state-dir", state,
            "--think-budget", "16"]
    if keyed:
        args += ["--api-key", API_KEY]
    proc, base = start_server(args)
    cmd = [
        st_binary(), "run", f"{base}/openapi.json",
        "--checks", CHECKS,
        "--max-examples", str(examples),
        "--seed", str(seed),
        "--workers", "1",
        "--request-timeout", "120",
        "--no-color",
    ]
    if keyed:
        # Schemathesis sends the key where the description asks for it and
        # also tries without it and with a wrong one (`ignored_auth`).
        cmd += ["--header", f"Authorization: Bearer {API_KEY}"]
    report = None
    if out:
        report = out / f"{name}-junit.xml"
        cmd += ["--report", "junit", "--report-junit-path", str(report)]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "st_hooks",
        "PYTHONPATH": str(ROOT / "tests" / "e2e"),
        "DECISIO_ST_CONTEXT": str(context),
    }
    t0 = time.time()
    try:
        # Schemathesis keeps a cache folder where it runs: not in the tree.
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=state)
    finally:
        stop_server(proc)
    seconds = round(time.time() - t0, 1)
    text = p.stdout + p.stderr
    if out:
        (out / f"{name}.txt").write_text(text)
    generated = GENERATED.search(text)
    summary = SUMMARY.search(text)
    return {
        "config": name,
        "exit": p.returncode,
        "generated": int(generated.group(1)) if generated else None,
        "summary": summary.group(1) if summary else None,
        "st_seconds": float(summary.group(2)) if summary else None,
        "seconds": seconds,
        "output": text,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=5,
                    help="Schemathesis's --max-examples per operation and phase")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--context", type=int, default=160,
                    help="the servers' --max-model-len: it bounds every generation")
    ap.add_argument("--configs", nargs="+", default=["open", "keyed"],
                    choices=["open", "keyed"])
    ap.add_argument("--out", type=pathlib.Path, help="write the record here")
    a = ap.parse_args()
    if a.out:
        # Schemathesis runs in a scratch folder: its report paths must be whole.
        a.out = a.out.resolve()
        a.out.mkdir(parents=True, exist_ok=True)
    # The configurations run side by side: each server mostly waits on its
    # Schemathesis, so two fit the two cores of a CI machine.
    with concurrent.futures.ThreadPoolExecutor(len(a.configs)) as pool:
        results = list(pool.map(
            lambda name: run_config(name, a.examples, a.seed, a.context, a.out), a.configs))
    for r in results:
        name = r["config"]
        ok = r["exit"] == 0
        print(f"[schemathesis] {name}: {'passed' if ok else 'FAILED'}, "
              f"{r['generated']} cases generated, {r['summary']}, {r['seconds']} s",
              flush=True)
        if not ok:
            print(r["output"][-20000:], file=sys.stderr)
    if a.out:
        record = {
            "date": datetime.date.today().isoformat(),
            "command": "python3 scripts/schemathesis_run.py " + " ".join(
                str(pathlib.Path(x).resolve().relative_to(ROOT)) if x.startswith("/") else x
                for x in sys.argv[1:]),
            "schemathesis": subprocess.run([st_binary(), "--version"], capture_output=True,
                                           text=True).stdout.strip(),
            "examples": a.examples, "seed": a.seed, "context": a.context,
            "results": [{k: v for k, v in r.items() if k != "output"} for r in results],
        }
        (a.out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
        lines = [
            "# Schemathesis against the served description", "",
            f"`{record['command']}` ({record['schemathesis']}), seed {a.seed}, "
            f"{a.examples} examples per operation and phase, servers on the fixture "
            f"with `--max-model-len {a.context}`.", "",
            "| configuration | result | cases generated | Schemathesis's summary | seconds |",
            "|---|---|---|---|---|",
        ]
        for r in results:
            lines.append(f"| {r['config']} | {'passed' if r['exit'] == 0 else 'failed'} | "
                         f"{r['generated']} | {r['summary']} | {r['seconds']} |")
        (a.out / "summary.md").write_text("\n".join(lines) + "\n")
    sys.exit(0 if all(r["exit"] == 0 for r in results) else 1)


if __name__ == "__main__":
    main()
