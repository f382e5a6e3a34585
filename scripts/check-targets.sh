#!/usr/bin/env bash
# Compile checks of the targets this machine cannot run: `cargo clippy
# --all-targets -D warnings` for macOS on Apple silicon (aarch64-apple-darwin)
# and aarch64 Linux, so a change that breaks their build fails here.
# scripts/mlx-linux/setup.sh installed their standard libraries and wrote the
# overrides that stand in for the build scripts compiling C for them
# (docs/building.md, "Compile checks"). Nothing is linked or run: what only
# runs on Metal is checked by compilation alone.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
if [ "$host" != x86_64-unknown-linux-gnu ]; then
  echo "[targets] the compile checks run from x86_64 Linux; nothing to do on $host"
  exit 0
fi
for target in aarch64-apple-darwin aarch64-unknown-linux-gnu; do
  if ! grep -q "^\[target\.$target\.mlx\]" .cargo/config.toml 2>/dev/null; then
    echo "error: no override for $target in .cargo/config.toml; run scripts/setup.sh (it needs rustup and its target $target)" >&2
    exit 1
  fi
  echo "[targets] cargo clippy --target $target"
  cargo clippy --locked --quiet --target "$target" --all-targets -- -D warnings
done
