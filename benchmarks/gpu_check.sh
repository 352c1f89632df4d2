#!/usr/bin/env bash
# The prepared GPU check of issue #18 (python -m benchmarks.gpu_check): correctness of the CUDA path against
# Hugging Face, decode and prefill speed against the ceilings it measures. At most 8 minutes: each
# part has its own bound inside that (gpu_check.py's BUDGET_S, --budget PART=SECONDS).
#
#   bash benchmarks/gpu_check.sh [python -m benchmarks.gpu_check options]
#
# Writes gpu_check.json, gpu_check.md and gpu_check.log to $OUT when set (the device machine's
# folder that comes back), else benchmarks/results/gpu-check/. PYTHON picks the interpreter (default:
# .venv/bin/python when the checkout has one, else python3, which on the H200 image holds torch,
# triton, transformers and numpy: all the check needs). GPU_CHECK_TIMEOUT (seconds, default 480).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out="${OUT:-benchmarks/results/gpu-check}"
mkdir -p "$out"
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
timeout --kill-after=15 "${GPU_CHECK_TIMEOUT:-480}" "$python" -m benchmarks.gpu_check --out "$out" "$@" 2>&1 \
    | tee "$out/gpu_check.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 124 ] && echo "gpu_check: stopped at the ${GPU_CHECK_TIMEOUT:-480} s bound; $out holds what it measured"
exit "$status"
