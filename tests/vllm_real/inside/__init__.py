"""Scripts run inside .venv-vllm by tests/vllm_real/conftest.py (python -O, no GPU, Triton's interpreter)."""
