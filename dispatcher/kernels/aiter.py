"""Lazy adapters for AITER's sparse prefill kernels: nothing is imported until a gate has passed.

As in the seed PR: a short call imports nothing; an eligible call with the symbol missing
raises an error that names the symbol and the import failure. The gfx950 OPUS symbol is
different: when it cannot be imported the branch declines and the call falls through, so
its adapter raises :class:`AiterSymbolMissing` for the dispatcher to catch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .common import KernelArgs

PA_PREFILL_SPARSE = "pa_prefill_sparse"
OPUS = "pa_sparse_prefill_opus"


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


def _call_aiter(fn: Callable, args: KernelArgs) -> None:
    """One KV pool; ``out=`` when the caller's output matches q, else copy the narrower lanes."""
    idx = args.index
    indices = idx.indices
    if indices is None:
        raise ValueError("the AITER sparse prefill kernels take dense indices; ragged-only calls stay in-tree")
    out = args.output
    if out.shape == args.q.shape and out.dtype == args.q.dtype:
        fn(args.q, args.kv, indices, idx.topk_length, args.scale, attn_sink=args.attn_sink, out=out)
        return
    result = fn(args.q, args.kv, indices, idx.topk_length, args.scale, attn_sink=args.attn_sink, out=None)
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"AITER kernel returned {type(result).__name__}, expected a tensor")
    out.copy_(result[..., : out.shape[2]])


def make_adapter(symbol: AiterSymbol) -> Callable[[KernelArgs], None]:
    def launch(args: KernelArgs) -> None:
        _call_aiter(symbol.load(), args)

    launch.symbol = symbol  # type: ignore[attr-defined]
    return launch
