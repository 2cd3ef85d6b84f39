"""Interpolation in log(rows) between timed points, with the alternatives that make up the band. Pure.

A curve holds, per timed row count, a low, middle and high time (a sweep's p20, median and
p80; a published figure has one value for all three). ``at(rows)`` answers a 2 x 3 array:

- axis 0, the interpolant between two timed points: ``loglog`` (log time linear in log rows, a
  power law through both points: the estimate) and ``linear`` (time linear in rows: what a
  fixed cost plus a per-row cost gives). Both pass through every timed point, so they agree
  there and part between points as far as the table leaves the curve open;
- axis 1, the spread: low, middle, high.

Between two timed rows more than ``MAX_STEP`` (2x) apart, the two interpolants say little: a kernel
can stay flat over most of such a gap (a fixed cost dominates) and rise only near its top, as the
H200's no-split prefill does from 16 to 128 rows, where a power law through 16 and 256 reads it up to
45% high. There two more rows of axis 0, ``flat`` and ``steep``, widen the band to every curve that
never falls with rows and never more than doubles when rows double: from ``max(t0, t1 * r / r1)``
(flat, then proportional to rows) to ``min(t1, t0 * r / r0)`` (proportional, then flat). Within a
step of 2x or less both repeat the power law, so the band is the two interpolants' alone. ``gap``
names the step a row count falls in when it is wider than that.

Outside the timed rows it answers None: a curve is never extrapolated.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

INTERPS = ("loglog", "linear", "flat", "steep")
SPREADS = ("low", "mid", "high")
MAX_STEP = 2.0  # timed rows further apart than this factor: the band holds every plausible curve between them
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Curve:
    """Times (or ratios) at increasing row counts; each point is (low, mid, high)."""

    rows: tuple[float, ...]
    values: tuple[tuple[float, float, float], ...]

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.values):
            raise ValueError("a curve needs one (low, mid, high) per row count, and at least one point")
        if any(b <= a for a, b in zip(self.rows, self.rows[1:])):
            raise ValueError(f"row counts must increase; got {self.rows}")
        for v in self.values:
            if not (0 < v[0] <= v[1] <= v[2]):
                raise ValueError(f"each point needs 0 < low <= mid <= high; got {v}")

    @property
    def first(self) -> float:
        return self.rows[0]

    @property
    def last(self) -> float:
        return self.rows[-1]

    def covers(self, rows: float) -> bool:
        return self.first * (1 - _EPS) <= rows <= self.last * (1 + _EPS)

    def gap(self, rows: float) -> tuple[float, float] | None:
        """The timed rows around ``rows`` when they are more than ``MAX_STEP`` apart; None otherwise."""
        if not self.covers(rows):
            return None
        i = bisect_left(self.rows, rows * (1 - _EPS))
        if i < len(self.rows) and abs(self.rows[i] - rows) <= _EPS * rows:
            return None
        r0, r1 = self.rows[i - 1], self.rows[i]
        return (r0, r1) if r1 > r0 * MAX_STEP * (1 + _EPS) else None

    def at(self, rows: float) -> np.ndarray | None:
        """[interp][spread] at ``rows``; None outside the timed rows."""
        if not self.covers(rows):
            return None
        i = bisect_left(self.rows, rows * (1 - _EPS))
        if i < len(self.rows) and abs(self.rows[i] - rows) <= _EPS * rows:
            return np.array([self.values[i]] * len(INTERPS), dtype=float)
        r0, r1 = self.rows[i - 1], self.rows[i]
        v0, v1 = np.array(self.values[i - 1]), np.array(self.values[i])
        u_log = (math.log(rows) - math.log(r0)) / (math.log(r1) - math.log(r0))
        u_lin = (rows - r0) / (r1 - r0)
        loglog = np.exp(np.log(v0) + (np.log(v1) - np.log(v0)) * u_log)
        linear = v0 + (v1 - v0) * u_lin
        if r1 <= r0 * MAX_STEP * (1 + _EPS):
            return np.stack([loglog, linear, loglog, loglog])
        rising = v1 >= v0
        flat = np.where(rising, np.maximum(v0, v1 * rows / r1), v1)
        steep = np.where(rising, np.minimum(v1, v0 * rows / r0), v0)
        return np.stack([loglog, linear, flat, steep])


def bucket_values(curve_at: Callable[[float], np.ndarray | None], lo: float, mean: float,
                  hi: float | None) -> np.ndarray | None:
    """[interp][spread][bucket] for calls of ``mean`` rows in a rows bucket [lo, hi].

    bucket 0 prices every call at the mean rows; bucket 1 puts the calls at the bucket's two
    edges with the same mean (the chord). For a curve convex or concave across the bucket the
    true per-call mean lies between the two. Without both edges inside the table (an open
    ``16384+`` bucket, an edge past the last timed row), bucket 1 repeats bucket 0.
    """
    mid = curve_at(mean)
    if mid is None:
        return None
    chord = mid
    if hi is not None and hi > lo:
        a, b = curve_at(lo), curve_at(hi)
        if a is not None and b is not None:
            w = (mean - lo) / (hi - lo)
            chord = a * (1 - w) + b * w
    return np.stack([mid, chord], axis=-1)
