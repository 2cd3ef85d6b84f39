"""routescope inside vLLM: a general plugin that observes vLLM's own sparse MLA prefill routing.

It wraps the real ``rocm_sparse_attn_prefill`` (and the AITER kernel getters and the decode
entries) with thin observers that label each call and hand it to routescope's telemetry. Only
while an experiment runs (routing.py) does it send the calls assigned to arm B to another kernel.
Entry point: :func:`routescope.vllm_plugin.register`. See docs/vllm.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENABLE_ENV = "ROUTESCOPE_VLLM"
_TRUE = frozenset({"1", "true", "yes", "on"})


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """The off switch: nothing is imported or patched unless ROUTESCOPE_VLLM is 1/true/yes/on."""
    env = os.environ if env is None else env
    return env.get(ENABLE_ENV, "").strip().lower() in _TRUE
