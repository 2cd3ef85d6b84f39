"""The bracket clock: graph replays of kernels that write no stamps, timed by two stamp kernels captured around them.

A call captured into a CUDA or HIP graph runs no Python at replay, so only nodes of the graph can time it. Here the
nodes are two one-program Triton kernels on the call's stream: the first stores the GPU's clock as its last act,
just before the call's kernels; the second stores it as its first act, just after them. Each replay writes the pair
into pinned, host-mapped memory, and each flush reads the latest finished replay's pair with plain host loads (an
end older than its start is a replay in flight: the next flush reads it). No sync anywhere.

The span holds the call's kernels plus a constant of the GPU (the first stamp's tail, the second's head and the
launch gaps between): an empty bracket reads just that constant. So each device is calibrated once, without a
profiler: after its first capture the flush thread captures a graph of ``CALIBRATION_BRACKETS`` empty brackets on
a side stream, replays it, and keeps the median span (``routescope_clock_constant_seconds{clock="bracket"}``).
Readings wait until then; none is taken before the constant is known.

The clock each stamp reads:
- NVIDIA: ``%globaltimer`` (PTX ``mov.u64 %rd, %globaltimer;``), nanoseconds, 32 ns steps on an H200;
- AMD gfx942/gfx950: ``s_memrealtime`` (SMEM: the 64-bit real-time counter at a constant rate whatever the shader
  clock, typically 100 MHz), then ``s_waitcnt lgkmcnt(0)`` before its SGPR pair is read: ``NS_PER_TICK`` 10,
  converted on the host. The rate is a property of the card, so before calibrating, the flush thread checks it: two
  stamps a second or more apart against the host's monotonic clock; a rate more than ``RATE_TOLERANCE`` off 100 MHz
  is used as measured (and logged).

Inside a replay a bracket costs what two more kernel nodes on the call's stream cost (two empty kernels cost nearly
as much as the stamps). On CUDA from sm_90 the stamps are launched with programmatic dependent launch (PDL), so each
is resident and waiting while the kernel before it drains: the first waits (``griddepcontrol.wait``) for the kernel
before it to finish, then stamps; the second stamps as it starts, when the call's last program has exited, then waits
for the call to finish. Each stamp ends only after the kernel before it has, so what follows a bracket sees every
write of what preceded it, as without one. HIP has no PDL: plain launches there, and before sm_90.

HIP refuses external events in a capture but takes kernels, so on ROCm this is the only graph clock. The stamp kernels
are compiled, loaded and launched once on a side stream before a capture begins (``before_capture``, from the graph
hooks), never inside it: inside a capture only their compiled handles are launched. A launch that raises leaves the
call untimed and counts the error; the capture itself never sees telemetry fail.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from ..aggregates import Health
from ..slots import Clock
from .timing import LatencySink

log = logging.getLogger("routescope.telemetry")

GLOBALTIMER, MEMREALTIME = 1, 2  # the stamp kernel's CLOCK
PTX_GLOBALTIMER = "mov.u64 $0, %globaltimer;"  # PTX ISA, special register %globaltimer (u64, ns)
AMDGCN_MEMREALTIME = "s_memrealtime $0\n\ts_waitcnt lgkmcnt(0)"  # CDNA3/CDNA4 ISA: SMEM real-time counter
NS_PER_TICK = {GLOBALTIMER: 1, MEMREALTIME: 10}  # %globaltimer counts ns; s_memrealtime ticks at 100 MHz
CALIBRATION_BRACKETS = 32  # empty brackets in the calibration graph: their median span is the constant
CALIBRATION_REPLAYS = 3
RATE_ROW = CALIBRATION_BRACKETS  # the table row the tick-rate check stamps
RATE_INTERVAL_NS = 1_000_000_000  # its two stamps at least this far apart: launch jitter is then well under 1%
RATE_TOLERANCE = 0.05
MAX_PLAUSIBLE_NS = 10_000_000_000  # a span past 10 s is a torn or stale read, never a call
NO_WAIT, WAIT_BEFORE, WAIT_AFTER = 0, 1, 2  # the stamp kernel's WAIT: where griddepcontrol.wait goes under PDL

# (table's times tensor, offset into it, raw stream handle) -> None: enqueue one stamp on that stream
StampLauncher = Callable[[Any, int, int], None]


def clock_for(torch_mod: Any) -> int:
    """``MEMREALTIME`` under a torch built for HIP (``torch.version.hip``), else ``GLOBALTIMER``."""
    return MEMREALTIME if getattr(getattr(torch_mod, "version", None), "hip", None) else GLOBALTIMER


class Entry:
    """One bracket: row ``index`` of a device's table, held by a captured call until its graph goes."""

    __slots__ = ("table", "index")

    def __init__(self, table: BracketTable, index: int) -> None:
        self.table = table
        self.index = index


