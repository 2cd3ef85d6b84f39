"""How an experiment times its calls: the production clocks, with no device synchronisation on the call path.

CPU tensors: the host clock around the launch (what telemetry uses for them). GPU tensors, ``gated`` (the default):
an event pair behind telemetry's stream gate (``telemetry.clocks.gate``), the kernels unstamped as production runs
them, less the pair's own offset (``experiments.calibration``: per cell arm from a few stamped calls where the
kernels write stamps, else per device from empty pairs). ``stamp``: a device stamp where the call's kernels write
one (no CUDA call on the host, but writing it slows a 7 µs split-K kernel by 9%, docs/experiments.md), gated pairs
for the kernels that write none (learnt from each cell arm's first timed call, which is dropped). Plain event pairs
are never used: they time the host's launch path too.

Every reading carries its clock's residual bound (``Ticket.bound``, seconds), which the report adds to the band.
Readings are resolved at flush (``resolve``); one whose calibration is not known yet is held, never mixed in raw.
ROCm takes the same path through HIP's torch.cuda API (HIP events, the gate's Triton wait; the stamps'
``%globaltimer`` is ``s_memrealtime`` there). Not run on AMD.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from telemetry.clocks.frame import AUTO, GATED, device_name, frame_ns, measured_ns
from telemetry.clocks.stamps import StampTable

from .calibration import (CALIBRATION_PAIRS, DEVICE, GIVE_UP_S as HOLD_S, KERNEL, STAMP, DeviceCalibration,
                          KernelCalibration, bound_ns)

GIVE_UP_S = 30.0
HELD_MAX = 100_000  # readings held for a calibration; beyond this they are dropped (counted)


class Ticket:
    """One chosen call's state: its cell, arm, covariate, clock handles, and its reading's bound (seconds)."""

    __slots__ = ("cell", "is_b", "x", "t0", "stamp", "pair", "claimed", "on_device", "bound", "kcal")

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
        self.kcal: KernelCalibration | None = None  # gated: its arm's calibration; with a stamp, it calibrates


UNLEARNT, BY_STAMP, BY_EVENTS = 0, 1, 2


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
        self.devices: dict[Any, DeviceCalibration] = {}
        self.kernels: dict[tuple[Any, bool], KernelCalibration] = {}  # per (cell, arm): gated clock only
        self._cal_slots: dict[int, DeviceCalibration] = {}
        self._held: list[tuple[Ticket, Any, int, float]] = []  # (ticket, device, raw ns, since): awaiting an offset
        self._how: dict[tuple[Any, bool], int] = {}  # stamp clock: per (cell, arm), do its kernels stamp?
        self._stamp_bounds: dict[int, float] = {}
        self._by_device: dict[Any, StampTable] = {}  # the tables by the tensors' own device objects (no str())
        # the current stream's torch object by (device, raw handle): torch.cuda.current_stream() builds a new one
        # per call (about 5 µs of host time on an H200's host); the raw handle is a plain read
        self._raw_stream = getattr(getattr(torch_mod, "_C", None), "_cuda_getCurrentRawStream", None)
        self._streams: dict[tuple[int, int], Any] = {}
        self.dropped = 0  # timed calls whose clock could not be read (pool empty, never written, given up)
        self.calibrating = 0  # gated calls that carried a stamp to calibrate their arm (not timing samples)

    # -- the call path ------------------------------------------------------------------------------------------

    def begin(self, ticket: Ticket, q: Any, stream: Any) -> Any:
        """Start timing; returns a device stamp for the launch to write, or None."""
        if not q.is_cuda:
            ticket.t0 = time.perf_counter_ns()
            return None
        ticket.on_device = True
        ticket.claimed = time.monotonic()
        key = (ticket.cell, ticket.is_b)
        if self._gated or self._how.get(key, UNLEARNT) == BY_EVENTS:
            # closes the device's gate (once built)
            got = self._gpu_events().begin(self._current_stream(q) if stream is None else stream, q.device)
            if got is None or len(got) != 2:  # None: the pool is empty; CLOCK_PENDING: the gate is being built
                return None
            ticket.pair = (got[0], got[1], q.device)
            if not self._gated:
                return None
            kcal = self.kernels.get(key)
            if kcal is None:
                kcal = self.kernels[key] = KernelCalibration()
            ticket.kcal = kcal
            if kcal.wants_stamp():
                table = self._device_table(q.device)
                with self._lock:
                    ticket.stamp = table.claim()
                return ticket.stamp
            return None
        table = self._device_table(q.device)
        with self._lock:
            ticket.stamp = table.claim()
        return ticket.stamp

    def _current_stream(self, q: Any) -> Any:
        raw = self._raw_stream
        if raw is None:  # a torch without the raw read (the CUDA double): the public lookup
            return self._torch.cuda.current_stream(q.device)
        index = q.get_device()
        key = (index, raw(index))
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = self._torch.cuda.current_stream(q.device)
        return stream

    def _device_table(self, device: Any) -> StampTable:
        table = self._by_device.get(device)
        if table is None:
            table = self._by_device[device] = self._table(device)
        return table

    def end(self, ticket: Ticket) -> None:
        """Stop timing (right after the launch returned)."""
        if not ticket.on_device:
            dt = time.perf_counter_ns() - ticket.t0
            with self._lock:
                self._done.append((ticket, dt * 1e-9))
            return
        pair = ticket.pair
        stamp = ticket.stamp
        if pair is not None:
            if stamp is not None:
                ticket.kcal.saw(stamp.armed)
                if not stamp.armed:  # the kernels wrote no stamp: an ordinary sample
                    self._free_stamp(ticket)
            events_pair, stream, device = pair
            with self._lock:
                self._slots += 1
                slot = self._slots
                self._by_slot[slot] = (ticket, device)
            self._events.end(slot, events_pair, stream, 0)  # records the end event, then opens the gate
            return
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
            self._events.release(ticket.pair[0])  # opens its gate first
            ticket.pair = None
        self._free_stamp(ticket)

    def _free_stamp(self, ticket: Ticket) -> None:
        stamp = ticket.stamp
        if stamp is not None:
            with self._lock:
                stamp.table.free(stamp.index)
            ticket.stamp = None

    # -- off the call path --------------------------------------------------------------------------------------

    def resolve(self) -> list[tuple[Ticket, float]]:
        """Every timing finished since the last call: (ticket, seconds), ``ticket.bound`` set. Never waits."""
        with self._lock:
            done, self._done = self._done, []
            pending, self._pending = self._pending, []
        if self._events is not None:
            self._events.prepare()  # builds the gates asked for: off the call path
            self._calibrate_devices()
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

    def calibrated(self) -> dict:
        """What the clock takes off its gated readings: per device (empty pairs) and per cell arm (stamped calls)."""
        kernels = {}
        for (cell, is_b), kcal in self.kernels.items():
            name = f"{getattr(cell, 'name', cell)}|{'b' if is_b else 'a'}"
            kernels[name] = {"offset_ns": kcal.offset_ns(), "samples": len(kcal.samples), "stamps": kcal.stamps,
                             "calls": kcal.calls}
        return {"devices": {str(d): cal.summary() for d, cal in self.devices.items()}, "kernels": kernels,
                "calibrating_calls": self.calibrating}

    def _calibrate_devices(self) -> None:
        """Enqueue each newly gated device's empty pairs on a side stream (flush thread; read at later flushes)."""
        events = self._events
        for device in events.gates.ready():
            if device in self.devices:
                continue
            name = device_name(self._torch, device)
            cal = self.devices[device] = DeviceCalibration(device, name, measured_ns(GATED, name))
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
        """Held gated readings whose offset is known now: less it, with its bound."""
        now = time.monotonic()
        for cal in self.devices.values():
            if cal.offset_ns is None and now - cal.started > HOLD_S:
                cal.settle()  # some empty pairs never came back (a wait ran out): what was read, or the table's
        keep = []
        for item in self._held:
            ticket, device, ns, since = item
            kcal = ticket.kcal
            offset = kcal.offset_ns() if kcal is not None and kcal.stamps else None
            if offset is not None:
                ticket.bound = bound_ns(KERNEL, self.devices[device].name if device in self.devices else "") * 1e-9
            else:
                cal = self.devices.get(device)
                unknown = kcal is not None and kcal.stamps is not False and now - since < HOLD_S
                if cal is None or cal.offset_ns is None or unknown:
                    keep.append(item)
                    continue
                offset, ticket.bound = cal.offset_ns, cal.bound_s
            done.append((ticket, max(ns - offset, 0) * 1e-9))
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
        return self._stamp_bounds.get(id(table), 0.0)

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
                    name = device_name(self._torch, device)
                    table = self._tables[key] = StampTable(self._torch, device, eager=self._entries, graph=0,
                                                           frame=frame_ns(name, AUTO))
                    self._stamp_bounds[id(table)] = bound_ns(STAMP, name) * 1e-9
        return table


