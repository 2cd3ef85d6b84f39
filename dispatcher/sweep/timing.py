"""Timers for one kernel over rotating input sets: CUDA events on a GPU, the host clock elsewhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..kernels.common import KernelArgs
from .inputs import L2_FLUSH_BYTES

HOLD_CYCLES = 200_000  # ~0.1 ms at H200 clocks: the GPU waits while the host enqueues the call


class Timing(NamedTuple):
    """Per-call times in microseconds: median, 20th and 80th percentiles, minimum, count."""

    median_us: float
    p20_us: float
    p80_us: float
    min_us: float
    repeats: int
    timer: str


def summarize(samples_us: list[float], timer: str) -> Timing:
    """Median and spread of a list of per-call times."""
    s = sorted(samples_us)
    if not s:
        raise ValueError("no samples")
    q = statistics.quantiles(s, n=5, method="inclusive") if len(s) > 1 else [s[0]] * 4
    return Timing(statistics.median(s), q[0], q[3], s[0], len(s), timer)


class GpuTimer:
    """CUDA events around each call; before each, an L2 flush and a short GPU-side hold hide host launch cost."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def time(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs], *, warmup: int, repeats: int) -> Timing:
        for i in range(max(1, warmup)):
            launch(sets[i % len(sets)])
        torch.cuda.synchronize(self.device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        stream = torch.cuda.current_stream(self.device)
        for i in range(repeats):
            self.flush.zero_()
            torch.cuda._sleep(HOLD_CYCLES)
            starts[i].record(stream)
            launch(sets[i % len(sets)])
            ends[i].record(stream)
        torch.cuda.synchronize(self.device)
        return summarize([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)], "cuda-events")


class HostTimer:
    """perf_counter around each call (the torch kernels on CPU are synchronous)."""

    def time(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs], *, warmup: int, repeats: int) -> Timing:
        for i in range(max(1, warmup)):
            launch(sets[i % len(sets)])
        samples = []
        for i in range(repeats):
            t0 = time.perf_counter()
            launch(sets[i % len(sets)])
            samples.append((time.perf_counter() - t0) * 1e6)
        return summarize(samples, "host")