class BracketTable:
    """One device's pinned ``times`` [n, 2] int64 (ticks, host-readable), its stamp launcher and its constant."""

    def __init__(self, torch_mod: Any, device: str, size: int, launch: StampLauncher, clock: int) -> None:
        self.device = device
        first = RATE_ROW + 1
        self.times = torch_mod.zeros((first + size, 2), dtype=torch_mod.int64, pin_memory=True)
        self.host = self.times.numpy()
        self.launch = launch
        self.ns_per_tick: float = NS_PER_TICK[clock]
        self.rate_checked = clock != MEMREALTIME  # %globaltimer counts ns by definition
        self.rate_probe: list | None = None  # [host ns at the first stamp, host ns at the second or None]
        self.side: Any = None  # the side stream of the warm launch and the rate check
        self.free = list(range(first + size - 1, first - 1, -1))
        self.constant_ns: int | None = None  # calibrated; None until then
        self.calibrating: Any = None  # the calibration graph, while its replays are read

    def stamp(self, index: int, side: int, stream_handle: int) -> None:
        self.launch(self.times, 2 * index + side, stream_handle)

    def span_ns(self, index: int) -> tuple[int, int]:
        """(start, end) in ns as seen now; (0, 0) when a concurrent write tore the read."""
        end = int(self.host[index, 1])
        start = int(self.host[index, 0])
        if int(self.host[index, 1]) != end:
            return 0, 0
        return round(start * self.ns_per_tick), round(end * self.ns_per_tick)


