"""Tests of the vLLM plugin against test doubles of vLLM modules (tests/vllm_real: against the real vLLM)."""
