"""Timers for one kernel over rotating input sets: CUDA events on a GPU, the host clock elsewhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..kernels.common import KernelArgs
from .inputs import L2_FLUSH_BYTES

# ~0.5 ms at H200 clocks: the GPU waits while the host enqueues the call. 0.1 ms was too short for
# a two-launch decode on a busy host (session 2: medians doubled, p20-p80 spread 2x).
HOLD_CYCLES = 1_000_000


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
    """CUDA events around each call; before each, an L2 flush and a GPU-side hold hide host launch cost.

    With ``graphs`` each input set's call is captured once in a CUDA graph and replayed, as a
    graph-captured serving loop (vLLM's decode) runs it: the host's launch cost is gone
    altogether and launches inside the graph are cheaper than stream launches.
    """

    def __init__(self, device: torch.device, *, hold_cycles: int = HOLD_CYCLES, graphs: bool = False) -> None:
        self.device = device
        self.hold_cycles = hold_cycles
        self.graphs = graphs
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def _calls(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs]) -> list[Callable[[], None]]:
        if not self.graphs:
            return [lambda a=a: launch(a) for a in sets]
        calls = []
        for a in sets:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                launch(a)
            calls.append(graph.replay)
        return calls

    def time(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs], *, warmup: int, repeats: int) -> Timing:
        for i in range(max(1, warmup)):
            launch(sets[i % len(sets)])
        torch.cuda.synchronize(self.device)
        calls = self._calls(launch, sets)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        stream = torch.cuda.current_stream(self.device)
        for i in range(repeats):
            self.flush.zero_()
            torch.cuda._sleep(self.hold_cycles)
            starts[i].record(stream)
            calls[i % len(calls)]()
            ends[i].record(stream)
        torch.cuda.synchronize(self.device)
        return summarize([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)],
                         "cuda-graph" if self.graphs else "cuda-events")


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
