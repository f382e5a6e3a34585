"""Memory of the production bases: weights and prefix-cache entry bytes
against state length, estimated from their config.json files, checked
against the seeds' figures and, on the tiny conversions of the same
structure, against what decisio measures.

Usage: python scripts/bench/base_memory.py OUT_DIR

- Estimate: weights = parameters x (bits + 0.5) / 8 bytes (MLX affine
  quantization in groups of 64 keeps a bf16 scale and bias per group: 32 bits
  per 64 weights). A state's cache entry = for each full-attention layer,
  keys and values of every token; for each sliding-window layer, keys and
  values of at most the window's last positions plus the last chunk read;
  for each Gated DeltaNet layer, its fixed convolution and recurrent states.
  decisio keeps a sliding layer's last `window - 1` positions between
  calls; mlx-lm's cache keeps them plus the last chunk it read.
  Activations (and so caches) in bf16 on Metal.
- Seeds: the Gemma 4 31B figures of the product's documentation (prefix
  cache entries of 935, 1,869, 2,954 and 4,386 MiB at 1,000, 3,000, 8,000
  and 32,000 tokens, measured with mlx-lm's cache, which reads prompts in
  chunks of 2,048 tokens and keeps a sliding layer's window plus the last
  chunk) and the weights of the three bases (9.7, 24.9 GB at 6 bits;
  19.5 GB for the Qwen base at 4 bits).
- Measured: `cargo run --release --example memory` on each tiny conversion
  (`make reference` writes them), whose cache entries the same formula must
  give exactly (at the dtype decisio holds them in on the CPU).
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASES = ROOT / "tests" / "fixtures" / "bases"
MIB = 1 << 20

SEED_GEMMA_31B_ENTRIES_MIB = {1000: 935, 3000: 1869, 8000: 2954, 32000: 4386}
SEED_WEIGHTS_GB = {
    ("gemma-4-12b", 6): 9.7,
    ("gemma-4-31b", 6): 24.9,
    ("qwen3.6-35b-a3b", 4): 19.5,
}
LENGTHS = [1000, 3000, 8000, 16383, 32000]


def mlx_version():
    try:
        import mlx.core as mx
        return mx.__version__
    except ImportError:
        return "unknown"


def text(config):
    return config.get("text_config", config)


def layer_kinds(t):
    if "layer_types" in t:
        return list(t["layer_types"])
    if "full_attention_interval" in t:
        k = t["full_attention_interval"]
        return ["full_attention" if (i + 1) % k == 0 else "linear_attention"
                for i in range(t["num_hidden_layers"])]
    return ["full_attention"] * t["num_hidden_layers"]


def parameters(t):
    """Parameter count of the text model (norms and biases left out)."""
    d, v = t["hidden_size"], t["vocab_size"]
    n = 0 if t.get("tie_word_embeddings", True) else v * d
    n += v * d
    for kind in layer_kinds(t):
        if kind == "linear_attention":
            kd = t["linear_num_key_heads"] * t["linear_key_head_dim"]
            vd = t["linear_num_value_heads"] * t["linear_value_head_dim"]
            n += d * (2 * kd + vd) + d * vd  # in_proj_qkv, in_proj_z
            n += 2 * d * t["linear_num_value_heads"]  # in_proj_a, in_proj_b
            n += vd * d  # out_proj
        else:
            full = kind == "full_attention"
            hd = t.get("global_head_dim", t["head_dim"]) if full else t["head_dim"]
            kv = t.get("num_global_key_value_heads", t["num_key_value_heads"]) if full \
                else t["num_key_value_heads"]
            q = t["num_attention_heads"] * hd * (2 if t.get("attn_output_gate") else 1)
            values = 0 if (full and t.get("attention_k_eq_v")) else kv * hd
            n += d * q + d * kv * hd + d * values + t["num_attention_heads"] * hd * d
        if "num_experts" in t:
            n += t["num_experts"] * 3 * d * t["moe_intermediate_size"]
            n += d * t["num_experts"]
            n += 3 * d * t.get("shared_expert_intermediate_size", 0) + d
        else:
            wide = 2 if t.get("use_double_wide_mlp") else 1
            n += 3 * d * t["intermediate_size"] * wide
    return n


def entry_bytes(t, tokens, chunk=None, dtype_bytes=2):
    """Bytes of the cache after `tokens` tokens: as decisio keeps it
    (`chunk` None), or as mlx-lm's keeps it after reading them in chunks of
    `chunk`."""
    last = 0 if chunk is None else tokens - (tokens - 1) // chunk * chunk
    total = 0
    # KV-shared layers (Gemma 4) read an earlier layer's cache: none of their own.
    kinds = layer_kinds(t)
    kinds = kinds[:len(kinds) - t.get("num_kv_shared_layers", 0)]
    for kind in kinds:
        if kind == "linear_attention":
            kd = t["linear_num_key_heads"] * t["linear_key_head_dim"]
            vd = t["linear_num_value_heads"] * t["linear_value_head_dim"]
            conv = (t["linear_conv_kernel_dim"] - 1) * (2 * kd + vd) * dtype_bytes
            state = (t["linear_num_value_heads"] * t["linear_key_head_dim"]
                     * t["linear_value_head_dim"] * 4)  # float32 (mamba_ssm_dtype)
            total += conv + state
        elif kind == "sliding_attention":
            held = min(tokens, t["sliding_window"] - 1 + last)
            total += 2 * t["num_key_value_heads"] * t["head_dim"] * dtype_bytes * held
        else:
            hd = t.get("global_head_dim", t["head_dim"])
            kv = t.get("num_global_key_value_heads", t["num_key_value_heads"])
            total += 2 * kv * hd * dtype_bytes * tokens
    return total


def estimate(name, config_file, bits):
    t = text(json.loads(config_file.read_text()))
    params = parameters(t)
    rows = []
    for n in LENGTHS:
        rows.append({
            "tokens": n,
            "entry_mib_decisio": round(entry_bytes(t, n) / MIB, 1),
            "entry_mib_mlx_lm": round(entry_bytes(t, n, 2048) / MIB, 1),
        })
    # Growth over whole chunks, where the sliding layers hold a constant count.
    per_token = (entry_bytes(t, 40960 + 256) - entry_bytes(t, 40960)) // 256
    return {
        "base": name,
        "config": config_file.name,
        "parameters": params,
        "bits": bits,
        "weights_gb": round(params * (bits + 0.5) / 8 / 1e9, 2),
        "bytes_per_state_token_beyond_windows": per_token,
        "entries": rows,
    }


def measure(tiny_dir, lengths):
    example = ROOT / "target" / "release" / "examples" / "memory"
    if not example.exists():
        subprocess.run(["cargo", "build", "--release", "--example", "memory"],
                       cwd=ROOT, check=True)
    out = subprocess.run([str(example), str(tiny_dir), ",".join(map(str, lengths))],
                         cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    bases = [
        ("qwen3.6-35b-a3b", BASES / "qwen3_5_moe-35b-a3b.config.json", [6, 4]),
        ("gemma-4-12b", BASES / "gemma-4-12B-it-6bit.config.json", [6]),
        ("gemma-4-31b", BASES / "gemma-4-31b-it-6bit.config.json", [6]),
    ]
    estimates = [estimate(n, f, b) for n, f, bits in bases for b in bits]
    for e in estimates:
        seed = SEED_WEIGHTS_GB.get((e["base"], e["bits"]))
        e["seed_weights_gb"] = seed
    t31 = text(json.loads((BASES / "gemma-4-31b-it-6bit.config.json").read_text()))
    seeds = [{"tokens": n, "seed_mib": mib,
              "estimate_mib_mlx_lm": round(entry_bytes(t31, n, 2048) / MIB, 1)}
             for n, mib in SEED_GEMMA_31B_ENTRIES_MIB.items()]
    for s in seeds:
        s["ratio"] = round(s["estimate_mib_mlx_lm"] / s["seed_mib"], 3)

    reference = Path(os.environ.get("DECISIO_REFERENCE_DIR", ROOT / "target" / "reference"))
    measured = []
    for tiny in sorted((reference / "tiny").glob("*")):
        if not (tiny / "config.json").exists():
            continue
        lengths = [1, 100, 1000, 2000]
        m = measure(tiny, lengths)
        t = text(json.loads((tiny / "config.json").read_text()))
        # decisio holds a dequantized conversion's activations in float32 on
        # the CPU and a bf16 one's in bf16.
        for row in m["states"]:
            per = [entry_bytes(t, row["tokens"], None, b) for b in (2, 4)]
            row["formula_bytes_bf16_f32"] = per
            row["formula_matches"] = row["cache_entry_bytes"] in per
        m["conversion"] = tiny.name
        measured.append(m)

    (out_dir / "estimate.json").write_text(json.dumps(
        {"estimates": estimates, "gemma_31b_against_seeds": seeds}, indent=2) + "\n")
    (out_dir / "tiny.json").write_text(json.dumps(measured, indent=2) + "\n")

    lines = ["# Memory of the bases: estimates from their configs, checked against "
             "the seeds and the tiny conversions", "",
             f"Command: `python scripts/bench/base_memory.py {out_dir.as_posix()}` "
             "(after `make reference`).", "",
             f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, MLX "
             f"{mlx_version()} (CPU build). Peak memory is MLX's peak while a state is "
             "computed, weights included; weights are MLX's active memory once "
             "loaded (the CPU default holds quantized weights dequantized to bf16).", "",
             "## Weights", "",
             "| base | bits | parameters | estimate (GB) | seeds (GB) |",
             "|---|---|---|---|---|"]
    for e in estimates:
        lines.append(f"| {e['base']} | {e['bits']} | {e['parameters'] / 1e9:.2f} B | "
                     f"{e['weights_gb']} | {e['seed_weights_gb'] or '—'} |")
    lines += ["", "## Prefix-cache entries (MiB, bf16 caches as on Metal)", "",
              "| base | bytes per token beyond the windows | "
              + " | ".join(f"{n:,} tokens" for n in LENGTHS) + " |",
              "|---|---|" + "---|" * len(LENGTHS)]
    for e in estimates:
        if e["bits"] != 6:
            continue
        lines.append(f"| {e['base']} | {e['bytes_per_state_token_beyond_windows']:,} | "
                     + " | ".join(f"{r['entry_mib_decisio']:,}" for r in e["entries"]) + " |")
    lines += ["", "decisio keeps a sliding-window layer's last window - 1 positions "
              "in a state's entry; mlx-lm's cache (chunks of 2,048) keeps up to the "
              "window plus 2,047.", "",
              "## Gemma 4 31B against the seeds' entries (mlx-lm's chunking)", "",
              "| tokens | seeds (MiB) | estimate (MiB) | ratio |", "|---|---|---|---|"]
    for s in seeds:
        lines.append(f"| {s['tokens']:,} | {s['seed_mib']:,} | {s['estimate_mib_mlx_lm']:,} "
                     f"| {s['ratio']} |")
    lines += ["", "## Tiny conversions, measured by decisio (`examples/memory.rs`)", "",
              "| conversion | weights (MiB) | tokens | cache entry (bytes) | formula matches | "
              "peak (MiB) |", "|---|---|---|---|---|---|"]
    for m in measured:
        for r in m["states"]:
            lines.append(f"| {m['conversion']} | {m['weights_bytes'] / MIB:.1f} | {r['tokens']} "
                         f"| {r['cache_entry_bytes']:,} | {'yes' if r['formula_matches'] else 'no'} "
                         f"| {r['peak_bytes'] / MIB:.1f} |")
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
