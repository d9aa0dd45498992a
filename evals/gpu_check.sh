#!/usr/bin/env bash
# One command for a lent GPU machine (under 8 minutes): the device-dependent tests on cuda, then
# the MoE benchmarks on cuda. Run from the repository root: `bash evals/gpu_check.sh`.
# Results go to stdout and, when $OUT is set (the device tool's output folder), to $OUT/*.txt.
set -uo pipefail
out="${OUT:-/tmp/freetoken-gpu}"; mkdir -p "$out"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv && .venv/bin/pip install -q --upgrade pip \
    && .venv/bin/pip install -q -e '.[test,gpu]' 2>&1 | tail -3
fi
py=.venv/bin/python
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$out/env.txt"
export FREETOKEN_TEST_DEVICE=cuda
timeout 240 $py -m pytest -q -p no:cacheprovider tests/offload/test_runtime_exactness.py \
  tests/offload/test_offload_model.py tests/offload/test_watcher.py 2>&1 | tail -15 | tee "$out/tests.txt"
timeout 60 $py -m freetoken.cli profile --device cuda --dtype bfloat16 2>&1 | tee "$out/profile.txt"
timeout 200 $py -m evals.bench_moe_decode --device cuda --steps 16 --warmup 4 2>&1 | tee "$out/bench_decode.txt"
