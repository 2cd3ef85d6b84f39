"""Launch one vLLM prefill-entry call on a chosen kernel, through vLLM's own functions or routescope's AITER adapter.

An experiment's arm B is a kernel vLLM would not have chosen for the call. The plugin runs it with the
pieces vLLM's ``rocm_sparse_attn_prefill`` is made of, looked up in vLLM's module at each call as vLLM's
own code does, so a B launch is the launch vLLM would make had its gate said otherwise:

| kernel | how it is launched |
| --- | --- |
| ``intree.ragged_prefill`` | vLLM's ``_rocm_sparse_attn_prefill_ragged_triton`` (ragged indices) or ``_rocm_sparse_attn_prefill_triton`` (dense), as its fall-through does |
| ``aiter.pa_sparse_prefill_opus`` (gfx950) | vLLM's ``_rocm_sparse_attn_prefill_ragged_aiter_opus``, dense indices made ragged by vLLM's ``build_ragged_indices_from_dense`` |
| ``aiter.pa_prefill_sparse`` (gfx942) | routescope's lazy AITER adapter (``dispatcher/kernels/aiter.py``): 0.33.0 has no gfx942 branch to borrow; vLLM's ragged layout goes straight through to AITER's CSR arguments, dense indices are made ragged on the device inside the launch (``csr_from_dense``: the layout of vLLM's ``build_ragged_indices_from_dense``), as vLLM's OPUS branch makes them |
| ``intree.sparse_decode`` (split-K) | vLLM's ``rocm_sparse_attn_decode_bf16`` (the original, not the plugin's counting wrapper), splits from ``rocm_sparse_decode_bf16_num_splits`` |

:meth:`VllmArms.unavailable` says, before anything is launched, why a kernel cannot take a call here (a
missing function, AITER's symbol absent, vLLM's arch flag off, ragged indices of a form AITER does not take);
such a call is never moved. Nothing here reads a device tensor.

Ragged indices as vLLM's ROCm sparse MLA path passes them (the backend's ``paged_kv_indices`` /
``paged_kv_indptr`` for a pure-decode batch, or ``build_ragged_indices_from_dense``'s output): a flat buffer
and an ``[rows + 1]`` prefix sum, row i's slots from ``indptr[i]`` to ``indptr[i + 1]``; what follows
``indptr[-1]`` is never read. That is AITER's CSR form, so the gfx942 arm passes both as they are (int32).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import torch

from dispatcher.kernels.aiter import PA_PREFILL_SPARSE, AiterSymbolMissing, aiter_symbol, make_adapter
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.types import Kernel

RAGGED_TRITON = "_rocm_sparse_attn_prefill_ragged_triton"
DENSE_TRITON = "_rocm_sparse_attn_prefill_triton"
OPUS_LAUNCH = "_rocm_sparse_attn_prefill_ragged_aiter_opus"
OPUS_GETTER = "_get_aiter_sparse_prefill_opus"
OPUS_FLAG = "_ON_GFX950"
TO_RAGGED = "build_ragged_indices_from_dense"
SPLIT_K = "rocm_sparse_attn_decode_bf16"
SPLITS = "rocm_sparse_decode_bf16_num_splits"
_HALF = frozenset({"float16", "bfloat16"})


class PrefillCall(NamedTuple):
    """The arguments of one ``rocm_sparse_attn_prefill`` call, by name (vLLM's order)."""

    q: Any
    kv: Any  # [skv, 1, d]
    indices: Any
    topk_length: Any
    scale: float
    head_dim: int
    nope_head_dim: int
    rope_head_dim: int
    attn_sink: Any
    output: Any
    ragged_indices: Any = None
    ragged_indptr: Any = None

    @property
    def ragged(self) -> bool:
        return self.ragged_indices is not None and self.ragged_indptr is not None

    def sink(self) -> Any:
        """The sink as vLLM's branches pass it: sliced to q's heads."""
        return None if self.attn_sink is None else self.attn_sink[: self.q.shape[1]]


class ArmUnavailable(RuntimeError):
    """The kernel cannot take this call here; raised before anything was launched."""


_INDEX_DTYPES = (torch.int32, torch.int64)


def ragged_refusal(call: PrefillCall) -> str | None:
    """Why this ragged-only call's indices are not AITER's CSR form (read from their shapes); None when they are."""
    indices, indptr, rows = call.ragged_indices, call.ragged_indptr, call.q.shape[0]
    if indices is None or indptr is None:
        return "no indices: neither dense nor both ragged_indices and ragged_indptr were given"
    if indices.dim() != 1 or indptr.dim() != 1 or indptr.shape[0] != rows + 1:
        return (f"ragged layout not vLLM's (indices {list(indices.shape)}, indptr {list(indptr.shape)} for {rows} "
                "rows; expected 1-D indices and [rows + 1])")
    if indices.dtype not in _INDEX_DTYPES or indptr.dtype not in _INDEX_DTYPES:
        return f"ragged indices of dtype {indices.dtype}/{indptr.dtype}; int32 or int64 expected"
    return None


def _original(fn: Any) -> Any:
    """The function the plugin wrapped, so that a B launch of the decode entry is not counted as a decode call."""
    return getattr(fn, "__routescope_original__", fn)


class VllmArms:
    """Per-process launchers of each kernel for vLLM's prefill-entry calls (one per patched ops module)."""

    def __init__(self, module: ModuleType, *, aiter_module: str = "aiter") -> None:
        self.module = module
        self.pa = aiter_symbol(PA_PREFILL_SPARSE, aiter_module)
        self._pa_launch = make_adapter(self.pa)
        self._pa_missing: str | None = None  # the first load failure, kept: an import is not retried per call
        self._launch: dict[Kernel, Callable[[PrefillCall, Any], None]] = {
            Kernel.INTREE_RAGGED_PREFILL: self._intree, Kernel.AITER_OPUS: self._opus,
            Kernel.AITER_PA_PREFILL_SPARSE: self._pa, Kernel.INTREE_SPARSE_DECODE: self._split_k,
        }

    def _fn(self, name: str) -> Any:
        fn = getattr(self.module, name, None)
        return fn if callable(fn) else None

    def unavailable(self, kernel: Kernel, call: PrefillCall, q_dtype: str, kv_dtype: str) -> str | None:
        """Why ``kernel`` cannot take this call in this vLLM and AITER build; None when it can. Host facts only."""
        m = self.module
        if kernel is Kernel.INTREE_RAGGED_PREFILL:
            name = RAGGED_TRITON if call.ragged else DENSE_TRITON
            return None if self._fn(name) else f"this vLLM has no {name}"
        if kernel is Kernel.AITER_OPUS:
            for name in (OPUS_LAUNCH, OPUS_GETTER) + (() if call.ragged else (TO_RAGGED,)):
                if self._fn(name) is None:
                    return f"this vLLM has no {name}"
            if hasattr(m, OPUS_FLAG) and not getattr(m, OPUS_FLAG):
                return f"vLLM's arch flag {OPUS_FLAG} is False"
            if call.sink() is None:
                return "OPUS needs an attention sink"
            if getattr(m, OPUS_GETTER)() is None:  # functools.cache'd in vLLM: asked once per process
                return "vLLM's _get_aiter_sparse_prefill_opus returned None (AITER MLA off or no OPUS symbol)"
            return None
        if kernel is Kernel.AITER_PA_PREFILL_SPARSE:
            if call.ragged or call.indices is None:
                why = ragged_refusal(call)
                if why is not None:
                    return why
            if q_dtype not in _HALF or kv_dtype != q_dtype:
                return f"pa_prefill_sparse takes fp16/bf16 with kv of q's dtype (q {q_dtype}, kv {kv_dtype})"
            if self._pa_missing is None:
                try:
                    self.pa.load()
                except AiterSymbolMissing as exc:
                    self._pa_missing = str(exc)
            return self._pa_missing
        if kernel is Kernel.INTREE_SPARSE_DECODE:
            for name in (SPLIT_K, SPLITS) + (() if call.ragged else (TO_RAGGED,)):
                if self._fn(name) is None:
                    return f"this vLLM has no {name}"
            if kv_dtype != q_dtype:
                return f"vLLM's split-K decode of an unquantized pool needs kv of q's dtype (q {q_dtype}, kv {kv_dtype})"
            width = call.nope_head_dim + call.rope_head_dim
            if width <= 0 or width & (width - 1):  # its reduce kernel spans tl.arange(0, nope + rope)
                return f"vLLM's split-K decode needs nope + rope a power of two (this call: {width})"
            return None
        return f"no launcher for {kernel}"

    def prepare(self, kernel: Kernel, call: PrefillCall) -> PrefillCall:
        """The call as ``kernel``'s launcher takes it, before B's clock starts: every launcher takes vLLM's layouts
        as they come (a dense call's ragged form is made inside the launch, as vLLM's branches make it)."""
        return call

    def launch(self, kernel: Kernel, call: PrefillCall, output: Any) -> None:
        """Run ``kernel`` for ``call``, writing ``output`` (the caller's, or scratch for the numerics check)."""
        self._launch[kernel](call, output)

    # ---- one launcher per kernel ---------------------------------------------------------
    def _ragged(self, call: PrefillCall) -> tuple[Any, Any]:
        """vLLM's own conversion, as its OPUS branch makes it (dense indices, topk_length or the count of >= 0)."""
        if call.ragged:
            return call.ragged_indices, call.ragged_indptr
        indices = call.indices.reshape(call.indices.shape[0], -1)
        lengths = call.topk_length if call.topk_length is not None else (indices >= 0).sum(dim=-1, dtype=torch.int32)
        return getattr(self.module, TO_RAGGED)(indices, lengths, num_rows=call.kv.shape[0])

    def _intree(self, call: PrefillCall, output: Any) -> None:
        kv = call.kv.squeeze(1)
        if call.ragged:
            getattr(self.module, RAGGED_TRITON)(
                q=call.q, kv=kv, indices=call.ragged_indices, indptr=call.ragged_indptr, scale=call.scale,
                attn_sink=call.sink(), nope_head_dim=call.nope_head_dim, rope_head_dim=call.rope_head_dim, out=output)
            return
        getattr(self.module, DENSE_TRITON)(
            q=call.q, kv=kv, indices=call.indices.reshape(call.indices.shape[0], -1), scale=call.scale,
            attn_sink=call.sink(), nope_head_dim=call.nope_head_dim, rope_head_dim=call.rope_head_dim,
            topk_length=call.topk_length, out=output)

    def _opus(self, call: PrefillCall, output: Any) -> None:
        indices, indptr = self._ragged(call)
        sink = call.sink()
        launched = getattr(self.module, OPUS_LAUNCH)(
            q=call.q, kv=call.kv.squeeze(1), indices=indices, indptr=indptr, scale=call.scale,
            attn_sink=sink, output=output)
        if launched is False:  # vLLM's helper returns False, having written nothing, when its getter has no kernel
            raise ArmUnavailable("vLLM's OPUS launch declined (its getter returned None)")

    def _pa(self, call: PrefillCall, output: Any) -> None:
        if call.ragged:  # vLLM's ragged layout (preferred where both are given, as vLLM's branches do): AITER's CSR
            index = SparseIndex(None, None, call.ragged_indices, call.ragged_indptr)
        else:
            index = SparseIndex(call.indices.reshape(call.indices.shape[0], -1), call.topk_length)
        self._pa_launch(KernelArgs(call.q, call.kv, index, float(call.scale), call.sink(), output))

    def _split_k(self, call: PrefillCall, output: Any) -> None:
        indices, indptr = self._ragged(call)
        q = call.q
        # the longest run a row can walk, from host shapes: the dense width, or every ragged slot
        width = call.indices.shape[-1] if call.indices is not None else call.ragged_indices.shape[0]
        splits = int(getattr(self.module, SPLITS)(q.shape[0], q.shape[1], width))
        _original(getattr(self.module, SPLIT_K))(
            q=q, kv=call.kv, scale=call.scale, head_dim=call.head_dim, nope_head_dim=call.nope_head_dim,
            rope_head_dim=call.rope_head_dim, attn_sink=call.attn_sink, output=output, ragged_indices=indices,
            ragged_indptr=indptr, num_splits=max(1, splits))
