"""The CPU profile of a decision: where a new state's prefill and a
question on a cached state spend their time, by class of operation, beside
the time their products take at the machine's GEMM rate.

Runs `examples/cpu_profile.rs` on the fixture (the engine's own code paths,
plain and with the profile on; every product shape timed alone through
MLX's matmul), then times the same shapes with numpy (its BLAS, float32)
in the same run, and writes runs/<today>_cpu-profile/: results.json (the
example's figures and numpy's), summary.md, breakdown.png.

usage: python scripts/bench/cpu_profile.py [--state 1170] [--suffix 136] [--reps 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np

import common


def numpy_seconds(p, reps):
    """Median seconds of the product of the shape `p` (as the example
    reports it) with numpy, its operands in memory: one 2-D product per
    batch entry (numpy hands a 2-D float32 product, a transposed operand
    included, to its BLAS as one sgemm)."""
    rng = np.random.default_rng(0)
    a = [rng.standard_normal((p["m"], p["k"]), dtype=np.float32) for _ in range(p["batch"])]
    if p["transposed"]:
        w = [rng.standard_normal((p["n"], p["k"]), dtype=np.float32) for _ in range(p["batch"])]
        w = [x.T for x in w]
    else:
        w = [rng.standard_normal((p["k"], p["n"]), dtype=np.float32) for _ in range(p["batch"])]

    def run():
        for x, y in zip(a, w):
            np.dot(x, y)

    run()
    times = []
    for _ in range(max(reps, 5)):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", type=int, default=1170)
    ap.add_argument("--suffix", type=int, default=136)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    out = common.run_dir("cpu-profile")
    subprocess.run(["cargo", "build", "--release", "--example", "cpu_profile"],
                   cwd=common.ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", str(common.ROOT / "target"))
    figures_path = out / "profile.json"
    subprocess.run([f"{target}/release/examples/cpu_profile", "--model", str(common.MODEL),
                    str(figures_path), "--state", str(a.state), "--suffix", str(a.suffix),
                    "--reps", str(a.reps), "--plot", str(out / "breakdown.png")],
                   check=True)
    figures = json.loads(figures_path.read_text())
    figures_path.unlink()
    seen = {}
    for path in ("prefill", "question"):
        p = figures["profiled"][path]
        linear = attention = 0.0
        for shape in p["products"]:
            key = tuple(shape[k] for k in ("transposed", "batch", "m", "k", "n"))
            if key not in seen:
                seen[key] = numpy_seconds(shape, a.reps)
            shape["numpy_ms"] = seen[key] * 1e3
            ms = seen[key] * 1e3 * shape["count"]
            if shape["linear"]:
                linear += ms
            else:
                attention += ms
        p["gemm"]["numpy_linear_ms"] = linear
        p["gemm"]["numpy_attention_ms"] = attention
        p["gemm"]["numpy_ms"] = linear + attention
    figures["machine"] = common.machine()
    figures["numpy"] = np.__version__
    (out / "results.json").write_text(json.dumps(figures, indent=1) + "\n")
    (out / "summary.md").write_text(summary(figures))
    print((out / "summary.md").read_text())


def summary(f):
    plain = f["plain_ms"]
    lines = [
        "# Where a decision's CPU time goes",
        "",
        f"The fixture ({f['model']}: {f['architecture']}, {f['layers']} layers, hidden "
        f"{f['hidden_size']}, vocabulary {f['vocab_size']}; weights held as float32 on "
        f"the CPU), a new state of {f['state_tokens']} tokens read in chunks of "
        f"{f['chunk']} (a), and a question of {f['suffix_tokens']} tokens on it, cached "
        "(b), run as the engine runs them (`examples/cpu_profile.rs`). Plain times are "
        f"medians of {f['reps']} runs; the profile evaluates each operation where it is "
        "built and adds its time to its class (`src/engine/mlx/profile.rs`). The GEMM "
        "time is every product of the path (the linear layers' and attention's, at "
        "their shapes) timed alone with its operands in memory: through MLX's matmul, "
        "and through numpy (float32, its BLAS) in the same run.",
        "",
        "| | (a) new state | (b) question on a cached state |",
        "|---|---:|---:|",
        f"| plain (ms) | {plain['prefill']:.1f} | {plain['question']:.1f} |",
    ]
    pa, pb = f["profiled"]["prefill"], f["profiled"]["question"]
    lines += [
        f"| profiled (ms) | {pa['total_ms']:.1f} | {pb['total_ms']:.1f} |",
        f"| products' arithmetic (GFLOP) | {pa['gemm']['gflop']:.2f} | {pb['gemm']['gflop']:.2f} |",
        f"| GEMM time, MLX alone (ms) | {pa['gemm']['ms']:.1f} | {pb['gemm']['ms']:.1f} |",
        f"| GEMM time, numpy (ms) | {pa['gemm']['numpy_ms']:.1f} | {pb['gemm']['numpy_ms']:.1f} |",
        f"| of which attention's, numpy (ms) | {pa['gemm']['numpy_attention_ms']:.1f} | "
        f"{pb['gemm']['numpy_attention_ms']:.1f} |",
        f"| **plain / GEMM time (numpy)** | **{plain['prefill'] / pa['gemm']['numpy_ms']:.2f}** | "
        f"**{plain['question'] / pb['gemm']['numpy_ms']:.2f}** |",
        "",
        "By class (profiled; GFLOP/s where the class does arithmetic):",
        "",
        "| class | (a) ms | (a) share | (a) GFLOP | (a) GFLOP/s | (b) ms | (b) share | (b) GFLOP | (b) GFLOP/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = sorted(set(pa["classes"]) | set(pb["classes"]),
                   key=lambda n: -pa["classes"].get(n, {}).get("ms", 0.0))

    def cells(p, name):
        c = p["classes"].get(name)
        if c is None:
            return ["–"] * 4
        rate = f"{c['gflop'] / c['ms'] * 1e3:.1f}" if c["gflop"] > 0 and c["ms"] > 0 else "–"
        return [f"{c['ms']:.1f}", f"{c['ms'] / p['total_ms']:.1%}", f"{c['gflop']:.2f}", rate]

    for name in names:
        lines.append(f"| {name} | " + " | ".join(cells(pa, name) + cells(pb, name)) + " |")
    lines.append(f"| not in a class (scheduling, lazy reshapes) | {pa['unclassified_ms']:.1f} | "
                 f"{pa['unclassified_ms'] / pa['total_ms']:.1%} | | | {pb['unclassified_ms']:.1f} | "
                 f"{pb['unclassified_ms'] / pb['total_ms']:.1%} | | |")
    lines += [
        "",
        "Product shapes (m × k by k × n, batched over heads for attention), their count "
        "per path, and each one's rate alone: through MLX's matmul, as the engine computes it "
        "(attention's through `host::blas_product`, the BLAS call of the host attention on "
        "float32; linear layers' through MLX's matmul, as in the column before), and numpy's "
        "time:",
        "",
        "| path | kind | batch | m | k | n | count | MLX alone (GFLOP/s) "
        "| engine alone (GFLOP/s) | numpy (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    engine = lambda s: s["engine_gflops_per_s"] or s["gflops_per_s"]
    for path, p in (("a", pa), ("b", pb)):
        for s in p["products"]:
            lines.append(f"| {path} | {'linear' if s['linear'] else 'attention'} | {s['batch']} | "
                         f"{s['m']} | {s['k']} | {s['n']} | {s['count']} | "
                         f"{s['gflops_per_s']:.1f} | {engine(s):.1f} | {s['numpy_ms']:.3f} |")
    m = f["machine"]
    lines += ["", f"Machine: {m['platform']}, {m['cpus']} CPUs. numpy {f['numpy']}. Command: "
              "`python scripts/bench/cpu_profile.py` (`make bench-profile`). "
              "`breakdown.png`: each class's share of the profiled time.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
