#!/usr/bin/env bash
# Build llama.cpp's own llama-server and llama-bench binaries (what users run) from the llama.cpp
# source vendored in the llama-cpp-python sdist on PyPI, plus a small venv with the pinned `gguf`
# package for evals/peers/convert_gguf.py. Cached; prints two lines on stdout:
#   BIN=<folder with llama-server, llama-bench and their shared libraries>
#   GGUF_PYTHON=<python of the gguf venv>
#
# Env: FREETOKEN_CACHE (default ~/.cache/freetoken) -> $FREETOKEN_CACHE/peers/llamacpp-tools-<ver>
#      CMAKE_BUILD_PARALLEL_LEVEL (default: nproc); about 20 min on 2 cores, once.
set -euo pipefail
LLAMA_CPP_PYTHON_VERSION=0.3.36
GGUF_VERSION=0.19.0
ROOT="${FREETOKEN_CACHE:-$HOME/.cache/freetoken}/peers/llamacpp-tools-$LLAMA_CPP_PYTHON_VERSION"
BIN="$ROOT/build/bin"
GGUF_VENV="$ROOT/gguf-$GGUF_VERSION-venv"
LOG="$ROOT/build.log"
mkdir -p "$ROOT"

if [[ ! -x "$BIN/llama-server" || ! -x "$BIN/llama-bench" ]]; then
    command -v cmake >/dev/null || { echo "error: cmake not found (apt-get install cmake)" >&2; exit 2; }
    command -v c++ >/dev/null || { echo "error: no C++ compiler found (apt-get install g++)" >&2; exit 2; }
    if [[ ! -d "$ROOT/src" ]]; then
        python3 -m pip download -q --no-deps --no-binary :all: -d "$ROOT/sdist" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
        tar xzf "$ROOT/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$ROOT"
        mv "$ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" "$ROOT/src"
        rm -rf "$ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION" "$ROOT/sdist"
    fi
    echo "building llama-server and llama-bench (log: $LOG) ..." >&2
    start=$(date +%s)
    if ! { cmake -S "$ROOT/src" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
              -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF \
              -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
           && cmake --build "$ROOT/build" --target llama-server llama-bench \
              -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"; } >"$LOG" 2>&1; then
        echo "error: llama.cpp build failed; last lines of $LOG:" >&2
        tail -n 30 "$LOG" >&2
        exit 1
    fi
    echo "built in $(( $(date +%s) - start )) s" >&2
fi
if ! "$GGUF_VENV/bin/python" -c "import gguf, numpy" 2>/dev/null; then
    python3 -m venv "$GGUF_VENV"
    "$GGUF_VENV/bin/pip" install -q "gguf==$GGUF_VERSION" numpy >&2
fi
echo "BIN=$BIN"
echo "GGUF_PYTHON=$GGUF_VENV/bin/python"
