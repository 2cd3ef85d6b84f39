"""Tests of the vLLM general plugin, against test doubles of vLLM modules (vLLM is not installable here)."""
