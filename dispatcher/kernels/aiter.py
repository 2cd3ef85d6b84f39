"""Lazy adapters for AITER's sparse prefill kernels: nothing is imported until a gate has passed.

As in the seed PR: a short call imports nothing; an eligible call with the symbol missing
raises an error that names the symbol and the import failure. The gfx950 OPUS symbol is
different: when it cannot be imported the branch declines and the call falls through, so
its adapter raises :class:`AiterSymbolMissing` for the dispatcher to catch.

Both kernels take the CSR (ragged) form over a paged prefix source and an extend source
(ROCm/aiter ``aiter/ops/triton/attention/pa_prefill_sparse.py`` and ``aiter/ops/pa_sparse_prefill_opus.py``):
``fn(q, unified_kv [pool, D], kv_indices_prefix, kv_indptr_prefix, kv, kv_indices_extend, kv_indptr_extend,
attn_sink, softmax_scale, ..., out=None)``, int32 contiguous 1-D indices. The adapter passes one KV pool: the
extend source is ``None`` for ``pa_prefill_sparse`` (its gfx942 path rejects any other) and empty for OPUS, as
vLLM's ``_rocm_sparse_attn_prefill_ragged_aiter_opus`` passes it. Dense indices are made ragged on the device
(:func:`csr_from_dense`), never read on the host.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .common import KernelArgs, SparseIndex

PA_PREFILL_SPARSE = "pa_prefill_sparse"
OPUS = "pa_sparse_prefill_opus"
# Where AITER defines each symbol, under its package root: aiter/__init__.py never re-exports pa_prefill_sparse,
# and OPUS is imported from its own module by vLLM 0.33.0 (_get_aiter_sparse_prefill_opus).
MODULES = {PA_PREFILL_SPARSE: "ops.triton.attention.pa_prefill_sparse", OPUS: "ops.pa_sparse_prefill_opus"}


class AiterSymbolMissing(RuntimeError):
    """An AITER kernel was chosen but its symbol could not be loaded."""

    def __init__(self, module: str, symbol: str, cause: BaseException | str) -> None:
        detail = cause if isinstance(cause, str) else f"{cause.__class__.__name__}: {cause}"
        super().__init__(
            f"{module}.{symbol} is needed for this call but cannot be loaded ({detail}); "
            f"install an AITER build that ships it (ROCm/aiter#6002) or disable AITER "
            f"(VLLM_ROCM_USE_AITER=0)"
        )
        self.module = module
        self.symbol = symbol


class AiterSymbol:
    """Resolves ``module.symbol`` on first use and remembers the result (or the failure)."""

    def __init__(self, symbol: str, module: str = "aiter") -> None:
        self.symbol = symbol
        self.module = module
        self._fn: Callable | None = None
        self.loads = 0  # how many import attempts were made: tests check "a short call imports nothing"
        self.takes_out: bool | None = None  # None until a call tried ``out=``; AITER builds before it have none

    def load(self) -> Callable:
        if self._fn is None:
            self.loads += 1
            try:
                mod = importlib.import_module(self.module)
            except Exception as exc:  # noqa: BLE001 - aiter raises RuntimeError without ROCm
                raise AiterSymbolMissing(self.module, self.symbol, exc) from exc
            fn = getattr(mod, self.symbol, None)
            if fn is None:
                raise AiterSymbolMissing(self.module, self.symbol, f"module {self.module} has no {self.symbol}")
            self._fn = fn
        return self._fn


def aiter_symbol(symbol: str, root: str = "aiter") -> AiterSymbol:
    """``symbol`` in the module AITER defines it in, under the package ``root`` (a test double's name in tests)."""
    return AiterSymbol(symbol, f"{root}.{MODULES[symbol]}")


def _scatter_kept(slots: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat int32 ``slots`` with the kept ones moved to the front in order, the dropped ones after them; and the
    inclusive running count of kept entries (int64). One permutation: every element written once, no host read."""
    running = keep.cumsum(0)
    kept = running[-1]
    place = torch.arange(slots.shape[0], device=slots.device)
    dest = torch.where(keep, running - 1, kept + place - running)
    flat = torch.empty(slots.shape[0], dtype=torch.int32, device=slots.device)
    flat.scatter_(0, dest, slots.to(torch.int32))
    return flat, running


def csr_from_dense(indices: torch.Tensor, topk_length: torch.Tensor | None, skv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``[rows, W]`` indices as AITER's CSR: (int32 ``[rows x W]`` slots, int32 ``[rows + 1]`` indptr).

    Row i keeps, in order, its positions below ``topk_length[i]`` (or below its count of entries >= 0) whose slot s
    has ``0 <= s < skv`` (docs/kernels.md, valid slots), packed from ``indptr[i]``; past ``indptr[-1]`` the buffer
    holds the dropped entries, which no kernel reads. The layout of vLLM's ``build_ragged_indices_from_dense``,
    built from device ops alone (no synchronisation).
    """
    rows, width = indices.shape
    indptr = torch.zeros(rows + 1, dtype=torch.int32, device=indices.device)
    if rows == 0 or width == 0:
        return torch.empty(0, dtype=torch.int32, device=indices.device), indptr
    length = topk_length if topk_length is not None else (indices >= 0).sum(dim=1)
    positions = torch.arange(width, device=indices.device)
    keep = (positions < length.reshape(rows, 1)) & (indices >= 0) & (indices < skv)
    flat, running = _scatter_kept(indices.reshape(-1), keep.reshape(-1))
    indptr[1:] = running.reshape(rows, width)[:, -1]
    return flat, indptr


def csr_compact(indices: torch.Tensor, indptr: torch.Tensor, topk_length: torch.Tensor | None,
                skv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A ragged index with only its valid slots: each row's positions below ``topk_length[i]`` (when given) whose
    slot is in ``[0, skv)``, in order. Same buffer size, no host read (a row's entries found by searchsorted)."""
    n, rows = indices.shape[0], indptr.shape[0] - 1
    starts = indptr.long()
    out_ptr = torch.zeros(rows + 1, dtype=torch.int32, device=indices.device)
    if n == 0 or rows == 0:
        return torch.zeros(n, dtype=torch.int32, device=indices.device), out_ptr
    place = torch.arange(n, device=indices.device)
    row = torch.searchsorted(starts[1:], place, right=True)  # the row whose segment holds each entry (rows: none)
    in_row = (row < rows) & (place >= starts[0])
    if topk_length is not None:
        row_c = row.clamp_max(rows - 1)
        in_row &= (place - starts[row_c]) < topk_length.long()[row_c]
    keep = in_row & (indices >= 0) & (indices < skv)
    flat, running = _scatter_kept(indices, keep)
    before = torch.cat([running.new_zeros(1), running])  # kept entries before each place
    out_ptr.copy_(before[starts.clamp(0, n)])
    return flat, out_ptr


def _as_int32(x: torch.Tensor) -> torch.Tensor:
    """AITER's index form: int32, contiguous, 1-D (no copy when it already is)."""
    return x if x.dtype == torch.int32 and x.dim() == 1 and x.is_contiguous() else x.reshape(-1).to(torch.int32).contiguous()


def csr_for(index: SparseIndex, skv: int, *, checks_slots: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The call's index as AITER's CSR. A ragged index without ``topk_length`` goes straight through where the
    kernel skips invalid slots itself (``checks_slots``: pa_prefill_sparse's portable path); OPUS reads every
    entry unchecked, so its ragged indices keep only valid slots, as ``topk_length`` does for either."""
    if index.ragged:
        if checks_slots and index.topk_length is None:
            return _as_int32(index.ragged_indices), _as_int32(index.ragged_indptr)
        return csr_compact(index.ragged_indices, index.ragged_indptr, index.topk_length, skv)
    return csr_from_dense(index.indices, index.topk_length, skv)


def _refuses_out(exc: TypeError) -> bool:
    """Whether a TypeError is Python refusing the ``out`` keyword (an AITER build from before it)."""
    return "'out'" in str(exc) and "keyword" in str(exc)


def _call_aiter(symbol: AiterSymbol, args: KernelArgs) -> None:
    """One KV pool; ``out=`` when the caller's output matches q (and is contiguous), else copy the narrower lanes."""
    fn = symbol.load()
    q, out = args.q, args.output
    kv = args.kv.squeeze(1)
    pa = symbol.symbol == PA_PREFILL_SPARSE
    indices, indptr = csr_for(args.index, kv.shape[0], checks_slots=pa)
    extend = (None, None, None) if pa else (kv[:1], indices[:0], torch.zeros_like(indptr))
    sink = None if args.attn_sink is None else args.attn_sink.contiguous()
    operands = (q, kv, indices, indptr, *extend, sink, float(args.scale))
    if symbol.takes_out is not False and out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous():
        try:
            fn(*operands, out=out)
            symbol.takes_out = True
            return
        except TypeError as exc:
            if symbol.takes_out or not _refuses_out(exc):
                raise
            symbol.takes_out = False
    result = fn(*operands)
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"AITER kernel returned {type(result).__name__}, expected a tensor")
    out.copy_(result[..., : out.shape[2]])


def make_adapter(symbol: AiterSymbol) -> Callable[[KernelArgs], None]:
    def launch(args: KernelArgs) -> None:
        _call_aiter(symbol, args)

    launch.symbol = symbol  # type: ignore[attr-defined]
    return launch
