"""The experiment clock's calibration and its residual bounds: what a gated pair reads beyond the kernels, measured
on the device without a profiler, and the most what is left may be.

A gated pair (``telemetry.clocks.gate``) reads the kernels plus a constant of the GPU: the step from the start event
into the first kernel and from the last kernel out to the end event. Two calibrations take it out:

- **per kernel, in place** (``KernelCalibration``): the project's own kernels write device stamps, so a few of each
  cell's gated calls per arm (its first ``KERNEL_CAL_FIRST``, then one in ``KERNEL_CAL_EVERY``) also carry one.
  Such a call is the kernel measured both ways in the traffic's own regime: the pair's raw reading less the stamped
  span and the device's kernel frame (``telemetry.clocks.frame``) is one sample of the pair's offset. The arm's
  offset is their mean. Those calls are not timing samples (writing the stamp slows the kernel); the others are
  timed unstamped and less that offset.
- **per device** (``DeviceCalibration``), for kernels that write no stamp (AITER's, vLLM's): ``CALIBRATION_PAIRS``
  empty gated pairs on a side stream when the device's gate is built (the flush thread, as the graph clock's
  empty-bracket calibration), their tenth percentile (the empty pair's floor: pairs that meet traffic on the
  device read more), plus the kernel step of the device model (``KERNEL_STEP_NS``: what a pair around a one-element
  kernel reads beyond an empty pair and that kernel's CUPTI time).

The bound of each clock (``BOUND_NS``, per device model) is what the calibrated reading of one kernel may still lie
off its CUPTI time, as measured on the H200 (docs/experiments.md, "The clock": the figures, their commit and
command); a model not measured gets ``DEFAULT_BOUND_NS``, twice the H200's, a guess stated as one.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

HOST, KERNEL, DEVICE, STAMP = "host", "gated_kernel", "gated_device", "stamp"
BOUND_NS: dict[str, dict[str, int]] = {
    HOST: {},  # on the CPU the host clock is the ground truth itself
    KERNEL: {"NVIDIA H200": 500},
    DEVICE: {"NVIDIA H200": 1500},
    STAMP: {"NVIDIA H200": 2000},
}
DEFAULT_BOUND_NS = {HOST: 0, KERNEL: 1000, DEVICE: 3000, STAMP: 4000}
KERNEL_STEP_NS: dict[str, int] = {"NVIDIA H200": 1089}

CALIBRATION_PAIRS = 64
CALIBRATION_MIN = 8  # empty pairs read before the give-up time for the device's calibration to count
KERNEL_CAL_FIRST = 2  # a cell arm's first calls all calibrate
KERNEL_CAL_EVERY = 8  # then one in this many
KERNEL_CAL_MIN = 2  # samples before a cell arm's offset is used
KERNEL_CAL_KEEP = 1024  # samples kept per cell arm (the latest)
OUTLIER_NS = 5000  # a stamped call's offset this far from the median is a preempted read, left out
GIVE_UP_S = 5.0  # a reading held this long for a calibration takes the device's


def bound_ns(clock: str, name: str) -> int:
    """The residual bound of ``clock`` on a device model named ``name``."""
    return BOUND_NS[clock].get(name, DEFAULT_BOUND_NS[clock])


class DeviceCalibration:
    """One device's gated offset from empty gated pairs: their tenth percentile plus the model's kernel step."""

    def __init__(self, device: Any, name: str, fallback_ns: int) -> None:
        self.device = device
        self.name = name
        self.readings: list[int] = []
        self.offset_ns: int | None = None
        self.fallback_ns = fallback_ns  # the frame table's gated constant, where no empty pair comes back
        self.bound_s = bound_ns(DEVICE, name) * 1e-9
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
            self.offset_ns = floor_ns(self.readings) + KERNEL_STEP_NS.get(self.name, 0)
        else:
            self.offset_ns = self.fallback_ns

    def summary(self) -> dict:
        r = sorted(self.readings)
        return {"offset_ns": self.offset_ns, "pairs": len(r), "bound_ns": round(self.bound_s * 1e9),
                "empty_p10_ns": floor_ns(r) if r else None, "empty_median_ns": r[len(r) // 2] if r else None,
                "kernel_step_ns": KERNEL_STEP_NS.get(self.name, 0)}


def floor_ns(readings: list[int]) -> int:
    """The tenth percentile of the readings: what an empty pair reads when nothing else meets it."""
    r = sorted(readings)
    return int(r[len(r) // 10])


class KernelCalibration:
    """One cell arm's gated offset from its stamped calls: raw pair reading less the stamp's span and frame."""

    __slots__ = ("calls", "stamps", "misses", "samples", "added", "_offset", "_at")

    def __init__(self) -> None:
        self.calls = 0
        self.stamps: bool | None = None  # do this arm's kernels write a stamp? (learnt from its stamped calls)
        self.misses = 0
        self.samples: list[int] = []
        self.added = 0
        self._offset: int | None = None
        self._at = -1

    def wants_stamp(self) -> bool:
        """Count a timed call; should it carry a stamp? (the call path: two compares)"""
        self.calls = n = self.calls + 1
        return self.stamps is not False and (n <= KERNEL_CAL_FIRST or n % KERNEL_CAL_EVERY == 0)

    def saw(self, armed: bool) -> None:
        """A stamped call's launch returned: did its kernels write the stamp? Two misses and no hit: they write none
        (one miss may be telemetry's own stamp taking the call's place)."""
        if armed:
            self.stamps = True
        else:
            self.misses += 1
            if self.misses >= 2 and self.stamps is None:
                self.stamps = False

    def add(self, ns: int) -> None:
        self.samples.append(ns)
        self.added += 1
        if len(self.samples) > KERNEL_CAL_KEEP:
            del self.samples[: len(self.samples) - KERNEL_CAL_KEEP]

    def offset_ns(self) -> int | None:
        """The mean of the samples (those within ``OUTLIER_NS`` of their median), once there are
        ``KERNEL_CAL_MIN``; None before. The mean, not the median: what is taken off each reading must be the mean
        offset for the arm's mean to be right, and the offset is skewed (a pair sometimes waits longer)."""
        if len(self.samples) < KERNEL_CAL_MIN:
            return None
        if self._at != self.added:
            mid = statistics.median(self.samples)
            kept = [v for v in self.samples if abs(v - mid) <= OUTLIER_NS]
            self._offset, self._at = round(statistics.fmean(kept)), self.added
        return self._offset
