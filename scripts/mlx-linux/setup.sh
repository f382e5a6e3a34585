#!/usr/bin/env bash
# Makes the crates.io mlx-rs build on Linux (x86_64 and aarch64) on MLX's
# CPU backend, and lets an x86_64 Linux machine compile-check decisio for
# macOS and aarch64 Linux.
#
# mlx-sys's own build script fetches MLX from the network with CMake and links
# macOS frameworks; on Linux we replace it through cargo's build-script
# override for `links = "mlx"`:
#   1. libmlx.so comes from the PyPI wheel mlx-cpu (the MLX that mlx-c pins),
#   2. mlx-c (the sources inside the mlx-sys crate) is built against it,
#   3. bindings.rs is generated with the bindgen CLI, mlx-sys's options,
#   4. .cargo/config.toml (git-ignored) points cargo at the artefacts.
# On x86_64 it also installs the Rust standard libraries of the checked
# targets and writes the overrides with which `cargo check --target T`
# compiles decisio for them without a macOS SDK or a cross toolchain
# (scripts/check-targets.sh; docs/building.md, "Compile checks").
# Everything is cached under $DECISIO_CACHE; a second run does nothing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
MLX_VERSION=0.32.2
MLX_SYS_VERSION=0.7.0
BINDGEN_VERSION=0.72.1
OUT=$CACHE/mlx-linux-$MLX_VERSION-sys$MLX_SYS_VERSION
COMPAT=$ROOT/scripts/mlx-linux/compat.h
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
say() { echo "[mlx-linux] $*"; }

case "$TRIPLE" in
  x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) ;;
  *-apple-darwin) say "macOS: mlx-rs builds with Metal as published, nothing to do"; exit 0 ;;
  *) echo "error: no MLX recipe for $TRIPLE (supported: x86_64 and aarch64 Linux, macOS)" >&2; exit 1 ;;
esac
# The targets compile-checked here: from x86_64 Linux, the other two.
CHECK_TARGETS=()
[ "$TRIPLE" = x86_64-unknown-linux-gnu ] && CHECK_TARGETS=(aarch64-apple-darwin aarch64-unknown-linux-gnu)

if ! command -v bindgen >/dev/null || ! bindgen --version | grep -q "$BINDGEN_VERSION"; then
  say "installing bindgen-cli $BINDGEN_VERSION (once, about 2 minutes)"
  cargo install --locked --quiet bindgen-cli --version "$BINDGEN_VERSION"
fi

mkdir -p "$OUT/lib" "$OUT/build"
MLXC=$OUT/src/mlx-sys-$MLX_SYS_VERSION/src/mlx-c

