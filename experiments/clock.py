"""How an experiment times its calls: the production clocks, with no device synchronisation on the call path.

CPU tensors: the host clock around the launch (what telemetry uses for them). GPU tensors, ``gated`` (the default):
an event pair behind telemetry's stream gate (``telemetry.clocks.gate``: the kernels run unstamped, as production
runs them). ``stamp``: a device stamp where the call's kernels write one (the project's own kernels: no CUDA call
on the host, but writing it slows a 7 µs split-K kernel by 9%, docs/experiments.md), gated pairs for the kernels
that write none (AITER's, vLLM's: learnt from each cell's first timed call, which is dropped). Plain event pairs
are never used: they time the host's launch path too.

Calibration: what a gated pair reads beyond the kernels is measured per device, without a profiler, when the
device's gate is built (the flush thread): ``CALIBRATION_PAIRS`` empty gated pairs on a side stream, their median
(``calibration_ns``) plus the kernel step of the device's model (``KERNEL_STEP_NS``) is taken off every gated
reading at resolve. Readings that arrive before it are held, not mixed in raw.

Systematic bound: every reading carries its clock's residual bound (``BOUND_NS``, seconds on the ticket), the most
the clock may read off a kernel's true time once calibrated, measured against CUPTI on the H200
(docs/experiments.md); the report widens each cell's band by it, so many calls cannot narrow the band past what the
clock can resolve. ROCm takes the same path through HIP's torch.cuda API (HIP events, the gate's Triton wait); the
stamps' ``%globaltimer`` has its ROCm form in the kernels (``s_memrealtime``). Not run on AMD.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Any

from telemetry.clocks.frame import AUTO, GATED, device_name, frame_ns, measured_ns
from telemetry.clocks.stamps import StampTable

log = logging.getLogger("routescope.experiments")
GIVE_UP_S = 30.0
GIVE_UP_CALIBRATION_S = 5.0
CALIBRATION_PAIRS = 64
CALIBRATION_MIN = 8  # pairs read before the give-up time for the calibration to count
CALIBRATION_SLOT = -1  # slots at or below this are calibration pairs, never a call's
HELD_MAX = 100_000  # readings held while a device calibrates; beyond this they are dropped (counted)

# What a gated pair reads beyond an empty gated pair: the launch step into the kernel and out of it, per device model
# (docs/experiments.md, "The clock"); a model not measured gets 0.
KERNEL_STEP_NS: dict[str, int] = {}
HOST, GATED_CLOCK, STAMP = "host", "gated", "stamp"
# The residual bound per clock and device model, ns: the most one clock's mean reading of a kernel may lie off CUPTI's
# after calibration (docs/experiments.md, "The clock"); a model not measured gets the DEFAULT's, a guess stated as one.
BOUND_NS: dict[str, dict[str, int]] = {
    HOST: {},  # on the CPU the host clock is the ground truth itself
    GATED_CLOCK: {"NVIDIA H200": 600},
    STAMP: {"NVIDIA H200": 2000},
}
DEFAULT_BOUND_NS = {HOST: 0, GATED_CLOCK: 1200, STAMP: 4000}


def bound_ns(clock: str, name: str) -> int:
    """The residual bound of ``clock`` on a device model named ``name``."""
    return BOUND_NS[clock].get(name, DEFAULT_BOUND_NS[clock])


class Ticket:
    """One chosen call's state: its cell, arm, covariate, clock handles, and its reading's bound (seconds)."""

    __slots__ = ("cell", "is_b", "x", "t0", "stamp", "pair", "claimed", "on_device", "bound")

    def __init__(self, cell: Any, is_b: bool, x: float | None) -> None:
        self.cell = cell
        self.is_b = is_b
        self.x = x
        self.t0 = 0
        self.stamp: Any = None
        self.pair: Any = None
        self.claimed = 0.0
        self.on_device = False
        self.bound = 0.0


UNLEARNT, BY_STAMP, BY_EVENTS = 0, 1, 2


class Calibration:
    """One device's gated offset: empty gated pairs read on a side stream, their median, plus the kernel step."""

    def __init__(self, device: Any, name: str) -> None:
        self.device = device
        self.name = name
        self.readings: list[int] = []
        self.offset_ns: int | None = None  # taken off each gated reading once known
        self.bound_s = bound_ns(GATED_CLOCK, name) * 1e-9
        self.started = time.monotonic()

    def add(self, ns: int) -> None:
        self.readings.append(ns)
        if len(self.readings) >= CALIBRATION_PAIRS:
            self.settle()

    def settle(self) -> None:
        """The offset from the pairs read so far (at least ``CALIBRATION_MIN``), else the table's constant."""
        if self.offset_ns is not None:
            return
        if len(self.readings) >= CALIBRATION_MIN:
            self.offset_ns = round(statistics.median(self.readings)) + KERNEL_STEP_NS.get(self.name, 0)
        else:
            self.fall_back()

    def fall_back(self) -> None:
        """No empty pair came back: the table's constant for the model (``telemetry.clocks.frame``), logged."""
        self.offset_ns = measured_ns(GATED, self.name)
        log.warning("experiment clock: no calibration on %s; its gated pairs take the table's %d ns", self.device,
                    self.offset_ns)


