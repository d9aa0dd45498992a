#!/usr/bin/env bash
# FreeToken vs llama.cpp on identical weights: one command, one report.
#
# Usage: bash evals/peers/compare_llamacpp.sh [options]
#
# Options (default in brackets):
#   --arch FAMILY         qwen3_moe, qwen3_next, qwen3_5_moe, glm4_moe or gpt_oss: FreeToken's
#                         seeded `small` preset of that family, converted to llama.cpp's qwen3moe /
#                         qwen3next / qwen35moe / glm4moe / gpt-oss [qwen3_moe]
#   --limit-turns N       model calls replayed per workload, positive integer [8]
#   --workloads "W1 W2"   workloads to replay, any of W1 W2 W3 W4 ["W1 W2"]
#   --traces DIR          traces folder passed to evals/run.py [$FREETOKEN_SHARED/traces, else
#                         <repo>/../shared/traces: the same default as evals/run.py]
#   --allow-synthetic     replay the built-in synthetic traces when the traces folder is missing
#                         (or with --traces synthetic); refused otherwise: timings on generated
#                         text say nothing about agent workloads [off]
#   --out DIR             output folder [replay-out/peers-llamacpp-<date>-<time>]
#   --w1-max-tokens N     output tokens of each W1 call, positive integer [256]
#   --outtype f32|bf16|mxfp4
#                         GGUF weights and compute dtype of both engines [f32]; mxfp4 (gpt_oss
#                         only): the released MXFP4 experts kept on both sides, the rest bf16
#   --n-ctx TOKENS        context length of both engines, positive integer [32768]
#   --threads N           CPU threads of llama.cpp, positive integer [nproc]
#   --parity-tokens N     greedy tokens per prompt of the conversion proof, positive integer [48]
#   --llama-kv f32|f16    llama.cpp KV cache dtype [f32, like FreeToken's]
#   --skip-parity         skip the conversion proof
#   --fresh-gguf          convert again even when the cached GGUF is up to date
#   -h, --help            this text
#
# Environment: FT_PORT [8411] and LL_PORT [8412] (the two servers' ports), FREETOKEN_CACHE
# [~/.cache/freetoken] (peer venv, checkpoint, GGUF cache), FREETOKEN_PYTHON [<repo>/.venv/bin/python],
# FREETOKEN_SHARED (the traces default, see --traces).
#
# Steps (each one logged to DIR/log/):
#  1. evals/peers/install_llamacpp.sh: llama-cpp-python[server] built from PyPI source into its own
#     cached venv ($FREETOKEN_CACHE/peers/, never the project .venv) + gguf==0.19.0.
#  2. FreeToken's `small` checkpoint of --arch (make-tiny, cached under $FREETOKEN_CACHE/models).
#  3. GGUF conversion with the project's evals/peers/convert_gguf.py (cached by checkpoint stamp +
#     converter source hash; --fresh-gguf forces it); GGUFs of older converter versions in the
#     cache are deleted when a new one is written (evals/peers/gguf_cache.py).
#  4. Conversion proof: greedy tokens + logprobs of FreeToken's engine vs llama.cpp on the same ids
#     (ref_freetoken.py + parity_llamacpp.py) -> DIR/parity.md.
#  5. Both servers on the same weights and dtype, then evals/run.py per workload against each
#     (FreeToken first, llama.cpp second, per workload), evals/compare.py per workload.
#  6. DIR/report.md: settings (traces source included), parity, one table per workload (ratios
#     vs FreeToken).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${FREETOKEN_PYTHON:-$REPO/.venv/bin/python}"
CACHE="${FREETOKEN_CACHE:-$HOME/.cache/freetoken}"

