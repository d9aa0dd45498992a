#!/usr/bin/env bash
# Build llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) from PyPI source into
# its own cached virtualenv, plus the pinned `gguf` package used by convert_gguf.py.
# Never touches the project's .venv. Prints the venv's python path on the last line of stdout.
#
# Env: FREETOKEN_CACHE (default ~/.cache/freetoken) -> venv at $FREETOKEN_CACHE/peers/llamacpp-<ver>-venv
#      PEER_PYTHON (default python3.11, then python3): interpreter for the new venv
#      CMAKE_ARGS (default "-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF")
#      CMAKE_BUILD_PARALLEL_LEVEL (default: nproc)
set -euo pipefail
LLAMA_CPP_PYTHON_VERSION=0.3.36
GGUF_VERSION=0.19.0
CACHE_ROOT="${FREETOKEN_CACHE:-$HOME/.cache/freetoken}/peers"
VENV="$CACHE_ROOT/llamacpp-$LLAMA_CPP_PYTHON_VERSION-venv"
STAMP="$VENV/.freetoken-peer-ready"
LOG="$CACHE_ROOT/llamacpp-$LLAMA_CPP_PYTHON_VERSION-build.log"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "import llama_cpp, gguf, uvicorn" 2>/dev/null; then
    echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION already installed in $VENV" >&2
    echo "$VENV/bin/python"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
PY="${PEER_PYTHON:-$(command -v python3.11 || command -v python3)}"
command -v cmake >/dev/null || { echo "error: cmake not found (apt-get install cmake)" >&2; exit 2; }
command -v c++ >/dev/null || { echo "error: no C++ compiler found (apt-get install g++)" >&2; exit 2; }
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"

export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
echo "building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION from source (CMAKE_ARGS=$CMAKE_ARGS," \
     "parallel=$CMAKE_BUILD_PARALLEL_LEVEL); log: $LOG" >&2
start=$(date +%s)
if ! "$VENV/bin/pip" install --no-cache-dir --no-binary llama-cpp-python -v \
        "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" "gguf==$GGUF_VERSION" >"$LOG" 2>&1; then
    echo "error: llama-cpp-python build failed after $(( $(date +%s) - start )) s; last lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
fi
elapsed=$(( $(date +%s) - start ))
"$VENV/bin/python" -c "import llama_cpp, gguf; print('llama_cpp', llama_cpp.__version__, 'gguf ok')" >&2
echo "build_seconds=$elapsed" > "$STAMP"
echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION built in $elapsed s into $VENV" >&2
echo "$VENV/bin/python"
