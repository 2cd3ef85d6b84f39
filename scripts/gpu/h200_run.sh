#!/usr/bin/env bash
# Run on the device machine from the repository root (the `run` tool, kind nvidia-h200, carry [".whl"]):
#   bash scripts/gpu/h200_run.sh [h200_run.py options]
# Installs the carried wheels (pydantic, pydantic-settings, typer... the image lacks), then checks,
# tunes, times and sweeps (scripts/gpu/h200_run.py), then runs the GPU tests. Results land in $OUT.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 OUT
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 scripts/gpu/h200_run.py "$@"; } 2>&1 | tee "$OUT/h200_run.log"  # at most 8 files come back
status=${PIPESTATUS[0]}
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/dispatcher/kernels 2>&1 | tail -4 \
  | tee "$OUT/pytest-gpu.txt"
exit "$status"
