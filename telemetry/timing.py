"""Timing of sampled calls: host clock on CPU, pooled CUDA/HIP events on GPU, read back without blocking.

Only sampled calls reach this module. GPU events are created once (a pool), recorded on the
stream the dispatcher passes (the current stream is looked up only when none was passed),
and resolved at flush with ``query()``: never ``synchronize()``. During graph capture no
event is recorded (non-external timing events fail in capture; ROCm refuses external ones).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from typing import Any

from .aggregates import DROP, STAGE, Aggregates
from .buckets import LATENCY_BOUNDS_NS


class Token:
    """What ``start`` hands ``stop`` for a sampled or OPUS call (a plain int for every other call)."""

    __slots__ = ("s", "t0", "pair", "stream", "rows", "drows", "rich")

    def __init__(self, s: int, t0: int = 0, pair: Any = None, stream: Any = None,
                 rows: int = 0, drows: int = 0, rich: bool = False) -> None:
        self.s = s
        self.t0 = t0
        self.pair = pair
        self.stream = stream
        self.rows = rows
        self.drows = drows
        self.rich = rich


def observe(agg: Aggregates, s: int, dt_ns: int, samples: deque | None, cap: int, wall_ns: int) -> None:
    """Add one latency sample to slot ``s``; queue it for OpenTelemetry when that is on."""
    if dt_ns < 0:
        dt_ns = 0
    agg.hists[s][bisect_left(LATENCY_BOUNDS_NS, dt_ns)] += 1  # type: ignore[index]
    agg.hsum[s] += dt_ns
    if samples is not None:
        if len(samples) < cap:
            samples.append((s, dt_ns, wall_ns))
        else:
            agg.dropped[DROP["buffer_full"]] += 1


class GpuEvents:
    """A fixed pool of event pairs; pending pairs are resolved by the flush thread with query()."""

    def __init__(self, torch_mod: Any, size: int) -> None:
        self.torch = torch_mod
        self.free: list[tuple[Any, Any]] = [
            (torch_mod.cuda.Event(enable_timing=True), torch_mod.cuda.Event(enable_timing=True)) for _ in range(size)
        ]
        self.pending: deque = deque()
        self.lock = threading.Lock()

    def begin(self, stream: Any, device: Any) -> tuple[Any, Any, Any] | None:
        """Record the start event; None when the pool is empty (the caller counts a drop)."""
        if stream is None:
            stream = self.torch.cuda.current_stream(device)
        try:
            pair = self.free.pop()
        except IndexError:
            return None
        pair[0].record(stream)
        return pair, stream, None

    def end(self, s: int, pair: tuple[Any, Any], stream: Any, wall_ns: int) -> None:
        pair[1].record(stream)
        self.pending.append((s, pair, wall_ns))

    def release(self, pair: tuple[Any, Any]) -> None:
        self.free.append(pair)

    def resolve(self, agg: Aggregates, samples: deque | None, cap: int) -> int:
        """Turn finished pairs into samples; unfinished ones wait for the next flush. Returns how many."""
        done = 0
        with self.lock:
            for _ in range(len(self.pending)):
                s, pair, wall_ns = self.pending.popleft()
                try:
                    finished = pair[1].query()
                except Exception:  # noqa: BLE001 - a broken event is dropped, never retried forever
                    agg.errs[STAGE["timing"]] += 1
                    self.free.append(pair)
                    continue
                if not finished:
                    self.pending.append((s, pair, wall_ns))
                    continue
                try:
                    ms = pair[0].elapsed_time(pair[1])
                    observe(agg, s, int(ms * 1e6), samples, cap, wall_ns)
                    done += 1
                except Exception:  # noqa: BLE001
                    agg.errs[STAGE["timing"]] += 1
                self.free.append(pair)
        return done


_DEPTH_ATTR = "_routescope_capture_depth"


def capture_depth(torch_mod: Any) -> list[int] | None:
    """A one-element list counting torch graph captures under way, kept by wrapping CUDAGraph once.

    ``torch.cuda.is_current_stream_capturing()`` looks up the current stream: several µs per
    call on an H200 host, measured as a 6% throughput loss on a launch-bound replay when asked
    on every call. Reading ``depth[0]`` costs tens of ns. Every torch capture path
    (``torch.cuda.graph``, ``make_graphed_callables``, vLLM's graph wrappers) goes through
    ``CUDAGraph.capture_begin``/``capture_end``. Returns None where that class is absent.
    """
    try:
        cls = torch_mod.cuda.graphs.CUDAGraph
        begin, end = cls.capture_begin, cls.capture_end
    except AttributeError:
        return None
    depth = getattr(cls, _DEPTH_ATTR, None)
    if depth is not None:  # already wrapped in this process (idempotent across Telemetry objects)
        return depth
    depth = [0]

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = begin(self, *args, **kwargs)
        depth[0] += 1
        return result

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        depth[0] = max(0, depth[0] - 1)
        return end(self, *args, **kwargs)

    cls.capture_begin, cls.capture_end = capture_begin, capture_end
    setattr(cls, _DEPTH_ATTR, depth)
    return depth


def capture_check(torch_mod: Any) -> Any:
    """A no-argument function: is the current stream capturing a graph? (False when CUDA is absent.)"""
    try:
        return torch_mod.cuda.is_current_stream_capturing
    except AttributeError:  # pragma: no cover - very old torch
        return lambda: False