ARCH=qwen3_moe
LIMIT_TURNS=8
WORKLOADS="W1 W2"
OUT="$REPO/replay-out/peers-llamacpp-$(date +%Y%m%d-%H%M%S)"
W1_MAX_TOKENS=256
LLAMA_KV=f32
OUTTYPE=f32
N_CTX=32768
THREADS="$(nproc)"
PARITY_TOKENS=48
SKIP_PARITY=0
FRESH_GGUF=0
FT_PORT="${FT_PORT:-8411}"
LL_PORT="${LL_PORT:-8412}"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
die_usage() { echo "error: $*" >&2; echo "(bash $0 --help lists the options)" >&2; exit 2; }
need_value() {  # option, number of arguments left, the next argument
    [[ "$2" -ge 2 && "$3" != --* ]] || die_usage "option $1 needs a value"
}
positive_int() {  # option value
    [[ "$2" =~ ^[0-9]+$ && "$2" =~ [1-9] ]] || die_usage "$1 must be a positive integer (got '$2')"
}
TRACES=""
ALLOW_SYNTHETIC=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --arch) need_value "$1" $# "${2:-}"; ARCH="$2"; shift 2 ;;
        --limit-turns) need_value "$1" $# "${2:-}"; LIMIT_TURNS="$2"; shift 2 ;;
        --workloads) need_value "$1" $# "${2:-}"; WORKLOADS="$2"; shift 2 ;;
        --traces) need_value "$1" $# "${2:-}"; TRACES="$2"; shift 2 ;;
        --allow-synthetic) ALLOW_SYNTHETIC=1; shift ;;
        --out) need_value "$1" $# "${2:-}"; OUT="$2"; shift 2 ;;
        --w1-max-tokens) need_value "$1" $# "${2:-}"; W1_MAX_TOKENS="$2"; shift 2 ;;
        --outtype) need_value "$1" $# "${2:-}"; OUTTYPE="$2"; shift 2 ;;
        --n-ctx) need_value "$1" $# "${2:-}"; N_CTX="$2"; shift 2 ;;
        --threads) need_value "$1" $# "${2:-}"; THREADS="$2"; shift 2 ;;
        --parity-tokens) need_value "$1" $# "${2:-}"; PARITY_TOKENS="$2"; shift 2 ;;
        --llama-kv) need_value "$1" $# "${2:-}"; LLAMA_KV="$2"; shift 2 ;;
        --skip-parity) SKIP_PARITY=1; shift ;;
        --fresh-gguf) FRESH_GGUF=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die_usage "unknown option $1" ;;
    esac
done
case "$ARCH" in
    qwen3_moe|qwen3_next|qwen3_5_moe|glm4_moe|gpt_oss) ;;
    *) die_usage "--arch must be qwen3_moe, qwen3_next, qwen3_5_moe, glm4_moe or gpt_oss (got '$ARCH')" ;;
esac
positive_int --limit-turns "$LIMIT_TURNS"
positive_int --w1-max-tokens "$W1_MAX_TOKENS"
positive_int --n-ctx "$N_CTX"
positive_int --threads "$THREADS"
positive_int --parity-tokens "$PARITY_TOKENS"
positive_int FT_PORT "$FT_PORT"
positive_int LL_PORT "$LL_PORT"
[[ "$FT_PORT" != "$LL_PORT" ]] || die_usage "FT_PORT and LL_PORT must differ (both $FT_PORT)"
case "$OUTTYPE" in
    f32) FT_DTYPE=float32 ;;
    bf16) FT_DTYPE=bfloat16 ;;
    mxfp4)
        [[ "$ARCH" == gpt_oss ]] || die_usage "--outtype mxfp4 applies to --arch gpt_oss only"
        FT_DTYPE=bfloat16 ;;
    *) echo "error: --outtype must be f32, bf16 or mxfp4 (the dtypes both engines compute in)" >&2
       exit 2 ;;
esac
case "$LLAMA_KV" in
    f32) KV_TYPE=0 ;;  # GGML_TYPE_F32: FreeToken keeps K/V in its compute dtype (float32)
    f16) KV_TYPE=1 ;;  # GGML_TYPE_F16: llama.cpp's own default
    *) echo "error: --llama-kv must be f32 or f16" >&2; exit 2 ;;
esac
[[ -n "${WORKLOADS// /}" ]] || die_usage "--workloads is empty"
for w in $WORKLOADS; do
    [[ "$w" =~ ^W[1-4]$ ]] || die_usage "unknown workload $w (expected W1 W2 W3 W4)"
done
# Traces: the same default as evals/run.py; the synthetic set only with --allow-synthetic.
if [[ -z "$TRACES" ]]; then
    DEFAULT_TRACES="${FREETOKEN_SHARED:-$REPO/../shared}/traces"
    if [[ -d "$DEFAULT_TRACES" ]]; then
        TRACES="$(cd "$DEFAULT_TRACES" && pwd)"
    elif [[ "$ALLOW_SYNTHETIC" == 1 ]]; then
        echo "warning: no traces folder at $DEFAULT_TRACES; replaying the built-in SYNTHETIC set" \
             "(--allow-synthetic)" >&2
        TRACES=synthetic
    else
        echo "error: no traces folder at $DEFAULT_TRACES: pass --traces DIR or set FREETOKEN_SHARED" \
             "(or --allow-synthetic to compare on the built-in synthetic set, not real agent traffic)" >&2
        exit 2
    fi
