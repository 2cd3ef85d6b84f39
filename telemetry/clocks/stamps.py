"""Device stamps, telemetry's side: the tables the kernels write, handed out per sampled call and read at flush.

Each device gets one table (``dispatcher.kernels.stamps`` describes what the kernels write):
``(start, end)`` pairs in pinned, host-mapped memory, so the flush reads them with plain loads
(no copy, no event, no CUDA call at all: safe while another thread captures a graph), and an
int32 counter per entry in device memory. Entries below ``eager`` rotate among sampled eager
calls (zeroed when handed out, freed once read or given up on); the rest are held by captured
calls for their graph's lifetime, and each flush reads the latest replay of each. A sample is the stamped span
plus the device's kernel frame (``frame``): what the kernel's programs cannot stamp of its GPU time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dispatcher.kernels.stamps import DeviceStamp, Pointer

from ..aggregates import Health
from .frame import AUTO, device_name, frame_ns
from ..slots import Clock
from .timing import LatencySink

EAGER_ENTRIES = 1024
GRAPH_ENTRIES = 4096
GIVE_UP_S = 30.0  # an eager stamp not written by then is dropped (its launch died, or never ran a stamping kernel)
MAX_PLAUSIBLE_NS = 60 * 10**9


class TableStamp(DeviceStamp):
    """A DeviceStamp that knows its table."""

    __slots__ = ("table",)

    def __init__(self, table: StampTable, index: int) -> None:
        super().__init__(table.pointer, table.counts, index)
        self.table = table


class StampTable:
    """One device's table: host-readable ``times`` [n, 2] int64 and device ``counts`` [n] int32."""

    def __init__(self, torch_mod: Any, device: Any, *, eager: int, graph: int, frame: int = 0) -> None:
        n = eager + graph
        self.frame = frame  # ns added to every span read from this table
        pinned = getattr(device, "type", "cuda") != "cpu"
        self.times = torch_mod.zeros((n, 2), dtype=torch_mod.int64, pin_memory=pinned)
        self.host = self.times.numpy()
        self.counts = torch_mod.zeros(n, dtype=torch_mod.int32, device=device)
        self.pointer = Pointer(self.times.data_ptr(), torch_mod.int64)
        self.eager = eager
        self.next = 0
        self.busy = [False] * eager
        self.free_graph = list(range(n - 1, eager - 1, -1))

    def claim(self) -> TableStamp | None:
        """The next eager entry, zeroed; None when it is still in use (too many calls in flight)."""
        i = self.next
        if self.busy[i]:
            return None
        self.busy[i] = True
        self.next = i + 1 if i + 1 < self.eager else 0
        self.host[i, 0] = 0
        self.host[i, 1] = 0
        return TableStamp(self, i)

    def claim_held(self) -> TableStamp | None:
        """An entry for a captured call, held until its graph goes; None when none is free."""
        if not self.free_graph:
            return None
        i = self.free_graph.pop()
        self.host[i, 0] = 0
        self.host[i, 1] = 0
        return TableStamp(self, i)

    def free(self, index: int) -> None:
        if index < self.eager:
            self.busy[index] = False
        else:
            self.free_graph.append(index)

    def read(self, index: int) -> tuple[int, int]:
        """(start, end) as seen now; a pair torn by a concurrent write shows as end < start or a changed end."""
        end = int(self.host[index, 1])
        start = int(self.host[index, 0])
        if int(self.host[index, 1]) != end:
            return 0, 0
        return start, end