class _Sink:
    """Where ``GpuEvents.resolve`` hands its raw readings: calibration pairs, stamped calls (their arm's offset), or
    a call's reading (held until its offset is known)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def observe(self, slot: int, kind: Any, dt_ns: int, wall_ns: int) -> None:
        clock = self._clock
        if slot < 0:
            cal = clock._cal_slots.pop(slot, None)
            if cal is not None and str(kind) == "gated":
                cal.add(dt_ns)
            return
        got = clock._by_slot.pop(slot, None)
        if got is None:
            return
        ticket, device = got
        if str(kind) != "gated":  # a plain pair (no gate on this device): it times the host's launch too
            clock.dropped += 1
            clock._free_stamp(ticket)
            return
        stamp = ticket.stamp
        if stamp is not None:  # the kernel measured both ways: one sample of its arm's offset, not a timing
            s, e = stamp.table.read(stamp.index)
            clock._free_stamp(ticket)
            clock.calibrating += 1
            if s > 0 and e >= s and ticket.kcal is not None:
                ticket.kcal.add(dt_ns - (e - s + stamp.table.frame))
            return
        if len(clock._held) >= HELD_MAX:
            clock.dropped += 1
            return
        clock._held.append((ticket, device, dt_ns, time.monotonic()))


class _Health:
    """``GpuEvents``' drop and error reports, counted as readings lost (a calibration pair's too)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def drop(self, reason: str, n: int = 1) -> None:
        self._clock.dropped += n

    def error(self, stage: str) -> None:
        self._clock.dropped += 1