elif [[ "$TRACES" == synthetic ]]; then
    [[ "$ALLOW_SYNTHETIC" == 1 ]] || die_usage "--traces synthetic needs --allow-synthetic"
elif [[ -d "$TRACES" ]]; then
    TRACES="$(cd "$TRACES" && pwd)"
else
    die_usage "--traces $TRACES: no such folder"
fi
[[ -x "$PY" ]] || { echo "error: project python $PY not found (make the .venv first)" >&2; exit 2; }
[[ ! -e "$OUT" || -d "$OUT" ]] || die_usage "--out $OUT exists and is not a folder"
mkdir -p "$OUT/log" || { echo "error: cannot create $OUT/log" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
say() { echo "[compare_llamacpp $(date +%H:%M:%S)] $*" >&2; }

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# 1. peer venv
say "1/6 llama-cpp-python venv (first run builds from source: ~15-30 min on 2 cores)"
PEER_PY="$(bash "$HERE/install_llamacpp.sh" 2> >(tee "$OUT/log/install.log" >&2) | tail -n 1)"
BUILD_STAMP="$(dirname "$(dirname "$PEER_PY")")/.freetoken-peer-ready"

# 2. checkpoint
say "2/6 FreeToken small $ARCH checkpoint"
MODEL_DIR="$("$PY" -c "
import sys; sys.path.insert(0, '$REPO')
from freetoken.models.tiny import cached_tiny
print(cached_tiny('$ARCH', 'small', 0, lambda m: print(m, file=sys.stderr)))")"

# 3. GGUF
KEY="$(cat "$MODEL_DIR/freetoken_tiny.json" "$HERE/convert_gguf.py" "$HERE/gguf_plan.py" \
        "$HERE/gguf_encode.py" "$HERE/gguf_glm4_moe.py" "$HERE/gguf_gpt_oss.py" \
        "$HERE/mxfp4_np.py" "$HERE/gguf_vocab.py" "$HERE/safetensors_np.py" \
        | sha256sum | cut -c1-12)"
GGUF_DIR="$CACHE/peers/gguf"
GGUF="$GGUF_DIR/small-$ARCH-$KEY-$OUTTYPE.gguf"
mkdir -p "$GGUF_DIR"
if [[ "$FRESH_GGUF" == 1 || ! -f "$GGUF" ]]; then
    say "3/6 converting $MODEL_DIR -> $GGUF ($OUTTYPE)"
    "$PEER_PY" "$HERE/convert_gguf.py" "$MODEL_DIR" "$GGUF" --outtype "$OUTTYPE" \
        2> >(tee "$OUT/log/convert.log" >&2)
    "$PY" "$HERE/gguf_cache.py" prune "$GGUF" 2> >(tee -a "$OUT/log/convert.log" >&2)
else
    say "3/6 GGUF up to date: $GGUF"
    echo "reused $GGUF (same checkpoint stamp and converter sources)" > "$OUT/log/convert.log"
fi

# 4. parity
if [[ "$SKIP_PARITY" == 0 ]]; then
    say "4/6 conversion proof ($PARITY_TOKENS greedy tokens per prompt)"
    "$PY" "$HERE/ref_freetoken.py" "$MODEL_DIR" "$OUT/parity_ref.json" --tokens "$PARITY_TOKENS" \
        --dtype "$FT_DTYPE" 2> "$OUT/log/parity_ref.log"
    TOL=1e-4; [[ "$OUTTYPE" == f32 ]] || TOL=5e-2
    set +e
    "$PEER_PY" "$HERE/parity_llamacpp.py" "$GGUF" "$OUT/parity_ref.json" --out "$OUT/parity.json" \
        --tol "$TOL" --threads "$THREADS" > "$OUT/parity.md" 2> "$OUT/log/parity_llamacpp.log"
    PARITY_RC=$?
    set -e
    cat "$OUT/parity.md" >&2
    [[ $PARITY_RC == 0 ]] || say "WARNING: parity check failed (exit $PARITY_RC); see $OUT/parity.json"
else
    echo "- skipped (--skip-parity)" > "$OUT/parity.md"
fi

# 5. servers + runs
wait_up() {  # name port pid
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$2/v1/models" >/dev/null 2>&1; then return 0; fi
        kill -0 "$3" 2>/dev/null || { echo "error: $1 server exited; log:" >&2; tail -n 30 "$OUT/log/$1-server.log" >&2; return 1; }
        sleep 1
    done
    echo "error: $1 server not up after 600 s" >&2; return 1
}
alive() {  # name pid: the server answering must be the one this script started
    kill -0 "$2" 2>/dev/null || { echo "error: $1 server exited; log:" >&2; tail -n 30 "$OUT/log/$1-server.log" >&2; exit 1; }
}
warm_up() {  # port
    curl -sf "http://127.0.0.1:$1/v1/chat/completions" -H 'content-type: application/json' \
        -d '{"messages":[{"role":"user","content":"warm up"}],"max_tokens":4,"temperature":0}' \
        >/dev/null || true
}

for port in "$FT_PORT" "$LL_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "error: port $port is already in use (set FT_PORT / LL_PORT)" >&2; exit 2
    fi
done
say "5/6 starting FreeToken (port $FT_PORT) and llama.cpp (port $LL_PORT) on the same weights"
"$PY" -m freetoken serve --model "$MODEL_DIR" --port "$FT_PORT" --dtype "$FT_DTYPE" \
    --max-model-len "$N_CTX" --served-model-name "small-$ARCH" --max-running-requests 1 \
    > "$OUT/log/freetoken-server.log" 2>&1 &
PIDS+=($!); FT_PID=$!
wait_up freetoken "$FT_PORT" "$FT_PID"
# Note: llama-cpp-python defaults that would skew a CPU benchmark are overridden: n_threads
# defaults to cpu_count/2, logits_all to true (full-vocab logits for every prompt token), mlock on;
# the weights are read into memory (no mmap) as FreeToken does.
"$PEER_PY" "$HERE/llamacpp_server.py" --model "$GGUF" --model_alias "small-$ARCH" \
    --host 127.0.0.1 --port "$LL_PORT" --n_ctx "$N_CTX" --n_batch 2048 --n_ubatch 512 \
    --n_threads "$THREADS" --n_threads_batch "$THREADS" --logits_all false --use_mlock false --use_mmap false \
    --flash_attn true --type_k "$KV_TYPE" --type_v "$KV_TYPE" --verbose false > "$OUT/log/llamacpp-server.log" 2>&1 &
PIDS+=($!); LL_PID=$!
wait_up llamacpp "$LL_PORT" "$LL_PID"
warm_up "$FT_PORT"; warm_up "$LL_PORT"
alive freetoken "$FT_PID"; alive llamacpp "$LL_PID"

RUN_RC=0
for w in $WORKLOADS; do
    proto=()
    [[ "$w" == W3 ]] && proto=(--protocol openai)  # llama-cpp-python serves no /v1/messages
    for side in freetoken llamacpp; do
        port="$FT_PORT"; [[ "$side" == llamacpp ]] && port="$LL_PORT"
        say "6/6 $w against $side (--limit-turns $LIMIT_TURNS; load average: $(cut -d' ' -f1-3 /proc/loadavg))"
        cut -d' ' -f1-3 /proc/loadavg > "$OUT/log/$w-$side.load"
        set +e
        "$PY" "$REPO/evals/run.py" --workload "$w" --endpoint "http://127.0.0.1:$port" \
            --limit-turns "$LIMIT_TURNS" --w1-max-tokens "$W1_MAX_TOKENS" --label "$side" \
            --traces "$TRACES" \
            --out "$OUT/$w-$side" --no-progress "${proto[@]}" > "$OUT/log/$w-$side.log" 2>&1
        rc=$?
        set -e
        cut -d' ' -f1-3 /proc/loadavg >> "$OUT/log/$w-$side.load"
        tail -n 1 "$OUT/log/$w-$side.log" >&2
        [[ $rc == 0 ]] || { say "WARNING: run.py $w $side exited $rc"; RUN_RC=1; }
    done
    alive freetoken "$FT_PID"; alive llamacpp "$LL_PID"
    "$PY" "$REPO/evals/compare.py" "$OUT/$w-freetoken" "$OUT/$w-llamacpp" --out "$OUT/$w" \
        > "$OUT/log/$w-compare.log" 2>&1 || { say "WARNING: compare.py $w failed"; RUN_RC=1; }
done
cleanup; PIDS=()

# 6. report
"$PY" "$HERE/report.py" --out "$OUT" --workloads "$WORKLOADS" --gguf "$GGUF" --arch "$ARCH" \
    --model-dir "$MODEL_DIR" --outtype "$OUTTYPE" --n-ctx "$N_CTX" --threads "$THREADS" \
    --limit-turns "$LIMIT_TURNS" --w1-max-tokens "$W1_MAX_TOKENS" --build-stamp "$BUILD_STAMP" \
    --peer-python "$PEER_PY" --llama-kv "$LLAMA_KV" --traces "$TRACES"
say "report: $OUT/report.md"
exit $RUN_RC
