"""Tiny random-weight Gemma 4 conversions and mlx-lm's logits on them.

Usage: python scripts/reference/tiny_gemma4.py OUT_DIR

For each tiny model below, builds the model with mlx-lm 0.32.2's own
classes from a config that keeps the structure of a real one (its feature
flags, the layer-type pattern, head ratios, rope parameters, KV sharing and
per-layer inputs where the real config has them) with fewer and narrower
layers, a vocabulary of 1,024 and a sliding window of 64, so that prompts of
up to 2,000 tokens run far beyond the window. The weights are random (fixed
seed). Each model is saved with mlx-lm's own code as MLX conversions in bf16
and quantized at 6 and 4 bits (affine, group size 64, with the model's own
quantization predicate, as `mlx_lm convert -q` does):

    OUT_DIR/<model>/<bf16|6bit|4bit>/            config.json, model.safetensors
    OUT_DIR/<model>/<bf16|6bit|4bit>.safetensors the reference figures

Each reference file holds, read back through mlx-lm's loader:
  - `ids_i`, `logits_i`: token ids of a prompt and the float32 logits of its
    last position on a fresh cache (prompts of 1 to 2,000 tokens);
  - `prefix_j`, `suffix_j`, `cont_j`: a prefix run through mlx-lm's caches
    (KVCache and RotatingKVCache) in chunks of 256, then a continuation in
    one call, and the float32 logits of the continuation's last position.
"""

import hashlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import gemma4, gemma4_text
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

HERE = os.path.dirname(os.path.abspath(__file__))
BASES = os.path.join(HERE, "..", "..", "tests", "fixtures", "bases")

VOCAB = 1024
WINDOW = 64
LENGTHS = [1, 2, 5, 63, 64, 65, 130, 257, 700, 2000]
# (prefix, continuation) lengths: within the window, beyond it, a single
# token, and a continuation longer than the window itself.
CONTINUATIONS = [(40, 30), (300, 1), (300, 17), (300, 100), (600, 257)]
CHUNK = 256


def shrink(text, layers, heads, kv_heads, global_kv_heads):
    """The real text config with its sizes cut down and its flags kept."""
    t = dict(text)
    t.update(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_global_key_value_heads=global_kv_heads,
        head_dim=32,
        global_head_dim=64,
        sliding_window=WINDOW,
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        max_position_embeddings=4096,
        layer_types=text["layer_types"][:layers],
    )
    return t


def real(name):
    with open(os.path.join(BASES, name)) as f:
        return json.load(f)


def tiny_configs():
    """name -> (model config, model class)."""
    out = {}
    # Gemma 4 31B: 32 query heads over 16 KV heads on sliding layers and 4
    # shared key/value heads (attention_k_eq_v) on full layers: ratios 2 and 8.
    c31 = real("gemma-4-31b-it-6bit.config.json")
    t = shrink(c31["text_config"], layers=6, heads=8, kv_heads=4, global_kv_heads=1)
    out["gemma4-31b"] = {"model_type": "gemma4", "text_config": t, "vocab_size": VOCAB,
                         "tie_word_embeddings": True}
    # Gemma 4 12B: 16 query heads over 8 KV heads, also 8 on full layers.
    c12 = real("gemma-4-12B-it-6bit.config.json")
    t = shrink(c12["text_config"], layers=6, heads=4, kv_heads=2, global_kv_heads=2)
    out["gemma4-12b"] = {"model_type": "gemma4", "text_config": t, "vocab_size": VOCAB,
                         "tie_word_embeddings": True}
    # The remaining features of the architecture, which neither base enables:
    # per-layer inputs, KV-shared layers, the double-wide MLP of shared layers,
    # separate values on full layers (mlx-lm's gemma4_text defaults are this
    # kind of model), as a text-only `gemma4_text` conversion.
    defaults = gemma4_text.ModelArgs()
    t = {
        "model_type": "gemma4_text",
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 7,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_kv_shared_layers": 3,
        "hidden_size_per_layer_input": 16,
        "vocab_size": VOCAB,
        "vocab_size_per_layer_input": VOCAB,
        "sliding_window": WINDOW,
        "layer_types": (["sliding_attention"] * 2 + ["full_attention"]) * 2 + ["sliding_attention"],
        "rope_parameters": defaults.rope_parameters,
        "use_double_wide_mlp": True,
        "attention_k_eq_v": False,
        "final_logit_softcapping": 30.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    }
    out["gemma4-shared-kv"] = t
    return out


