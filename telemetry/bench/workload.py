"""A fixed mix of dispatcher calls (prefill, mixed, pure decode; two models) shared by the benchmarks and tests."""

from __future__ import annotations

import time
from typing import Any

import torch

from dispatcher.kernels import KernelImpl, KernelRegistry
from dispatcher.kernels.registry import default_registry
from dispatcher.types import Kernel

from ..buckets import LATENCY_BOUNDS_S, RowsBuckets

NOOP_IMPL = "noop"


def _noop(args: Any) -> None:
    """Stands in for a kernel launch so that only dispatch and telemetry are timed."""


def noop_registry(impl: str = NOOP_IMPL) -> KernelRegistry:
    """Every kernel name resolves to a launch that does nothing."""
    reg = KernelRegistry()
    for k in Kernel:
        reg.register(KernelImpl(k, impl, _noop))
    return reg


def real_registry() -> KernelRegistry:
    """The torch kernels (no Triton, no AITER: the AITER names are served by the torch prefill as a stand-in)."""
    from dispatcher.kernels.torch_ref import ragged_prefill

    reg = default_registry(triton=False)
    for k in (Kernel.AITER_PA_PREFILL_SPARSE, Kernel.AITER_OPUS):
        reg.register(KernelImpl(k, "torch", ragged_prefill), prefer=True)
    return reg


# (rows, batch metadata, model): prefill, mixed and pure-decode calls on both sides of 512 and 1024
MIX: tuple[tuple[int, dict[str, Any], str | None], ...] = (
    (1, {"num_decodes": 1, "num_decode_tokens": 1, "num_prefills": 0}, "glm"),
    (2, {"num_decodes": 2, "num_decode_tokens": 2, "num_prefills": 0}, "glm"),
    (16, {"num_decodes": 16, "num_decode_tokens": 16, "num_prefills": 0}, "dsv4"),
    (300, {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 1}, "dsv4"),
    (600, {"num_decodes": 4, "num_decode_tokens": 4, "num_prefills": 1}, "glm"),
    (700, {}, "dsv4"),
    (2048, {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 2}, "dsv4"),
    (8, {"query_lens": [1, 1, 6]}, None),
)


def make_calls(n: int, *, heads: int = 2, nope: int = 48, rope: int = 16, topk: int = 16, kv_rows: int = 64,
               dtype: torch.dtype = torch.bfloat16, device: str = "cpu", seed: int = 0,
               mix: tuple = MIX) -> list[tuple[tuple, dict[str, Any]]]:
    """``n`` calls cycling through ``mix``; tensors are built once per distinct row count and shared."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    d = nope + rope
    kv = torch.randn(kv_rows, 1, d, generator=g).to(dtype=dtype, device=device)
    per_rows: dict[int, tuple] = {}
    out = []
    for j in range(n):
        rows, meta, model = mix[j % len(mix)]
        if rows not in per_rows:
            q = torch.randn(rows, heads, d, generator=g).to(dtype=dtype, device=device)
            idx = torch.randint(-1, kv_rows, (rows, topk), generator=g, dtype=torch.int32).to(device)
            o = torch.empty(rows, heads, nope, dtype=dtype, device=device)
            per_rows[rows] = (q, kv, idx, None, 0.125, d, nope, rope, None, o)
        out.append((per_rows[rows], {**meta, "model": model}))
    return out


class NaiveProbe:
    """What instrumenting with prometheus_client directly costs: .labels().inc() and .labels().observe() per call."""

    def __init__(self, registry: Any, buckets: RowsBuckets, *, arch: str, rank: str = "0") -> None:
        from prometheus_client import Counter, Histogram

        self.calls = Counter("routescope_calls", "calls", ("kernel", "impl", "rows_bucket", "model", "call_class",
                                                           "arch", "rank"), registry=registry)
        self.latency = Histogram("routescope_call_duration_seconds", "latency",
                                 ("kernel", "rows_bucket", "model", "rank"), registry=registry,
                                 buckets=LATENCY_BOUNDS_S)
        self.buckets = buckets
        self.arch = arch
        self.rank = rank

    def start(self, decision: Any, shape: Any, batch: Any, model: Any, q: Any, stream: Any, impl: Any = None) -> Any:
        return decision, shape[0], model, time.perf_counter()

    def stop(self, token: Any, impl: str, announced: Any = None) -> None:
        decision, rows, model, t0 = token
        dt = time.perf_counter() - t0
        b = self.buckets.label(rows)
        m = model or "unknown"
        k = decision.kernel.value
        self.calls.labels(k, impl, b, m, decision.call_class.value, self.arch, self.rank).inc()
        self.latency.labels(k, b, m, self.rank).observe(dt)

    def error(self, token: Any, exc: BaseException, impl: str | None = None, announced: str | None = None) -> None:
        pass
