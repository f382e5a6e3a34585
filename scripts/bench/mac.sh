#!/usr/bin/env bash
# decisio against mlx_lm.server on the same MLX conversions: a new state, a
# seen state, many questions on one state, peak memory (scripts/bench/mac.py
# says what and how). The same on macOS and Linux; arguments go to mac.py.
#   scripts/bench/mac.sh [--models NAME=FOLDER_OR_REPO ...] [--quick] [--out DIR]
set -euo pipefail
export DECISIO_CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
exec "$DECISIO_CACHE/venv/bin/python" "$(dirname "$0")/mac.py" "$@"
