"""Per-call device timestamps: where a call's own kernels write when its first program started and its last ended.

An observer (telemetry) that wants a call timed on the GPU's clock hands the launch a
``DeviceStamp``: entry ``index`` of a table of ``(start, end)`` int64 pairs (nanoseconds of the
GPU's ``%globaltimer``) that the host can read without a synchronisation, plus entry ``index`` of
an int32 counter array in device memory. The call's first kernel writes ``start`` from its
program 0; every program of its last kernel adds one to the counter when it is done, and the
program that brings it to the grid size writes ``end`` and resets the counter to zero. Between
them lies exactly what a profiler calls the call's kernel time: first kernel start to last
kernel end, launch gaps between its own kernels included, the host's time excluded.

A launch that wrote both stamps sets ``armed``; one that did not (torch, AITER, a kernel
without stamps) leaves it False and the observer falls back to another clock. Stamps cost
nothing when absent: kernels take ``stamp_at = -1`` and skip both writes.
"""

from __future__ import annotations

from typing import Any

import torch


class Pointer:
    """A raw address Triton passes to a kernel as a typed pointer (host-mapped memory is not a device tensor)."""

    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype) -> None:
        self.address = address
        self.dtype = dtype

    def data_ptr(self) -> int:
        return self.address


class DeviceStamp:
    """One call's entry in a stamp table: ``times`` [N, 2] int64 (host-readable), ``counts`` [N] int32 (device)."""

    __slots__ = ("times", "counts", "index", "armed")

    def __init__(self, times: Any, counts: Any, index: int) -> None:
        self.times = times  # anything with data_ptr() and dtype int64
        self.counts = counts  # a device tensor (or Pointer) of int32, zero between calls
        self.index = index
        self.armed = False


_NO_STAMP: dict[Any, tuple[Any, Any]] = {}


def no_stamp(device: torch.device) -> tuple[Any, Any]:
    """Typed placeholders for the stamp pointers of an unstamped launch (never dereferenced: ``stamp_at`` is -1).

    Always int64/int32 pointers, so a stamped and an unstamped launch share one compiled kernel.
    """
    key = (device.type, device.index)
    hit = _NO_STAMP.get(key)
    if hit is None:
        scratch = torch.empty(4, dtype=torch.int64, device=device)  # no kernel launch: safe inside a capture
        hit = _NO_STAMP[key] = (scratch, scratch.view(torch.int32))
    return hit


def stamp_args(stamp: DeviceStamp | None, device: torch.device) -> tuple[Any, Any, int]:
    """(times, counts, stamp_at) for a kernel launch; ``stamp_at`` is -1 when the call is not stamped."""
    if stamp is None:
        times, counts = no_stamp(device)
        return times, counts, -1
    return stamp.times, stamp.counts, stamp.index
