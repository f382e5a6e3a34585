"""Writes summary.md of a CI-time record from its results.json.

Usage: python3 scripts/ci_time_summary.py runs/<date>_ci-time
"""

import json
import sys
from pathlib import Path

STAGES = ["setup", "reference", "rust", "targets", "e2e", "gates"]


def minutes(s):
    return f"{s / 60:.1f}"


def main():
    out = Path(sys.argv[1])
    results = json.loads((out / "results.json").read_text())
    notes = (out / "notes.md").read_text() if (out / "notes.md").exists() else ""
    lines = ["# CI time: `.ci/run` on a fresh clone, stage by stage", ""]
    lines += ["Minutes per stage (`setup`: scripts/setup.sh; `reference`: the Python "
              "reference figures; `rust`: the Rust test binaries, built and run; `targets`: the "
              "compile checks of macOS and aarch64 Linux, from `05f35af` on; `e2e`: the "
              "OpenAI SDK tests; `gates`: the small suite on the fixture gated against the "
              "committed records, from `7f6f849` on). `new`: an empty `DECISIO_CACHE`; `cached`: a second fresh "
              "clone with the cache of the first.", ""]
    lines.append("| revision | mode | " + " | ".join(STAGES) + " | total | exit |")
    lines.append("|---|---|" + "---:|" * (len(STAGES) + 1) + "---:|")
    for r in results["runs"] + results.get("derived", []):
        by = {s["stage"]: s["seconds"] for s in r["stages"]}
        cells = [minutes(by[s]) if s in by else "–" for s in STAGES]
        lines.append(f"| {r['label']} (`{r['revision'][:8]}`) | {r['mode']} | "
                     + " | ".join(cells) + f" | {minutes(r['total_s'])} | {r['exit']} |")
    rust = [r for r in results["runs"] if r.get("rust")]
    for r in rust:
        lines += ["", f"## Rust test binaries: {r['label']}, {r['mode']}", "",
                  f"Build {r['rust']['build_s']:.0f} s, run {r['rust']['run_s']:.0f} s, "
                  f"{r['rust']['jobs']} binaries at a time. Wall time of each:", "",
                  "| binary | seconds | tests |", "|---|---:|---:|"]
        for b in sorted(r["rust"]["binaries"], key=lambda b: -b["seconds"]):
            lines.append(f"| {b['name']} | {b['seconds']:.0f} | {b['passed']} |")
        tests = sorted((t for b in r["rust"]["binaries"] for t in b.get("tests", [])),
                       key=lambda t: -t["seconds"])[:10]
        if tests:
            lines += ["", "The ten slowest tests (seconds, on a machine shared with the other "
                          "binaries):", "", "| test | seconds |", "|---|---:|"]
            lines += [f"| `{t['name']}` | {t['seconds']:.0f} |" for t in tests]
    for d in results.get("derived", []):
        lines += ["", f"{d['label']}, {d['mode']}: {d['how']}"]
    lines += ["", "Commands: " + "; ".join(sorted({f"`{r['command']}`" for r in results["runs"]})),
              ""]
    if notes:
        lines += [notes.strip(), ""]
    (out / "summary.md").write_text("\n".join(lines))
    print(f"[ci-time] wrote {out / 'summary.md'}")


if __name__ == "__main__":
    main()
