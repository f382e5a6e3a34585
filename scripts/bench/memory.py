"""Benchmark: the memory of the largest questions the limits allow, on the
fixture and on every base's tiny conversion (MLX backend).

Usage: python scripts/bench/memory.py [--counts 1,4,16] [--orders 2]
  [--fixture-counts 1,4,16,64] [--models fixture,qwen3.6-35b-a3b,...]

For each model, one fresh server (its base's settings; the fixture outside
the bases), then one `POST /v1/decide` per count N: a new state and N
questions of 255 options each (the most a question may have), and one more
request of 4 such questions each read in `--orders` cyclic orders
(`x_orders`). After each request the record keeps:
  - the process's peak and current resident memory (`VmHWM`, `VmRSS` of
    /proc/PID/status);
  - MLX's own figures from `decisio_mlx_memory_bytes`: `peak` (the most
    bytes of arrays alive at once since the start: weights, kept states, the
    pass's activations), `active` and `cache` (freed buffers MLX keeps for
    reuse, capped as docs/limits.md says);
  - the request's time and prompt tokens.
The bound that docs/limits.md states is checked here on every row: MLX's
peak does not grow with N (a pass's activations are bounded by
`--pass-tokens` and `--prefill-chunk`, not by the request), and the
resident memory stays under the weights' bytes, MLX's peak and its buffer
cache's cap together, plus the process's own (under 256 MiB).

Writes runs/<date>_memory/{summary.md,results.json,memory.png}; the plot
with the project's `paired_bars` example when built.
"""

import argparse
import json
import os
import re
import time
import urllib.request

import common

TINY = common.ROOT / "target" / "reference" / "tiny"
if os.environ.get("DECISIO_REFERENCE_DIR"):
    TINY = common.pathlib.Path(os.environ["DECISIO_REFERENCE_DIR"]) / "tiny"
MODELS = {
    "fixture": (common.MODEL, []),
    "qwen3.6-35b-a3b": (TINY / "qwen3_5_moe-6bit", ["--base", "qwen3.6-35b-a3b",
                                                    "--tokenizer", str(TINY / "tokenizer-qwen3")]),
    "gemma-4-12b": (TINY / "gemma4_12b-6bit", ["--base", "gemma-4-12b",
                                               "--tokenizer", str(TINY / "tokenizer-gemma3")]),
    "gemma-4-31b": (TINY / "gemma4_31b-6bit", ["--base", "gemma-4-31b",
                                               "--tokenizer", str(TINY / "tokenizer-gemma3")]),
}
MIB = 1 << 20
# MLX's buffer cache on the CPU (src/engine/mlx/memory.rs; docs/limits.md).
CACHE_CAP_MIB = 1024
# The process besides MLX's arrays: code, the tokenizer, HTTP buffers.
PROCESS_MIB = 256
OPTIONS = [f"q{i}" for i in range(255)]


def status(pid):
    s = open(f"/proc/{pid}/status").read()
    kib = lambda k: int(re.search(rf"{k}:\s+(\d+)", s).group(1))  # noqa: E731
    return {"hwm_mib": kib("VmHWM") / 1024, "rss_mib": kib("VmRSS") / 1024}


