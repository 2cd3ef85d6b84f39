"""A call's kernel time from the CUDA profiler (CUPTI, through torch.profiler).

A call run inside ``record_function(name)`` under a profiler that records CUDA activity leaves two
ranges: one on the CPU (the host's time in the call) and one on the GPU, from the start of the
call's first kernel to the end of its last (``gpu_user_annotation`` in a trace). The GPU range is
the kernel time of the call: launch gaps between its own kernels count, the cost of timing it
does not. A CUDA event pair around the same call reads about 3-4 µs more on an H200
(docs/benchmarks.md: "event timing against CUPTI", and session 8).

``spans`` reads the profiler's events into plain records; ``call_seconds`` and ``call_kernels`` (each
call's kernels one by one) are the pure part.

Measured on CUDA (an H200). ROCm's profiler (roctracer) was not tried: where it leaves no GPU
ranges, ``KernelTimer`` raises and the sweep exits with that message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

CALL_PREFIX = "rs_call_"  # record_function names: CALL_PREFIX + the call's index


class Span(NamedTuple):
    """One profiler range: its name, whether the GPU ran it, and its start and end in microseconds."""

    name: str
    on_gpu: bool
    start_us: float
    end_us: float


def call_name(index: int, prefix: str = CALL_PREFIX) -> str:
    """The ``record_function`` name of call ``index``."""
    if index < 0:
        raise ValueError(f"call index must be >= 0, got {index}")
    return f"{prefix}{index}"


def spans(events: Iterable[Any]) -> list[Span]:
    """torch.profiler's events (``prof.events()``) as spans; CPU and GPU ranges alike."""
    cpu = torch.autograd.DeviceType.CPU
    return [Span(ev.name, getattr(ev, "device_type", cpu) != cpu, float(ev.time_range.start),
                 float(ev.time_range.end)) for ev in events]


def _call_bounds(found: Iterable[Span], prefix: str) -> dict[int, tuple[float, float]]:
    """Each call's GPU range, (first start, last end) in microseconds, over every GPU span of its name."""
    bounds: dict[int, tuple[float, float]] = {}
    for s in found:
        if not s.on_gpu or not s.name.startswith(prefix):
            continue
        suffix = s.name[len(prefix):]
        if not suffix.isdigit():
            continue
        i = int(suffix)
        lo, hi = bounds.get(i, (s.start_us, s.end_us))
        bounds[i] = (min(lo, s.start_us), max(hi, s.end_us))
    return bounds


def call_seconds(found: Iterable[Span], prefix: str = CALL_PREFIX) -> dict[int, float]:
    """GPU seconds of each call named ``prefix`` + index, first kernel start to last kernel end.

    Only GPU ranges count: a call that launched no kernel, or ran where the profiler recorded no
    CUDA activity, is absent from the answer. A name seen in several GPU ranges spans all of them.
    """
    return {i: (hi - lo) / 1e6 for i, (lo, hi) in _call_bounds(found, prefix).items()}


class CallKernels(NamedTuple):
    """A call's kernels in start order, and the last kernel to end before the first of them (or None)."""

    kernels: list[Span]
    before: Span | None


def call_kernels(found: Iterable[Span], prefix: str = CALL_PREFIX) -> dict[int, CallKernels]:
    """The kernels of each call named ``prefix`` + index: the GPU spans, other than call ranges, that start
    inside the call's GPU range. ``before`` is what ran just ahead of them (under ``GpuTimer``, its hold
    kernel), so a call's first kernel can be told from the wait in front of it.
    """
    found = list(found)
    kernels = sorted((s for s in found if s.on_gpu and not s.name.startswith(prefix)), key=lambda s: s.start_us)
    out: dict[int, CallKernels] = {}
    for i, (lo, hi) in _call_bounds(found, prefix).items():
        mine = [k for k in kernels if lo <= k.start_us <= hi]
        ahead = [k for k in kernels if mine and k.end_us <= mine[0].start_us]
        out[i] = CallKernels(mine, max(ahead, key=lambda k: k.end_us) if ahead else None)
    return out
