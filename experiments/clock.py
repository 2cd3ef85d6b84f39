"""How an experiment times its calls: the production clocks, with no device synchronisation on the call path.

CPU tensors: the host clock around the launch (what telemetry uses for them). GPU tensors, ``stamp`` (the default):
a device stamp where the call's kernels write one (the project's own kernels: the reading is within 1.5% of CUPTI,
docs/timing-fidelity.md, but writing it slows a 7 µs split-K kernel by 9%, docs/experiments.md), else a plain event
pair (AITER's and vLLM's kernels), read with ``query()`` at flush. ``gated``: every timed call by an event pair behind
telemetry's stream gate (``telemetry.clocks.gate``: the kernels alone, unstamped); readings taken before the device's
gate is built, or whose wait ran out, are dropped and counted, never mixed in as plain pairs. ROCm takes the same path through HIP's
torch.cuda API; the stamps' ``%globaltimer`` has its ROCm form in the kernels (``s_memrealtime``), not run on AMD.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from telemetry.clocks.frame import AUTO, device_name, frame_ns
from telemetry.clocks.stamps import StampTable

GIVE_UP_S = 30.0


class Ticket:
    """One chosen call's state: its cell, arm, covariate and clock handles."""

    __slots__ = ("cell", "is_b", "x", "t0", "stamp", "pair", "claimed", "on_device")

    def __init__(self, cell: Any, is_b: bool, x: float | None) -> None:
        self.cell = cell
        self.is_b = is_b
        self.x = x
        self.t0 = 0
        self.stamp: Any = None
        self.pair: Any = None
        self.claimed = 0.0
        self.on_device = False


UNLEARNT, BY_STAMP, BY_EVENTS = 0, 1, 2


