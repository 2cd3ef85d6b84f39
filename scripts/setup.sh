#!/usr/bin/env bash
# Create .venv and install routescope with its test extras. Idempotent; safe to rerun.
# torch is pinned to the CPU build these machines carry on local disk (2.13.0): an open
# range would pull a multi-GB CUDA build. On a GPU machine, install your CUDA/ROCm torch
# first and skip this pin: `pip install -e '.[dev]'` keeps whatever torch is already there.
# Quiet when all is well: each step's output is kept aside and shown only when the step fails
# (or when pip warns of something other than the local index's "Location ... is ignored").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
log=$(mktemp "${TMPDIR:-/tmp}/routescope-setup.XXXXXX")
trap 'rm -f "$log"' EXIT

step() {  # step WHAT CMD...: run CMD with its output in $log; on failure print it and stop
  local what=$1
  shift
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "setup: $what failed (exit $rc): $*" >&2
    grep -v 'is ignored' "$log" >&2 || true
    exit 1
  fi
  grep -iE '^(warning|error)' "$log" | grep -v 'is ignored' >&2 || true
}

if [ ! -x .venv/bin/python ]; then
  step "creating .venv" "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  step "installing torch" .venv/bin/pip install -q --disable-pip-version-check \
    "torch==${ROUTESCOPE_TORCH_VERSION:-2.13.0}"
fi
step "installing routescope" .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
step "importing routescope" .venv/bin/python -c 'import dispatcher, routescope'
