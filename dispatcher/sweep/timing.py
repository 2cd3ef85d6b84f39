"""Timers for one kernel over rotating input sets: CUDA events or CUPTI kernel time on a GPU, the host clock elsewhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import NamedTuple

import torch

from ..kernels.common import KernelArgs
from .cupti import Span, call_name, call_seconds, spans
from .inputs import L2_FLUSH_BYTES

# ~0.5 ms at H200 clocks: the GPU waits while the host enqueues the call. 0.1 ms was too short for
# a two-launch decode on a busy host (its medians and its p20-p80 spread doubled).
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
    """CUDA events around each call; before each, an L2 flush (unless ``flush_l2`` is off) and a GPU-side hold that
    hides host launch cost.

    With ``graphs`` each input set's call is captured once in a CUDA graph and replayed, as a
    graph-captured serving loop (vLLM's decode) runs it: the host's launch cost is gone
    altogether and launches inside the graph are cheaper than stream launches.

    The pair's own cost comes at two levels about 0.7 µs apart on an H200, set by the calls
    launched just before a run, not by the call timed (docs/benchmarks.md, "Clocks: kernel time
    and the event pair"): two variants timed in turn can differ by that much with the same kernel.
    ``KernelTimer``'s kernel time does not move; the sweep's order (one untimed call before each
    run) puts both kernels at one level.
    """

    def __init__(self, device: torch.device, *, hold_cycles: int = HOLD_CYCLES, graphs: bool = False,
                 flush_l2: bool = True) -> None:
        self.device = device
        self.hold_cycles = hold_cycles
        self.graphs = graphs
        # flush_l2=False: inputs cycling over one shared pool (inputs.make_pool) leave L2 to hold what the pool's
        # size lets it hold, as it does for a serving loop's back-to-back calls
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device) if flush_l2 else None

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
        calls = self._warm(launch, sets, warmup)
        times = self._run(calls, repeats, lambda i: nullcontext())
        return summarize(times, "cuda-graph" if self.graphs else "cuda-events")

    def _warm(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs], warmup: int) -> list[Callable[[], None]]:
        for i in range(max(1, warmup)):
            launch(sets[i % len(sets)])
        torch.cuda.synchronize(self.device)
        return self._calls(launch, sets)

    def _run(self, calls: list[Callable[[], None]], repeats: int,
             around: Callable[[int], AbstractContextManager[object]]) -> list[float]:
        """Each call after an L2 flush and a GPU hold, inside ``around(i)``; the event pair's µs per call."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        stream = torch.cuda.current_stream(self.device)
        flush = self.flush
        for i in range(repeats):
            if flush is not None:
                flush.zero_()
            torch.cuda._sleep(self.hold_cycles)
            with around(i):
                starts[i].record(stream)
                calls[i % len(calls)]()
                ends[i].record(stream)
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]


class KernelTimer(GpuTimer):
    """Kernel time of each call from CUPTI, first kernel start to last kernel end, under GpuTimer's protocol.

    The same L2 flush and GPU hold come before each call, and the same CUDA event pair is recorded
    around it, so ``paired`` gives both clocks for the very same calls. The event pair reads the
    events' own cost too (3 to 3.7 µs on an H200): worth as much as the kernel itself for a decode
    call of 12 µs. Eager launches only: a graph replay's kernels are not annotated per call.
    """

    def __init__(self, device: torch.device, *, hold_cycles: int = HOLD_CYCLES, flush_l2: bool = True) -> None:
        super().__init__(device, hold_cycles=hold_cycles, flush_l2=flush_l2)

    def time(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs], *, warmup: int, repeats: int) -> Timing:
        return self.paired(launch, sets, warmup=warmup, repeats=repeats)[0]

    def paired(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs], *, warmup: int,
               repeats: int) -> tuple[Timing, Timing]:
        """(kernel time, event time) of the same calls; raises if the profiler saw no kernel for some call."""
        kernel, events, _ = self.paired_spans(launch, sets, warmup=warmup, repeats=repeats)
        return kernel, events

    def paired_spans(self, launch: Callable[[KernelArgs], None], sets: list[KernelArgs], *, warmup: int,
                     repeats: int) -> tuple[Timing, Timing, list[Span]]:
        """``paired``, and every profiler span of those calls (``cupti.call_kernels`` reads them kernel by kernel)."""
        from torch.profiler import ProfilerActivity, profile, record_function

        calls = self._warm(launch, sets, warmup)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            events_us = self._run(calls, repeats, lambda i: record_function(call_name(i)))
        found = spans(prof.events())
        kernel_s = call_seconds(found)
        missing = [i for i in range(repeats) if i not in kernel_s]
        if missing:
            raise RuntimeError(f"the profiler recorded no GPU range for {len(missing)} of {repeats} calls "
                               f"(first: call {missing[0]}); kernel time needs CUPTI's CUDA activity")
        return (summarize([kernel_s[i] * 1e6 for i in range(repeats)], "cupti"),
                summarize(events_us, "cuda-events"), found)


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
