"""Tiny random-weight MLX conversions of real architectures, and mlx-lm's
logits on them, for the architecture tests (tests/arch_*.rs).

Usage: python scripts/reference/tiny_models.py OUT_DIR [ARCH ...]

For each architecture (default: all of ARCHITECTURES), starts from the real
config.json committed under tests/fixtures/bases/, keeps its structure (the
layer-type pattern, head ratios, expert routing, feature flags) and shrinks
widths, depth and vocabulary. With a fixed seed it builds the model with
mlx-lm's own classes and writes, as `mlx_lm.convert` does (cast to the
config's dtype by the model's cast predicate, quantized by mlx-lm's
`quantize_model` with the model's quantization predicate, saved by
`save_model`/`save_config`):

  OUT_DIR/tiny/<arch>-bf16, -6bit, -4bit   (group size 64)

and in each folder `reference.safetensors`: for prompts of several lengths
(random ids, seeded) `ids_<n>` and `logits_<n>` (float32 logits of the last
position, the prompt read through mlx-lm's caches in chunks of 256 as the
engine reads it), and for prefix + continuation pairs `prefix_<i>`, `cont_<i>`,
`cont_logits_<i>` (the continuation run through the cache the prefix left),
and `decode_prefix_<i>`, `decode_steps_<i>`, `decode_logits_<i>` (after a
prefix, tokens fed one at a time as generation feeds them; the logits of
the last step).
The reference is computed by mlx-lm 0.32.2 from the saved folder; for the
quantized folders `reference_dense.safetensors` holds the same from mlx-lm's
`dequantize_model` of it (the same weight values in bfloat16 on MLX's dense
kernels, which is what decisio runs on the CPU by default; MLX's CPU
quantized product accumulates differently, by up to 2 bfloat16 steps).

An architecture whose `OUT_DIR/tiny/<arch>.stamp` matches this script, its
real config and the MLX version is left as it is.
"""

import copy
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.utils import (
    dequantize_model,
    load_model,
    quantize_model,
    save_config,
    save_model,
)

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261201
LENGTHS = [1, 2, 3, 5, 17, 63, 64, 65, 255, 256, 257, 700, 2000]
# (prefix, continuation) lengths: across the chunk border, short suffixes,
# and (for sliding windows of 64) a continuation longer than the window
# after a prefix beyond it.
PAIRS = [(1, 1), (3, 4), (40, 30), (256, 9), (300, 1), (513, 40), (600, 257)]
# (prefix, steps): after a prefix, tokens fed one at a time as generation
# feeds them (through a whole turn of a sliding window's rotating buffer).
DECODES = [(100, 70)]
# Prompts and prefixes are read in chunks of this many tokens, as the
# engine reads them (one call per chunk through mlx-lm's caches).
CHUNK = 256
QUANTS = [("bf16", None), ("6bit", 6), ("4bit", 4)]
# Logits of a random model are scaled down so that their bfloat16 rounding
# step (2^-10 below 0.25) stays under the tests' tolerance.
LM_HEAD_SCALE = 0.1


def tiny_qwen3_5_moe(base):
    """Qwen3.6-35B-A3B's structure at a small size: 8 layers (every 4th full
    attention), 8 query heads per KV head, 2 value heads per key head in the
    linear layers, 1 routed expert in 32 (top 2 of 64) and a shared expert."""
    config = copy.deepcopy(base)
    config.pop("quantization", None)
    t = config["text_config"]
    t.update(
        hidden_size=64,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        num_experts=64,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        vocab_size=1024,
        max_position_embeddings=4096,
    )
    t.pop("mtp_num_hidden_layers", None)
    assert t["full_attention_interval"] == 4
    return config


def tiny_qwen3_5(base):
    """Qwen3.6-27B's structure at a small size: 8 layers (every 4th full
    attention), 6 query heads per KV head, 3 value heads per key head in the
    linear layers, an MLP 3 times the width."""
    config = copy.deepcopy(base)
    config.pop("quantization", None)
    t = config["text_config"]
    t.update(
        hidden_size=64,
        num_hidden_layers=8,
        num_attention_heads=6,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        intermediate_size=192,
        vocab_size=1024,
        max_position_embeddings=4096,
    )
    t.pop("mtp_num_hidden_layers", None)
    assert t["full_attention_interval"] == 4
    return config


# Gemma 4's sliding window in the tiny models: prompts of up to 2,000 tokens
# run far beyond it.
GEMMA_WINDOW = 64


def gemma4_text_tiny(text, layers, heads, kv_heads, global_kv_heads):
    """A Gemma 4 text config with its sizes cut down and its flags, rope
    parameters and layer pattern (the first `layers` entries) kept."""
    t = copy.deepcopy(text)
    t.update(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_global_key_value_heads=global_kv_heads,
        head_dim=32,
        global_head_dim=64,
        sliding_window=GEMMA_WINDOW,
        vocab_size=1024,
        vocab_size_per_layer_input=1024,
        max_position_embeddings=4096,
        layer_types=text["layer_types"][:layers],
    )
    return t