class GraphBrackets:
    """Hands out brackets to captured calls, reads the held ones at flush, calibrates each device once."""

    def __init__(self, torch_mod: Any, health: Health, size: int, *,
                 launcher: Callable[[Any, Any, int], StampLauncher] | None = None,
                 host_ns: Callable[[], int] = time.monotonic_ns, rate_interval_ns: int = RATE_INTERVAL_NS) -> None:
        self.torch = torch_mod
        self._host_ns, self._rate_interval_ns = host_ns, rate_interval_ns
        self._health = health
        self._size = size
        self._launcher = launcher or triton_stamp_launcher
        self._clock = clock_for(torch_mod)
        self._tables: dict[str, BracketTable | None] = {}  # device -> table; None: it failed to build (not retried)
        self._wanted: set[str] = set()
        self._held: dict[tuple[int, int], list] = {}  # (id(table), index) -> [table, index, slot, last end]
        self._lock = threading.Lock()

    # -- outside any capture ------------------------------------------------------------------
    def before_capture(self) -> None:
        """A capture is about to begin on the current device: build its table and warm the stamp kernel first."""
        cuda = self.torch.cuda
        device = f"cuda:{cuda.current_device()}"
        if device not in self._tables:
            self.prepare(device)

    def prepare(self, device: str | None = None) -> int:
        """Build the tables asked for (``device``, else those captured calls wanted); never inside a capture."""
        built = 0
        for dev in ([device] if device is not None else list(self._wanted)):
            self._wanted.discard(dev)
            if dev in self._tables:
                continue
            try:
                table = BracketTable(self.torch, dev, self._size, self._launcher(self.torch, dev, self._clock),
                                     self._clock)
                cuda = self.torch.cuda
                side = table.side = cuda.Stream(dev)
                with cuda.device(dev), cuda.stream(side):  # the JIT's first launch takes both from torch
                    table.stamp(0, 0, side.cuda_stream)  # the first stamp's kernel and the second's
                    table.stamp(0, 1, side.cuda_stream)
            except Exception:  # noqa: BLE001 - no bracket on this device: its graph replays take the next clock
                log.warning("routescope telemetry: no graph stamp bracket on %s", dev, exc_info=True)
                self._tables[dev] = None
                continue
            self._tables[dev] = table
            built += 1
        return built

    def calibrate(self) -> int:
        """From the flush thread, no capture under way: start each new device's calibration, or read it when its
        replays have written every empty bracket. Returns how many devices got their constant."""
        done = 0
        for table in list(self._tables.values()):
            if table is None or table.constant_ns is not None:
                continue
            if not table.rate_checked and not self._check_rate(table):
                continue
            if table.calibrating is None:
                table.calibrating = self._calibration_graph(table)
                continue
            spans = []
            for i in range(CALIBRATION_BRACKETS):
                start, end = table.span_ns(i)
                if start <= 0 or end < start:
                    break
                spans.append(end - start)
            else:
                table.constant_ns = round(statistics.median(spans))
                table.calibrating = None
                done += 1
        return done

    def _check_rate(self, table: BracketTable) -> bool:
        """The tick-rate check, as far as it goes now: the first stamp, the second once ``rate_interval_ns`` has
        passed, then the rate from both against the host's clock (the error is a launch's delay to the GPU: µs in a
        second). True once the rate is known."""
        row = table.host[RATE_ROW]
        if table.rate_probe is None:
            row[:] = 0
            self._side_stamp(table, 0)
            table.rate_probe = [self._host_ns(), None]
        probe = table.rate_probe
        if probe[1] is None:
            if int(row[0]) <= 0 or self._host_ns() - probe[0] < self._rate_interval_ns:
                return False
            self._side_stamp(table, 1)
            probe[1] = self._host_ns()
        ticks = int(row[1]) - int(row[0])
        if int(row[1]) <= 0 or ticks <= 0:
            return False  # the second stamp has not run yet
        measured = (probe[1] - probe[0]) / ticks
        nominal = NS_PER_TICK[MEMREALTIME]
        if abs(measured / nominal - 1) > RATE_TOLERANCE:
            log.warning("routescope telemetry: s_memrealtime on %s ticks every %.2f ns, not %d ns: using that",
                        table.device, measured, nominal)
            table.ns_per_tick = measured
        table.rate_checked = True
        return True

    def _side_stamp(self, table: BracketTable, side: int) -> None:
        cuda = self.torch.cuda
        with cuda.device(table.device), cuda.stream(table.side):
            table.stamp(RATE_ROW, side, table.side.cuda_stream)

    def _calibration_graph(self, table: BracketTable) -> Any:
        """Capture ``CALIBRATION_BRACKETS`` empty brackets on a side stream (this thread's capture only), replay it."""
        cuda = self.torch.cuda
        table.host[:CALIBRATION_BRACKETS] = 0
        side = cuda.Stream(table.device)
        graph = cuda.graphs.CUDAGraph()
        with cuda.device(table.device), cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                for i in range(CALIBRATION_BRACKETS):
                    table.stamp(i, 0, side.cuda_stream)
                    table.stamp(i, 1, side.cuda_stream)
            finally:
                graph.capture_end()
            for _ in range(CALIBRATION_REPLAYS):
                graph.replay()
        return graph

    # -- the capture path (sampled captured calls only) ---------------------------------------
    def serves(self, device: Any) -> bool:
        """False where the bracket failed to build on ``device`` (its calls take the next graph clock)."""
        return self._tables.get(str(device), False) is not None

    def open(self, device: Any, stream: Any) -> Entry | None:
        """Claim a bracket and capture its first stamp on ``stream``; None (counted) when none can be had."""
        table = self._tables.get(str(device))
        if table is None:
            self._wanted.add(str(device))  # captured before its device was prepared: built at the next flush
            self._health.drop("timing_clock_pending")
            return None
        with self._lock:
            index = table.free.pop() if table.free else None
        if index is None:
            self._health.drop("timing_pool_empty")
            return None
        try:
            table.stamp(index, 0, _handle(self.torch, stream, device))
        except BaseException:
            self.give_back(Entry(table, index))
            raise
        return Entry(table, index)

    def close(self, entry: Entry, stream: Any) -> None:
        """Capture the bracket's second stamp, after the call's kernels."""
        entry.table.stamp(entry.index, 1, _handle(self.torch, stream, entry.table.device))

    def hold(self, entry: Entry, slot: int) -> Callable[[], None]:
        """Read the bracket at each flush while its graph lives; returns the release to run when the graph goes."""
        table, index = entry.table, entry.index
        key = (id(table), index)
        table.host[index] = 0
        with self._lock:
            self._held[key] = [table, index, slot, 0]

        def release() -> None:
            with self._lock:
                if self._held.pop(key, None) is not None:
                    table.free.append(index)

        return release

    def give_back(self, entry: Entry) -> None:
        """A bracket whose stamps will never be read (the call stamped itself, raised, or its graph went)."""
        with self._lock:
            entry.table.free.append(entry.index)

    # -- flush ----------------------------------------------------------------------------------
    def resolve(self, sink: LatencySink, wall_ns: int) -> int:
        """One sample per held bracket whose latest replay is newer than the last read, on calibrated devices."""
        done = 0
        with self._lock:
            held = list(self._held.values())
        for entry in held:
            table, index, slot, last_end = entry
            constant = table.constant_ns
            if constant is None:
                continue
            start, end = table.span_ns(index)
            if start > last_end and end >= start and end - start < MAX_PLAUSIBLE_NS:
                entry[3] = end
                sink.observe(slot, Clock.BRACKET, end - start - constant, wall_ns)
                done += 1
        return done

    def constants(self) -> dict[str, int]:
        """Each calibrated device's constant (ns taken off a bracket's span)."""
        return {dev: t.constant_ns for dev, t in list(self._tables.items())
                if t is not None and t.constant_ns is not None}

    @property
    def pending(self) -> bool:
        """Is there work for the flush thread (a table to build, a device to calibrate)?"""
        return bool(self._wanted) or any(t is not None and t.constant_ns is None for t in list(self._tables.values()))