class DeviceStamps:
    """Hands out stamp entries per device and turns written ones into ``Clock.DEVICE`` samples at flush."""

    def __init__(self, torch_mod: Any, health: Health, *, eager: int = EAGER_ENTRIES, graph: int = GRAPH_ENTRIES,
                 frame: int = AUTO) -> None:
        self._torch = torch_mod
        self._frame = frame  # TelemetryConfig.device_frame_ns
        self._health = health
        self._sizes = (eager, graph)
        self._tables: dict[str, StampTable] = {}
        self._pending: list[tuple[StampTable, int, int, int, float]] = []  # (table, index, slot, wall_ns, t_claim)
        self._held: dict[tuple[int, int], list] = {}  # (id(table), index) -> [table, index, slot, last_end]
        self._lock = threading.Lock()

    def table(self, device: Any, *, create: bool) -> StampTable | None:
        key = str(device)
        table = self._tables.get(key)
        if table is None and create:
            with self._lock:
                table = self._tables.get(key)
                if table is None:
                    frame = frame_ns(device_name(self._torch, device), self._frame)
                    table = self._tables[key] = StampTable(self._torch, device, eager=self._sizes[0],
                                                           graph=self._sizes[1], frame=frame)
        return table

    def frames(self) -> dict[str, int]:
        """Each device's frame in use (ns), by device, for the devices stamped so far."""
        return {key: table.frame for key, table in list(self._tables.items())}

    def claim(self, device: Any) -> TableStamp | None:
        """An eager entry for a sampled call (the table is made on first use; never during a capture)."""
        table = self.table(device, create=True)
        with self._lock:
            stamp = table.claim()  # type: ignore[union-attr]
        if stamp is None:
            self._health.drop("timing_pool_empty")
        return stamp

    def claim_held(self, device: Any) -> TableStamp | None:
        """An entry for a call being captured; None if no table exists yet (none is made during a capture)."""
        table = self.table(device, create=False)
        if table is None:
            return None
        with self._lock:
            stamp = table.claim_held()
        if stamp is None:
            self._health.drop("timing_pool_empty")  # every graph entry is held: this call's replays go untimed
        return stamp

    def pending(self, stamp: TableStamp, slot: int, wall_ns: int) -> None:
        """An armed eager stamp: read it at a later flush."""
        with self._lock:
            self._pending.append((stamp.table, stamp.index, slot, wall_ns, time.monotonic()))

    def hold(self, stamp: TableStamp, slot: int) -> Any:
        """An armed captured stamp: read each flush until the returned release is called."""
        table = stamp.table
        key = (id(table), stamp.index)
        with self._lock:
            self._held[key] = [table, stamp.index, slot, 0]

        def release() -> None:
            with self._lock:
                if self._held.pop(key, None) is not None:
                    table.free(stamp.index)

        return release

    def release(self, stamp: TableStamp) -> None:
        """An entry handed out but not armed (the launch wrote no stamps)."""
        with self._lock:
            stamp.table.free(stamp.index)

    def resolve(self, sink: LatencySink, lock_timeout: float = -1) -> int:
        """Samples from every written stamp; eager entries are freed once read or given up on.

        ``lock_timeout``: seconds to wait for the lock (-1: as long as it takes); past it a TimeoutError,
        nothing taken (a signal handler's flush, whose interrupted thread may hold the lock)."""
        done = 0
        now = time.monotonic()
        if not self._lock.acquire(timeout=lock_timeout):
            raise TimeoutError("device stamps: lock held past the wait")
        try:
            pending, self._pending = self._pending, []
            held = list(self._held.values())
        finally:
            self._lock.release()
        keep = []
        for entry in pending:
            table, index, slot, wall_ns, t_claim = entry
            start, end = table.read(index)
            if start > 0 and end >= start:
                if end - start < MAX_PLAUSIBLE_NS:
                    sink.observe(slot, Clock.DEVICE, end - start + table.frame, wall_ns)
                    done += 1
                else:
                    self._health.drop("timing_unresolved")
                table.free(index)
            elif now - t_claim > GIVE_UP_S:
                self._health.drop("timing_unresolved")
                table.free(index)
            else:
                keep.append(entry)
        for held_entry in held:
            table, index, slot, last_end = held_entry
            start, end = table.read(index)
            if start > last_end and end >= start and end - start < MAX_PLAUSIBLE_NS:
                held_entry[3] = end
                sink.observe(slot, Clock.DEVICE, end - start + table.frame, time.time_ns())
                done += 1
        with self._lock:
            self._pending[:0] = keep
        return done