def tiny_gemma4_31b(base):
    """Gemma 4 31B's structure: five sliding layers and a full one, 2 query
    heads per KV head on sliding layers and 8 per shared key/value head
    (`attention_k_eq_v`) on full layers, the proportional rope."""
    config = copy.deepcopy(base)
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    config["text_config"] = gemma4_text_tiny(config["text_config"], 6, 8, 4, 1)
    config["vocab_size"] = 1024
    return config


def tiny_gemma4_12b(base):
    """Gemma 4 12B's structure: 2 query heads per KV head on both kinds of
    layers, `attention_k_eq_v`."""
    config = tiny_gemma4_31b(base)
    config["text_config"] = gemma4_text_tiny(base["text_config"], 6, 4, 2, 2)
    return config


def tiny_gemma4_text_shared_kv(base):
    """The features of Gemma 4 that neither base enables, as a text-only
    `gemma4_text` conversion: per-layer inputs, three KV-shared layers of
    both kinds, double-wide MLPs of shared layers, separate values on full
    layers."""
    t = gemma4_text_tiny(base["text_config"], 7, 4, 1, 1)
    t.update(
        model_type="gemma4_text",
        intermediate_size=128,
        num_kv_shared_layers=3,
        hidden_size_per_layer_input=16,
        layer_types=(["sliding_attention"] * 2 + ["full_attention"]) * 2
        + ["sliding_attention"],
        use_double_wide_mlp=True,
        attention_k_eq_v=False,
        tie_word_embeddings=True,
    )
    t.pop("num_global_key_value_heads")
    return t


def tiny_gemma4_text_moe(base):
    """Gemma 4's mixture-of-experts block (Gemma 4 26B-A4B enables it;
    neither base does) on the 31B's layer pattern: beside each block's dense
    MLP, a router picks 2 of 8 GELU-gated experts."""
    t = gemma4_text_tiny(base["text_config"], 6, 8, 4, 1)
    t.update(
        model_type="gemma4_text",
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=64,
        tie_word_embeddings=True,
    )
    return t


def init_gemma4(model):
    """Weights as a trained Gemma 4 has them where it matters for a
    comparison at 1e-3: attention is unscaled, so the query and key norms
    scale by head_dim^-1/4 (with unit scales the scores of a random model
    spread over tens and the attention flips between keys at the slightest
    rounding); the final norm scales by 1/16, which keeps the soft-capped
    logits within about 0.25, where a bfloat16 step is under 1e-3; the layer
    scalars are near 1."""

    def adjust(path, v):
        if path.endswith(("q_norm.weight", "k_norm.weight")):
            return v * v.shape[-1] ** -0.25
        if path.endswith("model.norm.weight"):
            return v / 16
        if path.endswith(("layer_scalar", "router.scale", "router.per_expert_scale")):
            return v + 0.2 * mx.random.normal(v.shape)
        return v

    model.update(tree_map_with_path(adjust, model.parameters()))


def init_qwen3_5(model):
    """Logits of a random model scaled down so that their bfloat16 rounding
    step (2^-10 below 0.25) stays under the tests' tolerance."""
    lm = getattr(model, "language_model", model)
    lm.lm_head.weight = lm.lm_head.weight * LM_HEAD_SCALE


# name -> (the real config under tests/fixtures/bases, shrink, init)
ARCHITECTURES = {
    "qwen3_5": ("qwen3_5-27b.config.json", tiny_qwen3_5, init_qwen3_5),
    "qwen3_5_moe": ("qwen3_5_moe-35b-a3b.config.json", tiny_qwen3_5_moe, init_qwen3_5),
    "gemma4_31b": ("gemma-4-31b-it-6bit.config.json", tiny_gemma4_31b, init_gemma4),
    "gemma4_12b": ("gemma-4-12B-it-6bit.config.json", tiny_gemma4_12b, init_gemma4),
    "gemma4_text_shared_kv": (
        "gemma-4-31b-it-6bit.config.json",
        tiny_gemma4_text_shared_kv,
        init_gemma4,
    ),
    "gemma4_text_moe": ("gemma-4-31b-it-6bit.config.json", tiny_gemma4_text_moe, init_gemma4),
}


def build(arch):
    base_file, shrink, init = ARCHITECTURES[arch]
    base = json.loads((ROOT / "tests/fixtures/bases" / base_file).read_text())
    config = shrink(base)
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(SEED)
    model = model_class(args_class.from_dict(config))
    # Norm scales around 1 rather than exactly 1, so a missing or misplaced
    # norm weight shows.
    def jitter(path, v):
        if path.endswith("norm.weight"):
            return v + 0.2 * mx.random.normal(v.shape)
        return v

    model.update(tree_map_with_path(jitter, model.parameters()))
    init(model)
    mx.eval(model.parameters())
    return model, config


def cast(model, dtype):
    predicate = getattr(model, "cast_predicate", lambda _: True)

    def set_dtype(k, v):
        if predicate(k) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(dtype)
        return v

    model.update(tree_map_with_path(set_dtype, model.parameters()))


