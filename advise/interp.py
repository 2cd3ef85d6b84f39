"""Interpolation in log(rows) between timed points, with the alternatives that make up the band. Pure.

A curve holds, per timed row count, a low, middle and high time (a sweep's p20, median and
p80; a published figure has one value for all three). ``at(rows)`` answers a 2 x 3 array:

- axis 0, the interpolant between two timed points: ``loglog`` (log time linear in log rows, a
  power law through both points: the estimate) and ``linear`` (time linear in rows: what a
  fixed cost plus a per-row cost gives). Both pass through every timed point, so they agree
  there and part between points as far as the table leaves the curve open;
- axis 1, the spread: low, middle, high.

Outside the timed rows it answers None: a curve is never extrapolated.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

INTERPS = ("loglog", "linear")
SPREADS = ("low", "mid", "high")
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

    def at(self, rows: float) -> np.ndarray | None:
        """[interp][spread] at ``rows``; None outside the timed rows."""
        if not self.covers(rows):
            return None
        i = bisect_left(self.rows, rows * (1 - _EPS))
        if i < len(self.rows) and abs(self.rows[i] - rows) <= _EPS * rows:
            return np.array([self.values[i], self.values[i]], dtype=float)
        r0, r1 = self.rows[i - 1], self.rows[i]
        v0, v1 = np.array(self.values[i - 1]), np.array(self.values[i])
        u_log = (math.log(rows) - math.log(r0)) / (math.log(r1) - math.log(r0))
        u_lin = (rows - r0) / (r1 - r0)
        loglog = np.exp(np.log(v0) + (np.log(v1) - np.log(v0)) * u_log)
        linear = v0 + (v1 - v0) * u_lin
        return np.stack([loglog, linear])


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
