"""A random-weight Qwen3.6-35B-A3B conversion at the real layer widths with
a few layers, for measuring prefill on the CPU at the widths a Mac runs.

Usage: python scripts/bench/wide_model.py OUT_DIR [--layers 4] [--bits 4]

Takes the real config (tests/fixtures/bases/qwen3_5_moe-35b-a3b.config.json),
keeps every width (hidden 2048, 16 query and 2 KV heads of 256, linear
attention 16 key and 32 value heads of 128, 256 experts of 512 with 8 per
token, the shared expert) and sets the depth to `--layers` (every 4th layer
full attention, as in the base) and the vocabulary to 32,768 (the output
layer reads one position per prompt; the real 248,320 only costs memory).
The weights are mlx-lm's own initialisation with a fixed seed, cast to
bfloat16 and quantized with mlx-lm's `quantize_model` (group size 64), saved
as `mlx_lm.convert` saves. A folder whose `stamp` matches is kept.
"""

import argparse
import copy
import hashlib
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests/fixtures/bases/qwen3_5_moe-35b-a3b.config.json"
SEED = 20261202
VOCAB = 32768


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--bits", type=int, default=4)
    a = ap.parse_args()
    stamp = hashlib.sha256(Path(__file__).read_bytes() + BASE.read_bytes()
                           + f"{a.layers} {a.bits} {mx.__version__}".encode()).hexdigest()
    if (a.out / "stamp").exists() and (a.out / "stamp").read_text() == stamp:
        print(f"[wide] {a.out} is up to date")
        return
    config = copy.deepcopy(json.loads(BASE.read_text()))
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    t = config["text_config"]
    t.update(num_hidden_layers=a.layers, vocab_size=VOCAB)
    t.pop("mtp_num_hidden_layers", None)
    model_class, args_class = _get_classes(config)
    mx.random.seed(SEED)
    model = model_class(args_class.from_dict(config))
    model.update(tree_map(lambda v: v.astype(mx.bfloat16) if mx.issubdtype(v.dtype, mx.floating) else v,
                          model.parameters()))
    mx.eval(model.parameters())
    model, config = quantize_model(model, config, 64, a.bits)
    a.out.mkdir(parents=True, exist_ok=True)
    save_model(a.out, model)
    save_config(config, config_path=a.out / "config.json")
    (a.out / "stamp").write_text(stamp)
    print(f"[wide] wrote {a.out} ({a.layers} layers, {a.bits}-bit)")


if __name__ == "__main__":
    main()
