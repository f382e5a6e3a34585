"""A change's CPU profile beside the build before it, paired round by round.

Builds `examples/cpu_profile.rs` at `--before` (a commit, in a worktree of
its own) and on the working tree, then runs the two alternately on the
fixture for each case, `--rounds` times, and writes
runs/<today>_<name>/: raw/ (every run's JSON), results.json (the paired
ratios, the change's over the build before, of the plain times and of
the profiled classes) summary.md and times.png. The machine is noisy: only ratios
within a round are compared.

Cases (the System One bench's shapes): a new 1,000-token state and one
question of 40 tokens; a new 3,000-token state and a pass of 17 questions
of 80 (the seen case's pass).

usage: python scripts/bench/profile_pair.py --before COMMIT [--rounds 3] [--name attention-cores] [--rewrite]
"""

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import tempfile

import common

CASES = {
    "1000x1": ["--state", "1000", "--suffix", "40", "--rows", "1", "--reps", "3"],
    "3000x17": ["--state", "3000", "--suffix", "80", "--rows", "17", "--reps", "2"],
}


def build(tree, into):
    """Builds the example in `tree` and copies it to `into`. The two trees
    share one target folder, where cargo takes the other tree's build of
    the crate for its own (the same package, so the same unit): the crate's
    build is cleaned first."""
    subprocess.run(["cargo", "clean", "--release", "-p", "decisio"], cwd=tree, check=True)
    subprocess.run(["cargo", "build", "--release", "--locked", "--example", "cpu_profile"],
                   cwd=tree, check=True)
    target = pathlib.Path(common.DECISIO).parent
    shutil.copy(target / "examples/cpu_profile", into)


def figures(run):
    """The figures compared: the plain times and the profiled classes."""
    out = {f"{phase} plain ms": run["plain_ms"][phase] for phase in ("prefill", "question")}
    for phase in ("prefill", "question"):
        classes = run["profiled"][phase]["classes"]
        attention = sum(classes.get(c, {}).get("ms", 0.0) for c in ("attention products", "softmax"))
        out[f"{phase} attention ms"] = attention
        out[f"{phase} linear products ms"] = classes.get("products", {}).get("ms", 0.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="profile-pair")
    ap.add_argument("--rewrite", action="store_true",
                    help="write summary.md and times.png again from the record's raw runs, running nothing")
    a = ap.parse_args()
    out = common.run_dir(a.name)
    (out / "raw").mkdir(exist_ok=True)
    runs = {case: {"before": [], "after": []} for case in CASES}
    if a.rewrite:  # the record's raw runs, read again
        for r in range(a.rounds):
            for case in CASES:
                for side in ("before", "after"):
                    path = out / "raw" / f"{case}_{side}_{r + 1}.json"
                    runs[case][side].append(figures(json.loads(path.read_text())))
    else:
        bins = pathlib.Path(tempfile.mkdtemp(prefix="decisio-pair-"))
        tree = bins / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), a.before], cwd=common.ROOT, check=True)
        try:
            config = common.ROOT / ".cargo/config.toml"
            if config.exists():  # the machine's MLX set-up (scripts/mlx-linux/setup.sh)
                (tree / ".cargo").mkdir(exist_ok=True)
                shutil.copy(config, tree / ".cargo/config.toml")
            build(tree, bins / "before-bin")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=common.ROOT, check=True)
        build(common.ROOT, bins / "after-bin")
        for r in range(a.rounds):
            for case, args in CASES.items():
                for side in ("before", "after"):
                    path = out / "raw" / f"{case}_{side}_{r + 1}.json"
                    subprocess.run([str(bins / f"{side}-bin"), "--model", str(common.MODEL), str(path),
                                    *args, "--chunk", "512"], check=True, capture_output=True)
                    runs[case][side].append(figures(json.loads(path.read_text())))
                    print(case, side, r + 1, flush=True)
    after = (json.loads((out / "results.json").read_text()).get("after") if a.rewrite else None) or \
        subprocess.run(["git", "describe", "--always", "--dirty"], cwd=common.ROOT, capture_output=True,
                       text=True).stdout.strip()
    results = {"before": a.before, "after": after, "rounds": a.rounds, "cases": {}}
    lines = [f"# CPU profile: {after} beside {a.before}, paired round by round", "",
             f"Command: `python scripts/bench/profile_pair.py --before {a.before} --rounds {a.rounds} "
             f"--name {a.name}`; the fixture ({common.MODEL.name}), `--chunk 512`.", "",
             "Ratio: the change's over the build before, within a round; median (min to max) of the rounds.", ""]
    for case, sides in runs.items():
        keys = list(sides["before"][0])
        ratios = {k: [x[k] / y[k] for x, y in zip(sides["after"], sides["before"]) if y[k] > 0] for k in keys}
        results["cases"][case] = {"args": CASES[case], "before": sides["before"], "after": sides["after"],
                                  "ratios": ratios}
        lines += [f"## {case} (`{' '.join(CASES[case])}`)", "",
                  "| figure | before, ms | after, ms | ratio |", "|---|---|---|---|"]
        for k in keys:
            rs = ratios[k]
            span = lambda v: f"{min(v):.0f} to {max(v):.0f}"
            lines.append(f"| {k} | {span([s[k] for s in sides['before']])} | {span([s[k] for s in sides['after']])} | "
                         + (f"{statistics.median(rs):.2f} ({min(rs):.2f} to {max(rs):.2f})" if rs else "n/a") + " |")
        lines.append("")
    bars = [{"name": f"{case}: {k.replace(' ms', '')}", "a": statistics.median(s[k] for s in sides["before"]),
             "b": statistics.median(s[k] for s in sides["after"])}
            for case, sides in runs.items() for k in sides["before"][0] if "plain" in k or "attention" in k]
    if common.paired_bars(bars, [f"before ({a.before})", "after"], "ms (median)",
                          "CPU profile, paired rounds", out / "times.png"):
        lines.append("`times.png`: the medians of the plain times and of attention, before and after.")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
