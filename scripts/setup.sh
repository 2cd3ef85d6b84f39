#!/usr/bin/env bash
# Create .venv and install routescope with its test extras. Idempotent; safe to rerun.
# torch is pinned to the CPU build these machines carry on local disk (2.13.0): an open
# range would pull a multi-GB CUDA build. On a GPU machine, install your CUDA/ROCm torch
# first and skip this pin: `pip install -e '.[dev]'` keeps whatever torch is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "torch==${ROUTESCOPE_TORCH_VERSION:-2.13.0}"
fi
# The local index's 'is ignored' warnings are noise; a failed install (a full disk, a missing wheel)
# must still fail this script, so only grep's own status is forgiven (pipefail keeps pip's).
.venv/bin/pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | { grep -v 'is ignored' || true; }
.venv/bin/python -c 'import dispatcher, routescope' >/dev/null
