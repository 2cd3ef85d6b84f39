#!/usr/bin/env bash
# Build (or reuse) .venv-vllm: the real vLLM 0.33.0 on the CPU torch, for tests/vllm_real.
# Every package is pinned in tests/vllm_real/requirements.txt and installed with --no-deps, so no
# range can pull a CUDA torch; routescope goes in editable (--no-deps), its dependencies pinned there.
# A stamp (hash of the pins, pyproject.toml and this script) makes a rerun a no-op. On failure it
# writes .venv-vllm.failed (why, and the log's tail) for the tests' skip message, and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ROUTESCOPE_VLLM_VENV:-.venv-vllm}
REQ=tests/vllm_real/requirements.txt
LOG="$VENV.log"
want=$(cat "$REQ" pyproject.toml scripts/vllm_env.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/routescope-stamp" 2>/dev/null)" = "$want" ]; then
  echo "vllm_env: $VENV is complete (stamp $want), reused"
  exit 0
fi
fail() {
  { echo "$1"; echo "stamp $want"; tail -n 25 "$LOG" 2>/dev/null; } > "$VENV.failed"
  echo "vllm_env: FAILED: $1 (see $VENV.failed; tests/vllm_real will not run)" >&2
  exit 1
}
start=$(date +%s)
rm -f "$VENV/routescope-stamp" "$VENV.failed"
: > "$LOG"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV" >> "$LOG" 2>&1 || fail "could not create the virtualenv $VENV"
fi
PIP=("$VENV/bin/pip" install --disable-pip-version-check --no-deps)
"${PIP[@]}" -r "$REQ" >> "$LOG" 2>&1 || fail "pip could not install $REQ (no network? a full disk?)"
"${PIP[@]}" -e . >> "$LOG" 2>&1 || fail "pip could not install routescope (editable) into $VENV"
# The tests import these under python -O with no GPU visible; this also writes their -O bytecode once.
CUDA_VISIBLE_DEVICES="" "$VENV/bin/python" -O -c \
  "import vllm.plugins, vllm.forward_context, vllm.v1.attention.ops.rocm_aiter_mla_sparse, routescope.vllm_plugin" \
  >> "$LOG" 2>&1 || fail "vLLM does not import in $VENV (a package missing from $REQ?)"
echo "$want" > "$VENV/routescope-stamp"
echo "vllm_env: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
