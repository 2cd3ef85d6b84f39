#!/usr/bin/env bash
# Run on the device machine from the repository root (the `run` tool, kind nvidia-h200, carry [".whl"]):
#   [RUN_PYTEST=1 [PYTEST_K=expr] [PYTEST_TIMEOUT=s]] [RUN_NCU=1] bash scripts/gpu/h200_run.sh [h200_run.py options]
# Installs the carried wheels (pydantic, pydantic-settings, typer... the image lacks), then tunes,
# checks, times and sweeps (scripts/gpu/h200_run.py), then optionally runs GPU tests and an
# Nsight Compute pass over the target shapes (scripts/gpu/profile.py). Results land in $OUT.
# The GPU tests are off by default: on a fresh machine (cold Triton cache) all 32 take about 485 s,
# which does not fit one 600 s device call after the tuning and sweep. Run them in a call of their own:
#   timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider tests/dispatcher
# or pass RUN_PYTEST=1 with PYTEST_K to pick a subset (PYTEST_K=sm90 for the Hopper kernels).
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 OUT
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 scripts/gpu/h200_run.py "$@"; } 2>&1 | tee "$OUT/h200_run.log"  # at most 8 files come back
status=${PIPESTATUS[0]}
if [ "${RUN_PYTEST:-0}" = 1 ]; then
  timeout ${PYTEST_TIMEOUT:-420} python3 -m pytest -q -m gpu -p no:cacheprovider -k "${PYTEST_K:-}" tests/dispatcher/kernels 2>&1 | tail -4 \
    | tee "$OUT/pytest-gpu.txt"
fi
if [ "${RUN_NCU:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  timeout 240 "$NCU" --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 scripts/gpu/profile.py > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|Warp Cycles Per Issued" \
    "$OUT/ncu.txt" | head -120
fi
exit "$status"
