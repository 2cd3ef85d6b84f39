"""The pieces of one observed call: its shape read from vLLM's arguments, its state while in flight,
and the wrapper conventions (marks, torch.compile pass-through, the probe's ``error`` signature)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from dispatcher.pools import pool_bucket
from dispatcher.types import CallShape, Decision, Kernel
from dispatcher.validate import _DTYPE_NAMES as _NAMES
from dispatcher.validate import dtype_name, ragged_width

AITER_KERNELS = frozenset({Kernel.AITER_PA_PREFILL_SPARSE, Kernel.AITER_OPUS})
_FP32 = torch.float32
_MAX_POOL_SIZES = 256


class PoolBuckets(dict):
    """kv pool bytes -> ``pool_bucket`` of them, remembered: a serving process has a few pool sizes, and a dict hit
    is cheaper per call than the bucket's arithmetic. Bounded: past ``_MAX_POOL_SIZES`` sizes it computes each."""

    def __missing__(self, nbytes: int) -> int:
        bucket = pool_bucket(nbytes)
        if len(self) < _MAX_POOL_SIZES:
            self[nbytes] = bucket
        return bucket


def call_shape(q: Any, kv: Any, indices: Any, attn_sink: Any, output: Any, ragged: bool,
               head_dim: Any, nope_head_dim: Any, rope_head_dim: Any, ragged_indices: Any = None,
               pools: PoolBuckets | None = None) -> CallShape:
    """The facts vLLM's gates read, without validation (vLLM validates its own arguments), and the kv pool's
    size bucket (telemetry's ``kv_pool_bytes`` label), looked up in ``pools`` when given."""
    qs = q.shape
    heads = qs[1]
    sink_ok = False
    if attn_sink is not None:  # vLLM slices the sink to q's heads before its gate
        sink_ok = attn_sink.dim() == 1 and attn_sink.shape[0] >= heads and attn_sink.dtype is _FP32
    names = _NAMES
    q_dt, kv_dt, out_dt = q.dtype, kv.dtype, output.dtype
    q_stride, out_stride = q.stride(), output.stride()
    return CallShape(
        qs[0], heads, head_dim, nope_head_dim, rope_head_dim,
        names.get(q_dt) or dtype_name(q_dt), names.get(kv_dt) or dtype_name(kv_dt),
        names.get(out_dt) or dtype_name(out_dt), output.shape[-1],
        indices.shape[-1] if indices is not None else (
            ragged_width(ragged_indices.shape[0], qs[0]) if ragged_indices is not None else 0),
        attn_sink is not None, sink_ok,
        q.get_device() == kv.get_device() == output.get_device(),
        q_stride[-1] == 1 and kv.stride()[-1] == 1 and out_stride[-1] == 1,
        out_stride == q_stride,
        ragged,
        pools[kv.nbytes] if pools is not None else pool_bucket(kv.nbytes),
    )


class Call:
    """One prefill call in flight: what was predicted, what the getters saw, what launched."""

    __slots__ = ("key", "decision", "token", "launched", "attempted", "saw_none", "prev", "announced", "route",
                 "observed")

    def __init__(self, key: tuple, decision: Decision, prev: Call | None) -> None:
        self.key = key
        self.decision = decision  # what the probe was told: the prediction of vLLM's launch, or arm B's decision
        self.token: Any = None
        self.launched: Kernel | None = None
        self.attempted: Kernel | None = None  # an AITER getter vLLM called that did not return None
        self.saw_none: set[Kernel] = set()
        self.prev = prev
        self.announced: str | None = None  # the impl the probe's start was told of
        self.route: Any = None  # an experiment's routing.Route for this call (None: vLLM's own routing, observed)
        self.observed = True  # False: the probe's start failed, so stop and error are not called

    def impl(self, raised: bool = False) -> str:
        """What vLLM ran, or (for a call it raised on) what it attempted: 'aiter' or 'triton'."""
        k = self.launched or (self.attempted if raised else None)
        return "aiter" if k in AITER_KERNELS else "triton"


def positional_capacity(fn: Callable[..., Any]) -> int:
    """How many positional arguments ``fn`` accepts (a large number for ``*args``; 0 if it cannot be told)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 1 << 16
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def is_compiling() -> Callable[[], bool]:
    """torch.compiler.is_compiling where torch has it: a traced call is passed straight through."""
    try:
        import torch

        fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        return fn if callable(fn) else (lambda: False)
    except Exception:  # noqa: BLE001
        return lambda: False


def mark(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """Look like the original (name, doc, signature via __wrapped__) and say whose wrapper it is."""
    functools.update_wrapper(wrapper, original, updated=())
    wrapper.__routescope__ = True  # type: ignore[attr-defined]
    wrapper.__routescope_original__ = original  # type: ignore[attr-defined]
    return wrapper
