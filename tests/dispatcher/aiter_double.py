"""A TEST DOUBLE for the `aiter` module, which cannot run on this machine (it needs ROCm).

It exposes `pa_prefill_sparse` and `pa_sparse_prefill_opus` with the calling convention the
adapter uses, computing the result with the torch reference. It tests the adapter's plumbing
(lazy import, out= versus copy, error messages), never AITER's kernels.
"""

from __future__ import annotations

import sys
import types

import torch

from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill

NAME = "routescope_test_double_aiter"


def install(*, with_opus: bool = True) -> types.ModuleType:
    mod = types.ModuleType(NAME)
    mod.calls = []

    def pa_prefill_sparse(q, kv, indices, topk_length, scale, *, attn_sink=None, out=None):
        mod.calls.append(("pa_prefill_sparse", out is not None))
        result = out if out is not None else torch.empty_like(q)
        ragged_prefill(KernelArgs(q, kv, SparseIndex(indices, topk_length), scale, attn_sink, result))
        return result

    mod.pa_prefill_sparse = pa_prefill_sparse
    if with_opus:
        def pa_sparse_prefill_opus(q, kv, indices, topk_length, scale, *, attn_sink=None, out=None):
            mod.calls.append(("pa_sparse_prefill_opus", out is not None))
            result = out if out is not None else torch.empty_like(q)
            ragged_prefill(KernelArgs(q, kv, SparseIndex(indices, topk_length), scale, attn_sink, result))
            return result

        mod.pa_sparse_prefill_opus = pa_sparse_prefill_opus
    sys.modules[NAME] = mod
    return mod


def uninstall() -> None:
    sys.modules.pop(NAME, None)
