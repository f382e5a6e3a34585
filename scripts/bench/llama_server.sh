#!/usr/bin/env bash
# llama.cpp's server, the CPU peer of the benchmarks, built from a registry
# package: the PyPI source distribution of llama-cpp-python, which vendors
# llama.cpp whole (tools/server included). Built once per pinned version into
# $DECISIO_CACHE/llama.cpp-<version>/ (llama-server, llama-quantize), CPU only,
# for this processor (GGML_NATIVE), without the web UI, curl or OpenSSL.
#
# Also writes the fixture's GGUF at float32 next to it: llama-quantize turns
# the shipped Q4_1 file's blocks back into the float32 values decisio's dense
# copy holds (the same dequantization), so both servers multiply the same
# numbers at the same precision.
#
# Prints the directory. Needs cmake and a C++ compiler (Debian: cmake, g++).
set -euo pipefail

VERSION=0.3.36
CACHE=${DECISIO_CACHE:-$HOME/.cache/decisio}
PYTHON=${PYTHON:-$CACHE/venv/bin/python}
OUT=$CACHE/llama.cpp-$VERSION
GGUF=$CACHE/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

if [[ ! -x $OUT/llama-server || ! -x $OUT/llama-quantize ]]; then
    for tool in cmake g++; do
        command -v "$tool" >/dev/null || {
            echo "llama_server.sh: $tool is missing (Debian: apt-get install cmake g++)" >&2
            exit 1
        }
    done
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --no-binary=:all: \
        "llama-cpp-python==$VERSION" -d "$work" >&2
    tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
    src=$work/llama_cpp_python-$VERSION/vendor/llama.cpp
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DBUILD_SHARED_LIBS=OFF >&2
    cmake --build "$work/build" --target llama-server llama-quantize -j "$(nproc)" >&2
    mkdir -p "$OUT"
    cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" "$OUT/"
fi

if [[ ! -f $OUT/smollm2-135m-instruct-f32.gguf ]]; then
    "$OUT/llama-quantize" --allow-requantize "$GGUF" "$OUT/smollm2-135m-instruct-f32.gguf" F32 >&2
fi
echo "$OUT"