class Clock:
    """Hands out a clock per timed call and turns finished ones into (ticket, seconds) at flush."""

    def __init__(self, torch_mod: Any = None, *, entries: int = 2048, gated: bool = False,
                 gate_launcher: Any = None) -> None:
        self._torch = torch_mod
        self._gated = gated
        self._gate_launcher = gate_launcher  # tests: the wait kernel's stand-in
        self._events: Any = None  # telemetry.clocks.events.GpuEvents, built at the first gated call
        self._by_slot: dict[int, Ticket] = {}
        self._slots = 0
        self._entries = entries
        self._tables: dict[str, StampTable] = {}
        self._pending: list[Ticket] = []
        self._done: list[tuple[Ticket, float]] = []
        self._lock = threading.Lock()
        # per (cell, arm), learnt from its first timed calls as telemetry learns it per slot: do its kernels stamp?
        # (then no event pair is recorded for it: a stamp costs the host no CUDA call at all)
        self._how: dict[tuple[Any, bool], int] = {}
        self.dropped = 0  # timed calls whose clock could not be read (pool empty, never written, given up)

    def begin(self, ticket: Ticket, q: Any, stream: Any) -> Any:
        """Start timing; returns a device stamp for the launch to write, or None."""
        if not q.is_cuda:
            ticket.t0 = time.perf_counter_ns()
            return None
        ticket.on_device = True
        ticket.claimed = time.monotonic()
        if self._gated:
            got = self._gpu_events().begin(stream, q.device)  # closes the device's gate (once built)
            # None: the pool is empty; a 1-tuple (CLOCK_PENDING): the device's gate is still being built
            ticket.pair = ("gated", got[0], got[1]) if got is not None and len(got) == 2 else None
            return None
        how = self._how.get((ticket.cell, ticket.is_b), UNLEARNT)
        stamp = None
        if how != BY_EVENTS:
            table = self._table(q.device)
            with self._lock:
                stamp = table.claim()
            ticket.stamp = stamp
        if how != BY_STAMP or stamp is None:
            torch = self._torch
            if stream is None:
                stream = torch.cuda.current_stream(q.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            ticket.pair = (start, end, stream)
        return stamp

    def end(self, ticket: Ticket) -> None:
        """Stop timing (right after the launch returned)."""
        if not ticket.on_device:
            dt = time.perf_counter_ns() - ticket.t0
            with self._lock:
                self._done.append((ticket, dt * 1e-9))
            return
        if self._gated:
            if ticket.pair is None:
                self.dropped += 1
                return
            _, pair, stream = ticket.pair
            with self._lock:
                self._slots += 1
                slot = self._slots
                self._by_slot[slot] = ticket
            self._events.end(slot, pair, stream, 0)  # records the end event, then opens the gate
            return
        stamp = ticket.stamp
        key = (ticket.cell, ticket.is_b)
        if stamp is not None and key not in self._how:
            self._how[key] = BY_STAMP if stamp.armed else BY_EVENTS
        if stamp is not None and not stamp.armed:
            self.drop(ticket)  # the launch wrote no stamp: its entry goes back at once
        if ticket.pair is not None:
            if ticket.stamp is not None:  # stamped: the pair is not needed
                ticket.pair = None
            else:
                start, end, stream = ticket.pair
                end.record(stream)
        if ticket.stamp is None and ticket.pair is None:
            self.dropped += 1
            return
        with self._lock:
            self._pending.append(ticket)

    def drop(self, ticket: Ticket) -> None:
        """A timed launch that did not run as timed: free its clock."""
        if self._gated and ticket.pair is not None and ticket.pair[0] == "gated":
            self._events.release(ticket.pair[1])  # opens its gate first
            ticket.pair = None
            return
        stamp = ticket.stamp
        if stamp is not None:
            with self._lock:
                stamp.table.free(stamp.index)
            ticket.stamp = None

    def resolve(self) -> list[tuple[Ticket, float]]:
        """Every timing finished since the last call: (ticket, seconds). Never waits for the device."""
        with self._lock:
            done, self._done = self._done, []
            pending, self._pending = self._pending, []
        if self._events is not None:
            self._events.prepare()  # builds the gates asked for: off the call path
            self._events.resolve(_Sink(self, done), _Health(self))
        keep = []
        now = time.monotonic()
        for ticket in pending:
            seconds = self._read(ticket)
            if seconds is None:
                if now - ticket.claimed > GIVE_UP_S:
                    self.dropped += 1
                    self.drop(ticket)
                else:
                    keep.append(ticket)
                continue
            done.append((ticket, seconds))
        if keep:
            with self._lock:
                self._pending.extend(keep)
        return done

    def _read(self, ticket: Ticket) -> float | None:
        stamp = ticket.stamp
        if stamp is not None:
            s, e = stamp.table.read(stamp.index)
            if s <= 0 or e < s:
                return None
            self.drop(ticket)
            return (e - s + stamp.table.frame) * 1e-9
        start, end, _ = ticket.pair
        if not end.query():
            return None
        self.drop(ticket)
        return start.elapsed_time(end) * 1e-3

    def _gpu_events(self) -> Any:
        if self._events is None:
            from telemetry.clocks.events import GpuEvents
            from telemetry.clocks.gate import GateFactory

            kw = {} if self._gate_launcher is None else {"launcher": self._gate_launcher}
            self._events = GpuEvents(self._torch, self._entries, gates=GateFactory(self._torch, self._entries, **kw))
        return self._events

    def _table(self, device: Any) -> StampTable:
        key = str(device)
        table = self._tables.get(key)
        if table is None:
            with self._lock:
                table = self._tables.get(key)
                if table is None:
                    frame = frame_ns(device_name(self._torch, device), AUTO)
                    table = self._tables[key] = StampTable(self._torch, device, eager=self._entries, graph=0,
                                                           frame=frame)
        return table


class _Sink:
    """Where ``GpuEvents.resolve`` hands its readings: gated ones become samples, plain ones are dropped."""

    def __init__(self, clock: Clock, done: list) -> None:
        self._clock, self._done = clock, done

    def observe(self, slot: int, kind: Any, dt_ns: int, wall_ns: int) -> None:
        ticket = self._clock._by_slot.pop(slot, None)
        if ticket is None:
            return
        if str(kind) == "gated":
            self._done.append((ticket, max(dt_ns, 0) * 1e-9))
        else:  # a plain pair (no gate on this device yet): it times the host's launch too
            self._clock.dropped += 1


class _Health:
    """``GpuEvents``' drop and error reports, counted as readings lost."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def drop(self, reason: str, n: int = 1) -> None:
        self._clock.dropped += n

    def error(self, stage: str) -> None:
        self._clock.dropped += 1
