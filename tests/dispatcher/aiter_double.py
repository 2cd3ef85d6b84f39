"""A TEST DOUBLE for the `aiter` package, which cannot run on this machine (it needs ROCm).

It installs, under a package name of its own, the two modules AITER defines its sparse prefill kernels in
(``ops.triton.attention.pa_prefill_sparse`` and ``ops.pa_sparse_prefill_opus``) with AITER's public signatures:
CSR (ragged) indices over a prefix source and an extend source, ``out`` optional. It checks what AITER's code
checks (test_aiter_double.py pins the signatures to AITER's files) and computes with the torch reference. It
tests the adapter's calling convention, lazy import, out= versus copy and error messages, never AITER's kernels.
"""

from __future__ import annotations

import sys
import types

import torch

from dispatcher.kernels.aiter import MODULES, OPUS, PA_PREFILL_SPARSE
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill

NAME = "routescope_test_double_aiter"


def _index_form(name: str, x: torch.Tensor) -> None:
    """AITER asserts int32 contiguous 1-D indices (gfx1250) or converts them (elsewhere): the double asserts."""
    if not (x.dtype == torch.int32 and x.dim() == 1 and x.is_contiguous()):
        raise AssertionError(f"{name} must be int32, contiguous, 1-D; got {x.dtype} {list(x.shape)}")


def _out(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous():
        raise AssertionError(f"out {tuple(out.shape)} {out.dtype} != q {tuple(q.shape)} {q.dtype}, or not contiguous")
    return out


def _attend(q, unified_kv, indices, indptr, attn_sink, softmax_scale, result) -> torch.Tensor:
    """The torch reference over one source: slots -1 or past the pool skipped, every lane of each kv row as V."""
    if unified_kv.dim() != 2:
        raise AssertionError(f"unified_kv must be [total_pages, D]; got {list(unified_kv.shape)}")
    if indptr.shape != (q.shape[0] + 1,):
        raise AssertionError(f"kv_indptr_prefix must be [T + 1] = [{q.shape[0] + 1}]; got {list(indptr.shape)}")
    index = SparseIndex(None, None, indices, indptr)
    ragged_prefill(KernelArgs(q, unified_kv.unsqueeze(1), index, float(softmax_scale), attn_sink, result))
    return result


def install(*, with_opus: bool = True, with_out: bool = True) -> types.ModuleType:
    """The package under NAME (its ``calls``: (symbol, out given) per call); ``with_out=False`` is an AITER build
    from before the ``out`` keyword (pa_prefill_sparse only: OPUS has had it from its first version)."""
    uninstall()
    root = types.ModuleType(NAME, "TEST DOUBLE for AITER (tests/dispatcher/aiter_double.py): not AMD's library.")
    root.calls = []

    def pa_prefill_sparse(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, kv, kv_indices_extend,
                          kv_indptr_extend, attn_sink, softmax_scale, has_invalid=None, out=None):
        root.calls.append((PA_PREFILL_SPARSE, out is not None))
        provided = [n for n, t in (("kv", kv), ("kv_indices_extend", kv_indices_extend),
                                   ("kv_indptr_extend", kv_indptr_extend)) if t is not None]
        if provided:  # AITER's gfx942 (portable Triton) path serves one source
            raise NotImplementedError(f"pa_prefill_sparse got an extend KV source ({', '.join(provided)})")
        _index_form("kv_indices_prefix", kv_indices_prefix)
        _index_form("kv_indptr_prefix", kv_indptr_prefix)
        return _attend(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, attn_sink, softmax_scale, _out(q, out))

    if not with_out:
        def pa_prefill_sparse_before_out(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, kv, kv_indices_extend,
                                         kv_indptr_extend, attn_sink, softmax_scale, has_invalid=None):
            return pa_prefill_sparse(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, kv, kv_indices_extend,
                                     kv_indptr_extend, attn_sink, softmax_scale, has_invalid)

        pa_prefill_sparse_before_out.__name__ = PA_PREFILL_SPARSE
        kernels = {PA_PREFILL_SPARSE: pa_prefill_sparse_before_out}
    else:
        kernels = {PA_PREFILL_SPARSE: pa_prefill_sparse}

    def pa_sparse_prefill_opus(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, kv, kv_indices_extend,
                               kv_indptr_extend, attn_sink, softmax_scale, out=None):
        root.calls.append((OPUS, out is not None))
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise RuntimeError(f"pa_sparse_prefill_opus expects fp16/bf16 q, got {q.dtype}")
        if unified_kv.dtype != q.dtype or kv.dtype != q.dtype or unified_kv.size(-1) != kv.size(-1):
            raise RuntimeError("unified_kv and kv must have q's dtype and one head_dim")
        for name, t in (("kv_indices_prefix", kv_indices_prefix), ("kv_indptr_prefix", kv_indptr_prefix),
                        ("kv_indices_extend", kv_indices_extend), ("kv_indptr_extend", kv_indptr_extend)):
            _index_form(name, t)
        if bool(kv_indptr_extend.any()):  # reading the device is fine in a double
            raise NotImplementedError("the double computes the prefix source only: the extend source must be empty")
        # OPUS reads every entry unchecked: each must be a valid row of unified_kv
        lo, hi = int(kv_indptr_prefix[0]), int(kv_indptr_prefix[-1])
        used = kv_indices_prefix[lo:hi]
        if used.numel() and bool(((used < 0) | (used >= unified_kv.shape[0])).any()):
            raise AssertionError("pa_sparse_prefill_opus was given an invalid kv_indices_prefix entry")
        return _attend(q, unified_kv, kv_indices_prefix, kv_indptr_prefix, attn_sink, softmax_scale, _out(q, out))

    if with_opus:
        kernels[OPUS] = pa_sparse_prefill_opus
    _register(NAME, root)
    for symbol, path in MODULES.items():
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join([NAME, *parts[:i]])
            if name not in sys.modules:
                _register(name, types.ModuleType(name, "TEST DOUBLE for an AITER module."))
        if symbol in kernels:
            setattr(sys.modules[f"{NAME}.{path}"], symbol, kernels[symbol])
    return root


def _register(name: str, module: types.ModuleType) -> None:
    sys.modules[name] = module
    parent, _, leaf = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], leaf, module)


def uninstall() -> None:
    for name in [n for n in sys.modules if n == NAME or n.startswith(NAME + ".")]:
        del sys.modules[name]