def gather_mm_f32(a, b, *args, **kwargs):
    """`mx.gather_mm` through float32: MLX's CPU GatherMM takes float32 only,
    so the dense (bf16) experts are multiplied in float32 and the product
    rounded to the input type, as a bfloat16 kernel accumulating in float32
    (Metal's) returns it."""
    out = GATHER_MM(a.astype(mx.float32), b.astype(mx.float32), *args, **kwargs)
    return out.astype(a.dtype)


def gather_qmm_affine(*args, global_scale=None, **kwargs):
    """`mx.gather_qmm` without the `global_scale` keyword, which mlx-lm 0.32.2
    passes (as None for affine quantization) and the installed MLX build does
    not take."""
    if global_scale is not None:
        raise ValueError("global scales are not used by affine conversions")
    return GATHER_QMM(*args, **kwargs)


GATHER_MM, GATHER_QMM = mx.gather_mm, mx.gather_qmm
mx.gather_mm, mx.gather_qmm = gather_mm_f32, gather_qmm_affine


def reference(folder):
    model = load_model(Path(folder))[0]
    write(folder, "reference.safetensors", model)
    if "quantization" in model.args.__dict__ or any(
        "scales" in k for k, _ in tree_flatten(model.parameters())
    ):
        # The same weight values expanded to bfloat16 (what decisio's CPU
        # default runs): mlx-lm's dense computation of them.
        write(folder, "reference_dense.safetensors", dequantize_model(model))


def read(model, ids, cache):
    """The logits of the last chunk of `ids`, read in chunks of CHUNK."""
    for start in range(0, ids.shape[0], CHUNK):
        logits = model(ids[None, start:start + CHUNK], cache=cache)
        mx.eval(logits, [c.state for c in cache])
    return logits


def write(folder, name, model):
    rng = mx.random.key(SEED + 1)
    vocab = model.args.text_config["vocab_size"] if hasattr(model.args, "text_config") else model.args.vocab_size
    out = {}
    for n in LENGTHS:
        rng, k = mx.random.split(rng)
        ids = mx.random.randint(0, vocab, (n,), key=k).astype(mx.int32)
        out[f"ids_{n}"] = ids
        out[f"logits_{n}"] = read(model, ids, model.make_cache())[0, -1].astype(mx.float32)
        mx.eval(out)
    for i, (p, c) in enumerate(PAIRS):
        rng, k1, k2 = mx.random.split(rng, 3)
        prefix = mx.random.randint(0, vocab, (p,), key=k1).astype(mx.int32)
        cont = mx.random.randint(0, vocab, (c,), key=k2).astype(mx.int32)
        cache = model.make_cache()
        read(model, prefix, cache)
        logits = model(cont[None], cache=cache)[0, -1].astype(mx.float32)
        out[f"prefix_{i}"], out[f"cont_{i}"], out[f"cont_logits_{i}"] = prefix, cont, logits
        mx.eval(out)
    for i, (p, n) in enumerate(DECODES):
        rng, k1, k2 = mx.random.split(rng, 3)
        prefix = mx.random.randint(0, vocab, (p,), key=k1).astype(mx.int32)
        steps = mx.random.randint(0, vocab, (n,), key=k2).astype(mx.int32)
        cache = model.make_cache()
        read(model, prefix, cache)
        for t in range(n):
            logits = model(steps[None, t:t + 1], cache=cache)
            mx.eval(logits, [c.state for c in cache])
        out[f"decode_prefix_{i}"], out[f"decode_steps_{i}"] = prefix, steps
        out[f"decode_logits_{i}"] = logits[0, -1].astype(mx.float32)
        mx.eval(out)
    mx.save_safetensors(
        os.path.join(folder, name),
        out,
        metadata={"reference": "mlx-lm 0.32.2", "lengths": ",".join(map(str, LENGTHS))},
    )


def stamp(arch):
    """What an architecture's files depend on: this script, its real config
    and the MLX version. A folder whose stamp matches is not rebuilt."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update((ROOT / "tests/fixtures/bases" / ARCHITECTURES[arch][0]).read_bytes())
    h.update(mx.__version__.encode())
    return h.hexdigest()


def main():
    out_dir = Path(sys.argv[1]) / "tiny"
    archs = sys.argv[2:] or list(ARCHITECTURES)
    for arch in archs:
        stamp_file = out_dir / f"{arch}.stamp"
        if stamp_file.exists() and stamp_file.read_text() == stamp(arch):
            continue
        started = time.time()
        for name, bits in QUANTS:
            model, config = build(arch)
            cast(model, mx.bfloat16)
            if bits is not None:
                model, config = quantize_model(model, config, 64, bits)
            folder = out_dir / f"{arch}-{name}"
            save_model(folder, model)
            save_config(config, config_path=folder / "config.json")
            reference(folder)
        stamp_file.write_text(stamp(arch))
        print(f"[reference] {arch}: bf16, 6bit, 4bit in {time.time() - started:.0f} s -> {out_dir}")


if __name__ == "__main__":
    main()