# bindings OUT_FILE TARGET: mlx-c's headers (mlx/c/*.h, in sorted order)
# through the bindgen CLI with mlx-sys's own options, for the Rust target
# TARGET. For aarch64 Linux, two adjustments:
#  - Debian 12's libclang declares `__bf16` (mlx-c's half.h includes
#    arm_bf16.h on aarch64) only with the bf16 target feature;
#  - mlx-rs 0.33 passes `mlx_pad`'s `mode` as `*const i8` where the header
#    says `const char*`, and aarch64 Linux's `c_char` is `u8`: that one
#    parameter is written `*const i8` (the same pointer on the C side).
bindings() {
  local out=$1 target=$2 clang=()
  case "$target" in
    "$TRIPLE") ;;
    aarch64-unknown-linux-gnu) clang=(--target=aarch64-linux-gnu -isystem /usr/aarch64-linux-gnu/include) ;;
    # No macOS SDK here: the host's C headers stand in for libc's, which
    # decisio does not use; every mlx-c declaration is the same.
    aarch64-apple-darwin) ;;
  esac
  [ "$target" = aarch64-unknown-linux-gnu ] && clang+=(-Xclang -target-feature -Xclang +bf16)
  (cd "$MLXC" && for h in $(ls mlx/c/*.h | LC_ALL=C sort); do echo "#include \"$h\""; done) > "$OUT/build/all.h" || return 1
  bindgen --rust-target 1.73.0 --blocklist-function malloc --blocklist-function realloc \
    "$OUT/build/all.h" -o "$out.tmp" -- -I"$MLXC" -include "$COMPAT" "${clang[@]}" || return 1
  if [ "$target" = aarch64-unknown-linux-gnu ]; then
    python3 - "$out.tmp" <<'PY'
import re
import sys

path = sys.argv[1]
text = open(path).read()
text, n = re.subn(
    r"(pub fn mlx_pad\([^)]*?mode: )\*const ::std::os::raw::c_char", r"\1*const i8", text
)
if n != 1:
    sys.exit(f"error: expected one mlx_pad mode parameter in {path}, found {n}")
open(path, "w").write(text)
PY
  fi || return 1
  mv "$out.tmp" "$out"
}

PREFIX=$OUT/wheel/mlx
if [ ! -f "$PREFIX/lib/libmlx.so" ]; then
  say "fetching mlx-cpu==$MLX_VERSION from PyPI"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$OUT/dl" "mlx-cpu==$MLX_VERSION"
  rm -rf "$OUT/wheel"
  # Unzipped in place: libmlx.so finds its BLAS through $ORIGIN/../../mlx_cpu.libs.
  python3 -m zipfile -e "$OUT"/dl/mlx_cpu-"$MLX_VERSION"-*.whl "$OUT/wheel"
fi

if [ ! -f "$OUT/lib/libmlxc.a" ] || [ ! -f "$OUT/lib/bindings.rs" ]; then
  (cd "$ROOT" && cargo fetch --quiet)
  CRATE=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/mlx-sys-$MLX_SYS_VERSION.crate | head -1)
  [ -f "$CRATE" ] || { echo "error: mlx-sys $MLX_SYS_VERSION is not in cargo's cache; run cargo fetch" >&2; exit 1; }
  rm -rf "$OUT/src" && mkdir -p "$OUT/src" && tar xzf "$CRATE" -C "$OUT/src"
  say "building mlx-c against the wheel's MLX"
  cmake -S "$MLXC" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DMLX_C_USE_SYSTEM_MLX=ON \
    -DMLX_DIR="$PREFIX/share/cmake/MLX" -DMLX_C_BUILD_EXAMPLES=OFF \
    -DCMAKE_CXX_FLAGS="-include $COMPAT" >/dev/null
  cmake --build "$OUT/build" -j"$(nproc)" >/dev/null
  cp "$OUT/build/libmlxc.a" "$OUT/lib/"
  cc -O2 -fPIC -c "$ROOT/scripts/mlx-linux/mach_time.c" -o "$OUT/build/mach_time.o"
  ar rcs "$OUT/lib/libmach_time.a" "$OUT/build/mach_time.o"
  say "generating bindings"
  bindings "$OUT/lib/bindings.rs" "$TRIPLE"
fi

# The wheel's libmlx.so brings the reference (netlib) BLAS, about 80 times
# slower than OpenBLAS on a float32 matmul here. Linking OpenBLAS into the
# binary ahead of libmlx.so makes the dynamic linker resolve MLX's BLAS calls
# to it (the wheel's library is still loaded, but unused).
OPENBLAS=$(ls /usr/lib/"$(gcc -dumpmachine)"/libopenblas.so.0 2>/dev/null || true)
BLAS_FLAGS=""
if [ -n "$OPENBLAS" ]; then
  BLAS_FLAGS=', "-C", "link-arg=-Wl,--push-state,--no-as-needed,'"$OPENBLAS"',--pop-state"'
else
  say "warning: OpenBLAS (Debian libopenblas0-pthread) not found; MLX will use the slow reference BLAS"
fi

# The checked targets: their standard library (rustup), their bindings, and
# overrides for every dependency whose build script compiles C for the
# target (mlx-sys, ring, zstd-sys): `cargo check` links nothing, so the
# overrides name no library. ring's `links` name carries its version.
RING=$(sed -n '/^name = "ring"$/{n;s/^version = "\(.*\)"$/\1/p;}' "$ROOT/Cargo.lock" | head -1)
CHECKS=""
command -v rustup >/dev/null || {
  [ ${#CHECK_TARGETS[@]} = 0 ] || say "warning: no rustup; the compile checks of ${CHECK_TARGETS[*]} cannot run"
  CHECK_TARGETS=()
}
for target in "${CHECK_TARGETS[@]}"; do
  # Without its standard library a target gets no override, and
  # scripts/check-targets.sh fails naming it; the rest of the set-up goes on.
  rustup target list --installed | grep -qx "$target" || {
    say "installing the Rust standard library for $target"
    rustup target add "$target" >/dev/null || {
      say "warning: rustup could not install $target; its compile check will fail"
      continue
    }
  }
  dir=$OUT/check/$target
  if [ ! -f "$dir/bindings.rs" ]; then
    say "generating bindings for $target"
    mkdir -p "$dir"
    bindings "$dir/bindings.rs" "$target" || {
      say "warning: no bindings for $target; its compile check will fail"
      continue
    }
  fi
  CHECKS+="
[target.$target.mlx]
rustc-env = { OUT_DIR = \"$dir\" }
[target.$target.ring_core_${RING//./_}_]
[target.$target.zstd]
"
done

mkdir -p "$ROOT/.cargo"
cat > "$ROOT/.cargo/config.toml" <<EOT
# Generated by scripts/mlx-linux/setup.sh for this machine; not committed.
[target.$TRIPLE.mlx]
rustc-link-search = ["native=$OUT/lib", "native=$PREFIX/lib"]
rustc-link-lib = ["static=mlxc", "static=mach_time", "dylib=mlx", "dylib=stdc++"]
rustc-env = { OUT_DIR = "$OUT/lib" }

[target.$TRIPLE]
rustflags = ["-C", "link-arg=-Wl,-rpath,$PREFIX/lib"$BLAS_FLAGS]
$CHECKS
EOT
say "ready: $OUT"
