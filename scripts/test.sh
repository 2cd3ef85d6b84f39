#!/usr/bin/env bash
# Set up (venv, Python packages, Debian's prometheus, prometheus-alertmanager and chromium) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v amtool >/dev/null || need+=(prometheus-alertmanager)
command -v chromium >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
bash scripts/setup.sh
# tests/vllm_real run the plugin inside the real vLLM 0.33.0, in its own venv (first run ~2 min, then seconds);
# if it cannot be built those tests say why in the summary (skipped; failed under CI)
bash scripts/vllm_env.sh || echo "test.sh: the real-vLLM venv was not built; see .venv-vllm.failed" >&2
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
