#!/usr/bin/env bash
# The H200 runner. On the GPU machine, from the repository root, with the wheels of docs/benchmarks.md
# ("Machines and setup") in .whl/:
#   [OUT=dir] [RUN_PYTEST=1 [PYTEST_K=expr] [PYTEST_TIMEOUT=s]] [RUN_NCU=1] bash scripts/gpu/h200_run.sh [h200_run.py options]
# Installs the wheels, then checks, times and sweeps (scripts/gpu/h200_run.py), then optionally runs GPU tests
# and an Nsight Compute pass over the target shapes (scripts/gpu/profile.py). Results land in $OUT (out/gpu).
# The whole GPU suite does not fit one 600 s device call beside the rest on a cold Triton cache; run it alone:
#   timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider tests/dispatcher
# or pass RUN_PYTEST=1 with PYTEST_K to pick a subset (PYTEST_K=sm90 for the Hopper kernels).
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 OUT
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 scripts/gpu/h200_run.py "$@"; } 2>&1 | tee "$OUT/h200_run.log"
status=${PIPESTATUS[0]}
if [ "${RUN_PYTEST:-0}" = 1 ]; then
  timeout "${PYTEST_TIMEOUT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider -k "${PYTEST_K:-}" tests/dispatcher/kernels 2>&1 \
    | tail -4 | tee "$OUT/pytest-gpu.txt"
fi
if [ "${RUN_NCU:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  timeout 240 "$NCU" --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 scripts/gpu/profile.py dispatcher > "$OUT/ncu.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|Warp Cycles Per Issued" \
    "$OUT/ncu.txt" | head -120
fi
exit "$status"