def build(config, seed):
    """The model with every parameter random, in bf16.

    Norm scales and layer scalars are near 1, except two, set as a trained
    model has them: the query and key norms scale by head_dim^-1/4 (the
    attention is unscaled; with unit scales a random model's scores spread
    over tens and its attention flips between keys at the slightest
    rounding), and the final norm by 1/16, which keeps the logits within
    about 0.25, where one bf16 unit in the last place is under 1e-3 (mlx-lm
    computes the logits in bf16, so a comparison at 1e-3 needs them there).
    """
    if config["model_type"] == "gemma4":
        model = gemma4.Model(gemma4.ModelArgs.from_dict(config))
    else:
        model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(config))
    mx.random.seed(seed)
    params = []
    for path, p in tree_flatten(model.parameters()):
        if "norm" in path or path.endswith("layer_scalar") or path.endswith(".scale"):
            v = 1.0 + 0.2 * mx.random.normal(p.shape)
            if path.endswith(("q_norm.weight", "k_norm.weight")):
                v = v * p.shape[-1] ** -0.25
            elif path.endswith("model.norm.weight"):
                v = v / 16
        elif "embed" in path:
            v = mx.random.normal(p.shape) * (p.shape[-1] ** -0.5)
        else:
            v = mx.random.normal(p.shape) * (p.shape[-1] ** -0.5)
        params.append((path, v.astype(mx.bfloat16)))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def save(model, config, path, bits):
    config = json.loads(json.dumps(config))
    if bits is not None:
        model, config = quantize_model(model, config, 64, bits)
    os.makedirs(path, exist_ok=True)
    save_model(path, model)
    save_config(config, os.path.join(path, "config.json"))


def last_logits(model, ids, cache=None):
    out = model(mx.array(ids, dtype=mx.int32)[None], cache=cache)
    return out[0, -1].astype(mx.float32)


def reference(path):
    model, _ = load_model(Path(path))
    rng = random.Random(1234)
    out = {}
    for i, n in enumerate(LENGTHS):
        ids = [rng.randrange(VOCAB) for _ in range(n)]
        out[f"ids_{i}"] = mx.array(ids, dtype=mx.int32)
        out[f"logits_{i}"] = last_logits(model, ids)
        mx.eval(out)
    for j, (p, s) in enumerate(CONTINUATIONS):
        prefix = [rng.randrange(VOCAB) for _ in range(p)]
        suffix = [rng.randrange(VOCAB) for _ in range(s)]
        cache = model.make_cache()
        for k in range(0, p, CHUNK):
            model(mx.array(prefix[k:k + CHUNK], dtype=mx.int32)[None], cache=cache)
            mx.eval([c.state for c in cache])
        out[f"prefix_{j}"] = mx.array(prefix, dtype=mx.int32)
        out[f"suffix_{j}"] = mx.array(suffix, dtype=mx.int32)
        out[f"cont_{j}"] = last_logits(model, suffix, cache)
        mx.eval(out)
    return out


def stamp(config):
    """What the figures depend on: this script and the tiny config."""
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    h.update(json.dumps(config, sort_keys=True).encode())
    h.update(mx.__version__.encode())
    return h.hexdigest()


def main():
    out_dir = sys.argv[1]
    for m, (name, config) in enumerate(tiny_configs().items()):
        started = time.time()
        stamp_file = os.path.join(out_dir, name, "stamp")
        want = stamp(config)
        if os.path.exists(stamp_file) and open(stamp_file).read() == want:
            continue
        if os.path.exists(os.path.join(out_dir, name)):
            shutil.rmtree(os.path.join(out_dir, name))
        for quant, bits in (("bf16", None), ("6bit", 6), ("4bit", 4)):
            model = build(config, seed=m)
            path = os.path.join(out_dir, name, quant)
            save(model, config, path, bits)
            ref = reference(path)
            mx.save_safetensors(path + ".safetensors", ref,
                                metadata={"reference": "mlx-lm 0.32.2", "model": name,
                                          "quantization": quant})
        with open(stamp_file, "w") as f:
            f.write(want)
        print(f"[reference] {name}: bf16, 6bit, 4bit -> {os.path.join(out_dir, name)} "
              f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