class Clock:
    """Hands out a clock per timed call and turns finished ones into (ticket, seconds) at flush."""

    def __init__(self, torch_mod: Any = None, *, entries: int = 2048, gated: bool = True,
                 gate_launcher: Any = None) -> None:
        self._torch = torch_mod
        self._gated = gated
        self._gate_launcher = gate_launcher  # tests: the wait kernel's stand-in
        self._events: Any = None  # telemetry.clocks.events.GpuEvents (raw readings), built at the first gated call
        self._by_slot: dict[int, tuple[Ticket, Any]] = {}
        self._slots = 0
        self._entries = entries
        self._tables: dict[str, StampTable] = {}
        self._pending: list[Ticket] = []
        self._done: list[tuple[Ticket, float]] = []
        self._lock = threading.Lock()
        self.calibrations: dict[Any, Calibration] = {}
        self._cal_slots: dict[int, Calibration] = {}
        self._held: list[tuple[Ticket, Any, int]] = []  # gated readings waiting for their device's calibration
        # per (cell, arm), learnt from its first timed call: do its kernels stamp? (stamp clock only)
        self._how: dict[tuple[Any, bool], int] = {}
        self._stamp_bounds: dict[int, float] = {}
        self.dropped = 0  # timed calls whose clock could not be read (pool empty, never written, given up)

    def calibrated(self) -> dict[str, dict]:
        """Each device's calibration: the offset taken off its gated readings, the empty pairs read, the bound."""
        out = {}
        for device, cal in self.calibrations.items():
            r = sorted(cal.readings)
            out[str(device)] = {"offset_ns": cal.offset_ns, "pairs": len(r), "bound_ns": round(cal.bound_s * 1e9),
                                "empty_p10_ns": r[len(r) // 10] if r else None,
                                "empty_median_ns": r[len(r) // 2] if r else None,
                                "empty_p90_ns": r[9 * len(r) // 10] if r else None,
                                "kernel_step_ns": KERNEL_STEP_NS.get(cal.name, 0)}
        return out

    def begin(self, ticket: Ticket, q: Any, stream: Any) -> Any:
        """Start timing; returns a device stamp for the launch to write, or None."""
        if not q.is_cuda:
            ticket.t0 = time.perf_counter_ns()
            return None
        ticket.on_device = True
        ticket.claimed = time.monotonic()
        if self._gated or self._how.get((ticket.cell, ticket.is_b), UNLEARNT) == BY_EVENTS:
            got = self._gpu_events().begin(stream, q.device)  # closes the device's gate (once built)
            # None: the pool is empty; a 1-tuple (CLOCK_PENDING): the device's gate is still being built
            ticket.pair = ("gated", got[0], got[1], q.device) if got is not None and len(got) == 2 else None
            return None
        table = self._table(q.device)
        with self._lock:
            stamp = table.claim()
        ticket.stamp = stamp
        return stamp

    def end(self, ticket: Ticket) -> None:
        """Stop timing (right after the launch returned)."""
        if not ticket.on_device:
            dt = time.perf_counter_ns() - ticket.t0
            with self._lock:
                self._done.append((ticket, dt * 1e-9))
            return
        pair = ticket.pair
        if pair is not None:
            _, events_pair, stream, device = pair
            with self._lock:
                self._slots += 1
                slot = self._slots
                self._by_slot[slot] = (ticket, device)
            self._events.end(slot, events_pair, stream, 0)  # records the end event, then opens the gate
            return
        stamp = ticket.stamp
        if stamp is None:  # no pair (gate pending, pool empty) and no stamp entry
            self.dropped += 1
            return
        key = (ticket.cell, ticket.is_b)
        if key not in self._how:
            self._how[key] = BY_STAMP if stamp.armed else BY_EVENTS
        if not stamp.armed:  # the kernels wrote no stamp: this call is not timed; the cell's next ones are gated
            self.drop(ticket)
            self.dropped += 1
            return
        with self._lock:
            self._pending.append(ticket)

    def drop(self, ticket: Ticket) -> None:
        """A timed launch that did not run as timed: free its clock."""
        if ticket.pair is not None:
            self._events.release(ticket.pair[1])  # opens its gate first
            ticket.pair = None
            return
        stamp = ticket.stamp
        if stamp is not None:
            with self._lock:
                stamp.table.free(stamp.index)
            ticket.stamp = None

    def resolve(self) -> list[tuple[Ticket, float]]:
        """Every timing finished since the last call: (ticket, seconds), ``ticket.bound`` set. Never waits."""
        with self._lock:
            done, self._done = self._done, []
            pending, self._pending = self._pending, []
        if self._events is not None:
            self._events.prepare()  # builds the gates asked for: off the call path
            self._calibrate()
            self._events.resolve(_Sink(self), _Health(self))
            self._release_held(done)
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

    def _calibrate(self) -> None:
        """Enqueue each newly gated device's empty pairs on a side stream (flush thread; read at later flushes)."""
        events = self._events
        gates = events.gates
        for device in gates.ready():
            if device in self.calibrations:
                continue
            cal = self.calibrations[device] = Calibration(device, device_name(self._torch, device))
            side = self._torch.cuda.Stream(device)
            for _ in range(CALIBRATION_PAIRS):
                got = events.begin(side, device)
                if got is None or len(got) != 2:
                    break
                with self._lock:
                    self._slots += 1
                    slot = -self._slots
                self._cal_slots[slot] = cal
                events.end(slot, got[0], got[1], 0)
            if not any(c is cal for c in self._cal_slots.values()):
                cal.settle()  # no pair could be enqueued: the table's constant

    def _release_held(self, done: list) -> None:
        """Held gated readings whose device is calibrated now: less its offset, with its bound."""
        now = time.monotonic()
        for cal in self.calibrations.values():
            if cal.offset_ns is None and now - cal.started > GIVE_UP_CALIBRATION_S:
                cal.settle()  # some empty pairs never came back (a wait ran out): what was read, or the table's
        if not self._held:
            return
        keep = []
        for ticket, device, ns in self._held:
            cal = self.calibrations.get(device)
            if cal is None or cal.offset_ns is None:
                keep.append((ticket, device, ns))
                continue
            ticket.bound = cal.bound_s
            done.append((ticket, max(ns - cal.offset_ns, 0) * 1e-9))
        self._held = keep

    def _read(self, ticket: Ticket) -> float | None:
        stamp = ticket.stamp
        s, e = stamp.table.read(stamp.index)
        if s <= 0 or e < s:
            return None
        self.drop(ticket)
        ticket.bound = self._stamp_bound(stamp.table)
        return (e - s + stamp.table.frame) * 1e-9

    def _stamp_bound(self, table: StampTable) -> float:
        bound = self._stamp_bounds.get(id(table))
        if bound is None:
            bound = self._stamp_bounds[id(table)] = bound_ns(STAMP, device_name(self._torch, table.device)) * 1e-9
        return bound

    def _gpu_events(self) -> Any:
        if self._events is None:
            from telemetry.clocks.events import GpuEvents
            from telemetry.clocks.gate import GateFactory

            kw = {} if self._gate_launcher is None else {"launcher": self._gate_launcher}
            # raw readings (no table constant): the calibration's offset is taken off at resolve
            self._events = GpuEvents(self._torch, self._entries, gates=GateFactory(self._torch, self._entries, **kw),
                                     gated_frame_ns=0)
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
    """Where ``GpuEvents.resolve`` hands its raw readings: calibration pairs, or a call's (held until calibrated)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def observe(self, slot: int, kind: Any, dt_ns: int, wall_ns: int) -> None:
        clock = self._clock
        if slot <= CALIBRATION_SLOT:
            cal = clock._cal_slots.pop(slot, None)
            if cal is not None and str(kind) == "gated":
                cal.add(dt_ns)
            return
        got = clock._by_slot.pop(slot, None)
        if got is None:
            return
        if str(kind) != "gated":  # a plain pair (no gate on this device): it times the host's launch too
            clock.dropped += 1
            return
        if len(clock._held) >= HELD_MAX:
            clock.dropped += 1
            return
        clock._held.append((got[0], got[1], dt_ns))


class _Health:
    """``GpuEvents``' drop and error reports, counted as readings lost (a calibration pair's too)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def drop(self, reason: str, n: int = 1) -> None:
        self._clock.dropped += n

    def error(self, stage: str) -> None:
        self._clock.dropped += 1
