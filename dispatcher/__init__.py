"""Sparse MLA prefill routing and kernels; knows nothing of telemetry or HTTP."""

from .api import DecodeInPrefillError, Dispatcher, sparse_attn_prefill
from .classify import classify
from .platform import Platform, detect, probe_aiter, what_if
from .policy import DecisionCache, Policy, PolicySettings, decide
from .probe import Probe
from .types import PREFILL_KERNELS, Batch, CallClass, CallShape, Decision, Gate, GuardMode, Kernel

__all__ = [
    "PREFILL_KERNELS", "Batch", "CallClass", "CallShape", "Decision", "DecisionCache",
    "DecodeInPrefillError", "Dispatcher", "Gate", "GuardMode", "Kernel", "Platform", "Policy",
    "PolicySettings", "Probe", "classify", "decide", "detect", "probe_aiter",
    "sparse_attn_prefill", "what_if",
]