def _handle(torch_mod: Any, stream: Any, device: Any) -> int:
    """The raw handle of ``stream`` (the device's current stream when None): what the compiled launcher takes."""
    if stream is None:
        stream = torch_mod.cuda.current_stream(device)
    return getattr(stream, "cuda_stream", 0)


def triton_stamp_launcher(torch_mod: Any, device: Any, clock: int) -> StampLauncher:
    """The Triton stamp kernel for ``clock``, launched through its compiled handle after the first launch: the
    first stamp of a bracket (an even offset) and the second (odd) are each their own compiled kernel, with PDL
    where ``pdl_capable`` says so."""
    import triton
    import triton.language as tl

    from dispatcher.kernels.launcher import launch
    from dispatcher.kernels.stamps import Pointer

    kernel = stamp_kernel(triton, tl)
    pdl = pdl_capable(torch_mod, device, clock)
    pointers: dict[int, Any] = {}
    keys = tuple(("bracket", str(device), clock, side) for side in (0, 1))
    consts = tuple({"CLOCK": clock, "WAIT": (WAIT_BEFORE, WAIT_AFTER)[side] if pdl else NO_WAIT, "num_warps": 1,
                    **({"launch_pdl": True} if pdl else {})} for side in (0, 1))

    def launch_stamp(times: Any, offset: int, stream_handle: int) -> None:
        typed = pointers.get(id(times))
        if typed is None:
            typed = pointers[id(times)] = Pointer(times.data_ptr(), torch_mod.int64)
        side = offset & 1
        launch(kernel, keys[side], (1,), (typed, offset), consts[side], stream_handle)

    return launch_stamp


def pdl_capable(torch_mod: Any, device: Any, clock: int) -> bool:
    """PDL for the stamps: CUDA on compute capability 9.0 or later (``griddepcontrol`` is sm_90's), never HIP."""
    if clock != GLOBALTIMER:
        return False
    try:
        return torch_mod.cuda.get_device_capability(device)[0] >= 9
    except Exception:  # noqa: BLE001 - no capability to read: plain launches, as before sm_90
        return False


_KERNEL: Any = None


def stamp_kernel(triton: Any, tl: Any) -> Any:
    """``times[offset] = clock()``: one program of one warp, one read of the clock, one store (the offset is not
    specialised); ``WAIT`` places sm_90's ``griddepcontrol.wait`` (``WAIT_BEFORE`` / ``WAIT_AFTER``)."""
    global _KERNEL
    if _KERNEL is None:

        @triton.jit(do_not_specialize=["offset"])
        def graph_stamp(times, offset, CLOCK: tl.constexpr, WAIT: tl.constexpr = 0):
            if CLOCK == 1:  # the strings are PTX_GLOBALTIMER and AMDGCN_MEMREALTIME (a kernel reads no globals)
                if WAIT == 1:  # launched early by PDL: the kernel before it has not finished until this returns
                    tl.extra.cuda.gdc_wait()
                t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                              pack=1)
                tl.store(times + offset, t)
                if WAIT == 2:  # stamped as it started; it ends only once the kernel before it has
                    tl.extra.cuda.gdc_wait()
            else:
                t = tl.inline_asm_elementwise("s_memrealtime $0\n\ts_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                              is_pure=False, pack=1)
                tl.store(times + offset, t)

        _KERNEL = graph_stamp
    return _KERNEL
