#!/usr/bin/env bash
# Installs the reference decisio 0.35.0 (PyPI `decisio`) into vLLM's CPU
# venv ($DECISIO_CACHE/vllm-venv, scripts/vllm-cpu/setup.sh), once: the
# oracle the System One tests compare decisio with, request by request, on
# the same fixture and the same engine.
#
# It declares Python >=3.12; every file of it compiles and runs under the
# venv's 3.11, so it is installed with --ignore-requires-python and without
# its dependencies (vLLM's venv has them, less scipy). Two of its lines
# assume a CUDA device; in the installed copy only, they are changed:
# - serve/vllm_engine.py, LettersEngine.facts(): the device's name is "cpu"
#   where torch sees no CUDA (torch.cuda.get_device_name raises there);
# - serve/engine_stream.py, capture(): vLLM's CPU platform gives a stream
#   placeholder that torch.cuda.set_stream refuses; no stream is bound then.
set -euo pipefail
export DECISIO_CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
VENV=$DECISIO_CACHE/vllm-venv
VERSION=0.35.0
STAMP=$VENV/.reference-decisio
[ -x "$VENV/bin/python" ] || { echo "[setup] no vLLM venv at $VENV; run scripts/vllm-cpu/setup.sh first" >&2; exit 1; }
[ "$VERSION" = "$(cat "$STAMP" 2>/dev/null)" ] && exit 0
echo "[setup] installing the reference decisio $VERSION into $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --ignore-requires-python "decisio==$VERSION"
"$VENV/bin/pip" install -q --disable-pip-version-check scipy
PKG=$("$VENV/bin/python" -c 'import decisio, os; print(os.path.dirname(decisio.__file__))')
"$VENV/bin/python" - "$PKG" <<'PY'
import sys
from pathlib import Path
pkg = Path(sys.argv[1])
def change(path, old, new):
    text = path.read_text()
    if new in text:
        return
    if old not in text:
        sys.exit(f"{path}: the line to change is not there; the reference's pin moved?")
    path.write_text(text.replace(old, new, 1))
change(pkg / "serve/vllm_engine.py", '"gpu": torch.cuda.get_device_name(0),',
       '"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",')
change(pkg / "serve/engine_stream.py", "        return current_stream()\n",
       "        stream = current_stream()\n"
       "        return None if type(stream).__name__ == \"_StreamPlaceholder\" else stream\n")
PY
printf '%s' "$VERSION" > "$STAMP"
