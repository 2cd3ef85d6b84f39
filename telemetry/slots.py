"""Slots: one per (decision, fine rows bucket, model); what each holds, and how a slot table encodes them.

A *slot table* belongs to one decision object and maps ``fine bucket * n_models + model`` to a
slot. Its values are small ints the hot path reads without a branch on the common case:

- ``NO_SLOT`` (-1): no slot yet; the rare path makes one.
- ``warming(s)`` (-2 and below): slot ``s`` in its first calls (all timed) or with a kernel whose
  calls are counted at ``stop`` (OPUS, which may decline at launch); the rare path serves it.
- ``s`` (0 and above): slot ``s``, served by the hot path.

``SlotCounters`` holds the per-slot integers; the hot path, graph replays and timing add to
them, and ``view.build_totals`` reads them. Lists of ints, not arrays: a CPython list index and
add is the cheapest mutable counter there is.
"""

from __future__ import annotations

import threading
from enum import Enum
from typing import NamedTuple

from dispatcher.types import CallShape, Decision

from .buckets import N_LATENCY_BUCKETS
from .native import NativeCounts

NO_SLOT = -1


def warming(slot: int) -> int:
    """The table value of a slot the rare path still serves."""
    return -(slot + 2)


def slot_of_value(value: int) -> int:
    """The slot a table value stands for (``NO_SLOT`` stays ``NO_SLOT``)."""
    return -value - 2 if value < NO_SLOT else value


class Clock(str, Enum):
    """What a latency sample measured; a histogram series never mixes two."""

    DEVICE = "device"  # %globaltimer stamps written by the call's own kernels: first program in to last out
    EVENTS = "events"  # a CUDA/HIP event pair around the launch (includes launch gaps when the GPU waits)
    GATED = "gated"  # an event pair behind a stream gate that holds the launch until queued (telemetry.clocks.gate)
    GRAPH = "graph"  # an external event pair captured into a CUDA graph around the call, read for its latest replay
    BRACKET = "bracket"  # two stamp kernels captured into a CUDA/HIP graph around the call, less a calibrated constant
    HOST = "host"  # perf_counter around the call (CPU tensors: the work is on the host)

    def __str__(self) -> str:
        return self.value


class SlotInfo(NamedTuple):
    """Labels and flags of one slot, fixed when the slot is made."""

    kernel: str
    reason: str
    call_class: str
    fine: int
    bucket: str
    model: str
    refused: bool
    rerouted_from: str | None
    decode_in_prefill: bool
    would: tuple[str, ...]  # kernel per counterfactual policy, in config order
    would_dip: tuple[bool, ...]  # per counterfactual policy: its kernel would run these decode rows with no split-K
    decision: Decision
    shape: CallShape  # one call of the slot: its row-free part is shared by all the slot's calls

    @property
    def traffic_key(self) -> tuple[str, ...]:
        """(topk, layout, q_dtype, kv_dtype, kv_pool_bytes): the row-free facts a latency table is indexed by; the
        pool's power-of-two bucket of bytes, "" where the shape does not know it."""
        s = self.shape
        pool = s.kv_pool_bytes
        return (str(s.topk), f"{s.nope_head_dim}+{s.rope_head_dim}", s.q_dtype, s.kv_dtype, str(pool) if pool else "")


class SlotCounters:
    """Per-slot counts, preallocated to ``size``; every list is indexed by slot."""

    __slots__ = ("calls", "rows", "decode_rows", "captured", "replayed", "replayed_untimed", "latency", "latency_sum_ns",
                 "latency_native", "latency_clock", "other_clock", "other_clock_native", "impl", "impl_extra", "_lock")

    def __init__(self, size: int) -> None:
        self.calls = [0] * size
        self.rows = [0] * size
        self.decode_rows = [0] * size
        self.captured = [0] * size  # calls seen while a CUDA graph was being captured
        self.replayed = [0] * size  # of ``calls``: those counted from graph replays
        self.replayed_untimed = [0] * size  # of ``replayed``: calls whose replays no device stamp times
        self.latency: list[list[int] | None] = [None] * size  # histogram bucket counts, made with the slot
        self.latency_sum_ns = [0] * size
        self.latency_native: list[NativeCounts | None] = [None] * size  # the same samples in native buckets
        self.latency_clock: list[Clock | None] = [None] * size  # the clock of ``latency``: set by its first sample
        self.other_clock: dict[tuple[int, Clock], tuple[list[int], list[int]]] = {}  # (slot, clock) -> (counts, [sum])
        self.other_clock_native: dict[tuple[int, Clock], NativeCounts] = {}
        self.impl: list[str | None] = [None] * size  # the implementation the slot's first call ran
        self.impl_extra: dict[tuple[int, str], int] = {}  # (slot, impl) -> calls that ran another implementation
        self._lock = threading.Lock()

    def open(self, slot: int) -> None:
        """Give a new slot its histogram."""
        self.latency[slot] = [0] * N_LATENCY_BUCKETS
        self.latency_native[slot] = NativeCounts()

    def note_impl(self, slot: int, impl: str) -> None:
        """The first implementation seen for a slot becomes its own; calls on others are counted beside it."""
        current = self.impl[slot]
        if current is None:
            self.impl[slot] = impl
        elif current != impl:
            with self._lock:
                key = (slot, impl)
                self.impl_extra[key] = self.impl_extra.get(key, 0) + 1

    def unnote_impl(self, slot: int, impl: str) -> None:
        """Take back one ``note_impl(slot, impl)`` (an announced implementation that did not run)."""
        if self.impl[slot] != impl:
            with self._lock:
                key = (slot, impl)
                left = self.impl_extra.get(key, 0) - 1
                if left > 0:
                    self.impl_extra[key] = left
                else:
                    self.impl_extra.pop(key, None)
