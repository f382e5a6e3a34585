"""Benchmark: MLX CPU kernels behind two choices of the MLX backend on Linux.

Usage: python scripts/bench/cpu_kernels.py

Times, in this process and in a child with OpenBLAS preloaded, one layer-sized
product (500 x 576 by 576 x 1536, SmolLM2-135M's MLP shape): dense float32
and float16, and quantized (4 and 8 bits, groups of 32) with float32 and
float16 scales. It backs two decisions: `decisio convert --dtype float32`
(half-precision quantized products are slow on MLX's CPU backend) and, on the
CPU, dense weights with OpenBLAS linked in (the wheel's reference BLAS and
MLX's CPU quantized kernels are slow). Writes runs/<date>_cpu-kernels/.
"""

import json
import os
import subprocess
import sys

import common

from common import OPENBLAS


def measure():
    import mlx.core as mx
    mx.random.seed(0)
    x32 = mx.random.normal((1, 500, 576))
    w32 = mx.random.normal((1536, 576)) * 0.05
    out = {}

    def t(name, f, n=5):
        out[name] = common.median_ms(f, n)

    for dt, label in [(mx.float32, "float32"), (mx.float16, "float16")]:
        x, w = x32.astype(dt), w32.astype(dt)
        t(f"dense {label}", lambda: x @ w.T, n=5 if label == "float32" else 2)
        for bits in (4, 8):
            wq, s, b = mx.quantize(w, group_size=32, bits=bits)
            t(f"quantized {bits}-bit, {label} scales",
              lambda: mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=32, bits=bits),
              n=5 if label == "float32" else 1)
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(measure()))
        return
    run = lambda env: json.loads(subprocess.run(
        [sys.executable, __file__, "--child"], env=env, check=True,
        capture_output=True, text=True).stdout)
    base = run(dict(os.environ))
    openblas = run(dict(os.environ, LD_PRELOAD=OPENBLAS)) if os.path.exists(OPENBLAS) else {}
    results = {"milliseconds_median": {"wheel BLAS": base, "OpenBLAS preloaded": openblas},
               "shape": "500x576 @ 576x1536", "machine": common.machine(),
               "command": "python scripts/bench/cpu_kernels.py"}
    d = common.run_dir("cpu-kernels")
    (d / "results.json").write_text(json.dumps(results, indent=2))
    rows = "\n".join(f"| {k} | {base[k]:.1f} | {openblas.get(k, float('nan')):.1f} |" for k in base)
    (d / "summary.md").write_text(f"""# MLX CPU kernels (mlx-cpu 0.32.2)

One product of SmolLM2-135M's MLP shape (500 x 576 by 576 x 1536), median
milliseconds, with the wheel's own BLAS and with Debian's OpenBLAS preloaded.

| product | wheel BLAS (ms) | OpenBLAS (ms) |
|---|---|---|
{rows}

Readings: quantized products do not use BLAS (the same time either way);
with float16 scales they are far slower than with float32 ones; a dense
float32 product through OpenBLAS is far faster than any quantized one.
Hence, on the CPU, `decisio convert` writes float32 scales by default and
`decisio serve` holds weights dense (`--dequantize auto`) and links OpenBLAS.

Machine: {common.machine()['platform']}, {common.machine()['cpus']} CPUs.
Command: `python scripts/bench/cpu_kernels.py`.
""")
    print((d / "summary.md").read_text())


if __name__ == "__main__":
    main()
