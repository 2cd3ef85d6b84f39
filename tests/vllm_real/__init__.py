"""The vLLM plugin against the real vLLM 0.33.0, in its own venv (.venv-vllm, scripts/vllm_env.sh)."""