def mlx_memory(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {f"mlx_{k}_mib": float(v) / MIB
            for k, v in re.findall(r'decisio_mlx_memory_bytes\{kind="(\w+)"\} (\S+)', text)}


def weights_mib(model):
    return sum(p.stat().st_size for p in model.glob("*.safetensors")) / MIB


def body(n, first, orders, tag):
    b = {"state": f"Case file {tag}: a customer writes that the parcel never came and asks "
                  "for a refund of the full price.",
         "questions": [{"text": f"Which queue handles case {first + i}?", "options": OPTIONS}
                       for i in range(n)]}
    if orders > 1:
        b["x_orders"] = orders
    return b


def run_model(name, counts, orders):
    model, extra = MODELS[name]
    proc, port = common.start_decisio(model, extra)
    try:
        rows, asked = [], 0
        ready = {**status(proc.pid), **mlx_memory(port)}
        for n, o in [(n, 1) for n in counts] + [(4, orders)]:
            dt, out = common.post(port, "/v1/decide", body(n, asked, o, f"{name}-{n}-{o}"))
            asked += n
            assert len(out["answers"]) == n, out
            rows.append({"questions": n, "orders": o, "seconds": dt,
                         "prompt_tokens": out["usage"]["prompt_tokens"],
                         **status(proc.pid), **mlx_memory(port)})
            print(f"{name}: {n} x {o} in {dt:.1f} s: {rows[-1]}", flush=True)
        return {"model": f"{model.parent.name}/{model.name}", "weights_mib": weights_mib(model), "ready": ready, "rows": rows}
    finally:
        proc.kill()
        proc.wait()


def bound(rec):
    """The documented bound's terms and whether every row keeps it."""
    peaks = [r["mlx_peak_mib"] for r in rec["rows"]]
    limit = rec["weights_mib"] + max(peaks) + CACHE_CAP_MIB + PROCESS_MIB
    return {"peak_first_mib": peaks[0], "peak_max_mib": max(peaks),
            "peak_growth": max(peaks) / peaks[0], "rss_bound_mib": limit,
            "hwm_max_mib": max(r["hwm_mib"] for r in rec["rows"]),
            "kept": all(r["hwm_mib"] <= limit for r in rec["rows"])}


def write(out, a, recs):
    (out / "results.json").write_text(json.dumps(
        {"command": a.command, "machine": common.machine(), "models": recs}, indent=1))
    lines = ["# Memory of the largest questions: 255 options each, up to the request's 256",
             "", f"Command: `{a.command}`.",
             f"Machine: {common.machine()['cpus']} CPUs, {common.machine()['platform']}; "
             "MLX's CPU build. Each model on a fresh server with its base's settings; every "
             "request a new state and new questions of 255 options (`/v1/decide`), the last "
             f"one 4 questions in {a.orders} orders (`x_orders`).", "",
             "Columns: resident peak and current (`VmHWM`, `VmRSS`), MLX's peak of live "
             "arrays, its buffer cache (freed buffers kept, capped at 1 GiB on the CPU), "
             "in MiB. The seconds are for orientation only: this record measures memory, "
             "and the machine may have run other work beside it.", ""]
    for name, rec in recs.items():
        b = rec["bound"]
        lines += [f"## {name}", "",
                  f"Weights {rec['weights_mib']:.0f} MiB; at start: resident "
                  f"{rec['ready']['rss_mib']:.0f}, MLX peak {rec['ready'].get('mlx_peak_mib', 0):.0f}.",
                  "", "| questions | orders | prompt tokens | s | resident peak | resident | "
                  "MLX peak | MLX cache |", "|---|---|---|---|---|---|---|---|"]
        for r in rec["rows"]:
            lines.append(f"| {r['questions']} | {r['orders']} | {r['prompt_tokens']} | "
                         f"{r['seconds']:.1f} | {r['hwm_mib']:.0f} | {r['rss_mib']:.0f} | "
                         f"{r['mlx_peak_mib']:.0f} | {r['mlx_cache_mib']:.0f} |")
        lines += ["", f"MLX's peak: {b['peak_first_mib']:.0f} MiB after one question, at most "
                  f"{b['peak_max_mib']:.0f} ({b['peak_growth']:.3f}x). The bound (weights + MLX "
                  f"peak + cache cap + {PROCESS_MIB} MiB): {b['rss_bound_mib']:.0f} MiB; the "
                  f"largest resident peak {b['hwm_max_mib']:.0f}: "
                  f"{'kept' if b['kept'] else 'NOT kept'}.", ""]
    bars = [{"name": f"{name}, {r['questions']}x{r['orders']}", "a": r["mlx_peak_mib"],
             "b": r["hwm_mib"]} for name, rec in recs.items() for r in rec["rows"]]
    if common.paired_bars(bars, ["MLX peak", "resident peak"], "MiB",
                          "255-option questions: memory by request size", out / "memory.png"):
        lines.append("`memory.png`: MLX's peak and the resident peak per request, drawn by "
                     "the paired_bars example.")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,4,16", help="questions per request, tiny models")
    ap.add_argument("--fixture-counts", default="1,4,16,64",
                    help="the fixture; 256 adds the largest request (about 20 minutes more)")
    ap.add_argument("--orders", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    a.command = "python scripts/bench/memory.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items())
    recs = {}
    for name in a.models.split(","):
        counts = a.fixture_counts if name == "fixture" else a.counts
        t = time.time()
        recs[name] = run_model(name, [int(c) for c in counts.split(",")], a.orders)
        recs[name]["bound"] = bound(recs[name])
        recs[name]["wall_s"] = time.time() - t
    out = common.run_dir("memory")
    write(out, a, recs)
    print(f"written to {out}")
    if not all(r["bound"]["kept"] for r in recs.values()):
        raise SystemExit("the resident memory went over the documented bound")


if __name__ == "__main__":
    main()
