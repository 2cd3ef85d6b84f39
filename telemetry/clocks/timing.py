"""Timing of sampled calls: what the probe hands back for them, and how a sample is kept.

Only sampled calls reach this module. Clocks (``slots.Clock``): device stamps written by the call's own kernels
(``stamps.DeviceStamps``); for kernels that write none (AITER's, vLLM's), event pairs (``events``: gated where the
device has a stream gate, plain elsewhere, and captured into CUDA graphs for replayed calls) or, for replayed calls,
stamp brackets (``bracket``); the host clock for CPU tensors. Every sample reaches the slot histograms through
``LatencySink.observe``, at flush.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from typing import Any

from ..aggregates import Health
from ..buckets import LATENCY_BOUNDS_NS, N_LATENCY_BUCKETS
from ..native import NativeCounts
from ..slots import Clock, SlotCounters


class Token:
    """What ``start`` hands ``stop`` for a sampled or late-counted call (a plain int slot for every other call)."""

    __slots__ = ("slot", "t0", "pair", "stream", "stamp", "rows", "decode_rows", "count_at_stop", "announced")

    def __init__(self, slot: int, t0: int = 0) -> None:
        self.slot = slot
        self.t0 = t0  # perf_counter_ns at start (0: not timed on the host)
        self.pair: Any = None  # an event pair, recorded at start
        self.stream: Any = None
        self.stamp: Any = None  # a dispatcher.kernels.stamps.DeviceStamp the launch may arm
        self.rows = 0
        self.decode_rows = 0
        self.count_at_stop = False  # OPUS: counted at stop, on the slot of the kernel that ran
        self.announced: str | None = None  # the implementation start was told of, noted there


class CapturedToken:
    """A call seen during a CUDA graph capture: recorded against the graph at stop, counted at each replay."""

    __slots__ = ("slot", "capture", "stamp", "pair", "bracket", "stream", "device", "rows", "decode_rows",
                 "count_at_stop", "announced")

    def __init__(self, slot: int, capture: Any, rows: int, decode_rows: int, count_at_stop: bool) -> None:
        self.slot = slot
        self.capture = capture
        self.stamp: Any = None
        self.pair: Any = None  # an external event pair whose start was recorded into the graph
        self.bracket: Any = None  # a bracket.Entry whose first stamp was captured into the graph
        self.stream: Any = None
        self.device: Any = None
        self.rows = rows
        self.decode_rows = decode_rows
        self.count_at_stop = count_at_stop
        self.announced: str | None = None


class LatencySink:
    """Adds latency samples to the slot histograms (one clock per slot's main series) and queues them for OTel."""

    def __init__(self, counters: SlotCounters, health: Health, samples: deque | None, cap: int) -> None:
        self._counters = counters
        self._health = health
        self.samples = samples
        self._cap = cap
        self._lock = threading.Lock()

    def lock_free(self, wait: float) -> bool:
        """Can ``observe``'s lock be had within ``wait`` seconds? A signal handler's flush asks before resolving
        samples: had it interrupted a thread inside ``observe``, it would wait for that thread forever. (Sound there:
        the interrupted thread cannot take the lock again until the handler returns.)"""
        if not self._lock.acquire(timeout=wait):
            return False
        self._lock.release()
        return True

    def observe(self, slot: int, clock: Clock, dt_ns: int, wall_ns: int) -> None:
        """One sample of ``clock`` for ``slot``; a slot's histogram takes its first clock, others sit beside it."""
        if dt_ns < 0:
            dt_ns = 0
        bucket = bisect_left(LATENCY_BOUNDS_NS, dt_ns)
        counters = self._counters
        if counters.latency_clock[slot] is None:
            counters.latency_clock[slot] = clock
        if counters.latency_clock[slot] is clock:
            counters.latency[slot][bucket] += 1  # type: ignore[index]
            counters.latency_sum_ns[slot] += dt_ns
            counters.latency_native[slot].observe(dt_ns)  # type: ignore[union-attr]
        else:
            with self._lock:
                counts, total = counters.other_clock.setdefault((slot, clock), ([0] * N_LATENCY_BUCKETS, [0]))
                counts[bucket] += 1
                total[0] += dt_ns
                native = counters.other_clock_native.get((slot, clock))
                if native is None:
                    native = counters.other_clock_native[(slot, clock)] = NativeCounts()
                native.observe(dt_ns)
        samples = self.samples
        if samples is not None:
            if len(samples) < self._cap:
                samples.append((slot, clock, dt_ns, wall_ns))
            else:
                self._health.drop("buffer_full")


def capture_check(torch_mod: Any) -> Any:
    """A no-argument function: is the current stream capturing a graph? (False when CUDA is absent.)"""
    try:
        return torch_mod.cuda.is_current_stream_capturing
    except AttributeError:  # pragma: no cover - very old torch
        return lambda: False
