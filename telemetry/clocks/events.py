"""Event pairs for calls whose kernels write no device stamps (vLLM's, AITER's): eager pairs, gated or plain, and
pairs captured into CUDA graphs.

Eager calls take a pair from a fixed pool. Where the device has a stream gate (``telemetry.clocks.gate``), the
pair is gated: the stream waits until the launch has returned, so the pair times the kernels alone (clock
``gated``, less the GPU model's gated frame, ``telemetry.clocks.frame``). Elsewhere the pair is plain (clock
``events``) and times the host's launch path too whenever the GPU waits for it; a device whose gate is still being
built times no call (a series starts on the clock it keeps). Pairs are resolved by the flush thread with
``query()``: never ``synchronize()``.

A call captured into a CUDA graph runs no Python at replay, so it can be timed only by events that are part of the
graph: an external event pair (``Event(external=True)``, CUDA only) recorded around it during capture. Every replay
re-records the pair; each flush reads the latest finished replay (clock ``graph``, less its own frame). It is the
graph clock where ``graph_clock="events"`` or the stamp bracket (``bracket``) failed to build; HIP refuses external
events in a capture, so on ROCm the bracket is the only graph clock.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ..aggregates import Health
from .frame import GATED, GRAPH, device_name, measured_ns
from .gate import RELEASED, TIMED_OUT, GateFactory, StreamGate
from ..slots import Clock
from .timing import LatencySink


CLOCK_PENDING = ("clock pending",)  # begin's answer while the gate is being built: no pair, so no plain sample


class Constants:
    """A clock's constant per device, looked up once per device (``telemetry.clocks.frame``)."""

    def __init__(self, torch_mod: Any, clock: str, setting: int | None) -> None:
        self._torch, self._clock, self._setting = torch_mod, clock, setting
        self._by_device: dict[Any, int] = {}

    def known(self) -> dict[Any, int]:
        """The constant of each device looked up so far."""
        return dict(self._by_device)

    def __call__(self, device: Any) -> int:
        hit = self._by_device.get(device)
        if hit is None:
            hit = self._by_device[device] = measured_ns(self._clock, device_name(self._torch, device), self._setting)
        return hit


def is_rocm(torch_mod: Any) -> bool:
    """Is this torch built for HIP? (``torch.version.hip`` is set there; a stand-in without it is CUDA.)"""
    return bool(getattr(getattr(torch_mod, "version", None), "hip", None))


class GpuEvents:
    """A fixed pool of eager event pairs ``(start, end, index)``; ``index`` is the pair's own gate word."""

    def __init__(self, torch_mod: Any, size: int, *, gates: GateFactory | None = None,
                 gated_frame_ns: int | None = None) -> None:
        self.torch = torch_mod
        self.free: list[tuple[Any, Any, int]] = [
            (torch_mod.cuda.Event(enable_timing=True), torch_mod.cuda.Event(enable_timing=True), i)
            for i in range(size)
        ]
        self.gates = gates
        self.gated: list[StreamGate | None] = [None] * size  # the gate pair i waits on, while it is in flight
        self.pending: deque = deque()
        self.lock = threading.Lock()
        self.frame = Constants(torch_mod, GATED, gated_frame_ns)  # ns taken off a gated reading, per device

    def begin(self, stream: Any, device: Any) -> Any:
        """Close the device's gate (where it has one) and record the start event: (pair, stream); None when the
        pool is empty, ``CLOCK_PENDING`` while the device's gate is not built yet (the caller counts a drop)."""
        gates = self.gates
        gate = None
        if gates is not None:
            gate = gates.get(device)
            if gate is None and not gates.built(device):
                return CLOCK_PENDING
        if stream is None:
            stream = self.torch.cuda.current_stream(device)
        try:
            pair = self.free.pop()
        except IndexError:
            return None
        if gates is not None:
            if gate is not None:
                index = pair[2]
                try:
                    gate.close(index, stream.cuda_stream)
                except BaseException:  # the call goes on untimed (the probe counts the error); the pair goes back
                    gate.open(index)
                    self.free.append(pair)
                    raise
                self.gated[index] = gate
        pair[0].record(stream)
        return pair, stream

    def end(self, slot: int, pair: tuple[Any, Any, int], stream: Any, wall_ns: int) -> None:
        """Record the end event, then open the gate: the stream runs the queued call between the two."""
        try:
            pair[1].record(stream)
        finally:
            gate = self.gated[pair[2]]
            if gate is not None:
                gate.open(pair[2])
        self.pending.append((slot, pair, wall_ns))

    def release(self, pair: tuple[Any, Any, int]) -> None:
        """Give a pair back unused (the launch raised, or its kernels stamped): its gate, if closed, opens first."""
        gate = self.gated[pair[2]]
        if gate is not None:
            gate.open(pair[2])
            self.gated[pair[2]] = None
        self.free.append(pair)

    def resolve(self, sink: LatencySink, health: Health) -> int:
        """Turn finished pairs into samples; unfinished ones wait for the next flush. Returns how many."""
        done = 0
        with self.lock:
            for _ in range(len(self.pending)):
                slot, pair, wall_ns = self.pending.popleft()
                index = pair[2]
                gate = self.gated[index]
                try:
                    finished = pair[1].query()
                except Exception:  # noqa: BLE001 - a broken event is dropped, never retried forever
                    health.error("timing")
                    self.gated[index] = None
                    self.free.append(pair)
                    continue
                if not finished:
                    self.pending.append((slot, pair, wall_ns))
                    continue
                self.gated[index] = None
                try:
                    ns = round(pair[0].elapsed_time(pair[1]) * 1e6)
                    if gate is None:
                        sink.observe(slot, Clock.EVENTS, ns, wall_ns)
                        done += 1
                    else:
                        outcome = gate.outcome(index)
                        if outcome == RELEASED:
                            sink.observe(slot, Clock.GATED, ns - self.frame(gate.device), wall_ns)
                            done += 1
                        else:  # the wait ran out (or never wrote): the pair holds host time, not a kernel's
                            health.drop("timing_gate_timeout" if outcome == TIMED_OUT else "timing_unresolved")
                except Exception:  # noqa: BLE001
                    health.error("timing")
                self.free.append(pair)
        return done

    def prepare(self) -> int:
        """Build the gates sampled calls asked for (from the flush thread, never while a graph is captured)."""
        if self.gates is None or not self.gates.pending:
            return 0
        return self.gates.prepare()


class GraphEvents:
    """External event pairs held by captured calls for their graph's lifetime; each flush reads the latest replay."""

    def __init__(self, torch_mod: Any, size: int, *, frame_ns: int | None = None) -> None:
        self.torch = torch_mod
        self.size = size
        self.made = 0
        self.free: list[tuple[Any, Any]] = []
        self.held: dict[int, list] = {}  # id(pair) -> [slot, pair, replays (a one-int list), replays read, device]
        self.lock = threading.Lock()
        self.frame = Constants(torch_mod, GRAPH, frame_ns)  # ns taken off a graph reading, per device

    def claim(self) -> tuple[Any, Any] | None:
        """A pair for a call being captured; None when all ``size`` are held (the call's replays stay untimed)."""
        with self.lock:
            if self.free:
                return self.free.pop()
            if self.made >= self.size:
                return None
            self.made += 1
        cuda = self.torch.cuda
        return cuda.Event(enable_timing=True, external=True), cuda.Event(enable_timing=True, external=True)

    def hold(self, slot: int, pair: tuple[Any, Any], replays: list[int], device: Any) -> Any:
        """Read ``pair`` at each flush while its graph lives; returns the release to run when the graph goes."""
        entry = [slot, pair, replays, replays[0], device]
        with self.lock:
            self.held[id(pair)] = entry

        def release() -> None:
            with self.lock:
                if self.held.pop(id(pair), None) is not None:
                    self.free.append(pair)

        return release

    def give_back(self, pair: tuple[Any, Any]) -> None:
        """A pair claimed for a capture that will not hold it (the call stamped, or raised)."""
        with self.lock:
            self.free.append(pair)

    def resolve(self, sink: LatencySink, health: Health, wall_ns: int) -> int:
        """One sample per held pair whose graph was replayed since the last read and whose latest replay is done."""
        done = 0
        with self.lock:
            entries = list(self.held.values())
        for entry in entries:
            slot, pair, replays, seen, device = entry
            now = replays[0]
            if now == seen:
                continue
            try:
                if not pair[1].query():
                    continue  # a replay in flight: the next flush reads it
                ns = round(pair[0].elapsed_time(pair[1]) * 1e6)
            except Exception:  # noqa: BLE001
                health.error("timing")
                entry[3] = now
                continue
            entry[3] = now
            sink.observe(slot, Clock.GRAPH, ns - self.frame(device), wall_ns)
            done += 1
        return done


def graph_events_supported(torch_mod: Any) -> bool:
    """Can a timing event be recorded inside a capture here? CUDA: external events; HIP: no."""
    return not is_rocm(torch_mod)


__all__ = ["CLOCK_PENDING", "GpuEvents", "GraphEvents", "graph_events_supported", "is_rocm", "RELEASED", "TIMED_OUT"]
