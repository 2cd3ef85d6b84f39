"""Rows buckets and latency buckets: every edge decided once, so the hot path only indexes a list."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

POW2_TOP = 16384  # last power-of-two edge: `16384+` (docs/metrics.md, "Label values")


def _label(lo: int, nxt: int | None) -> str:
    if nxt is None:
        return f"{lo}+"
    return str(lo) if nxt - lo == 1 else f"{lo}-{nxt - 1}"


def rows_edges(thresholds: Iterable[int], *, top: int = POW2_TOP) -> tuple[int, ...]:
    """Lower edges: 0 (an empty call), the powers of two up to ``top``, and every threshold > 0."""
    edges = {0}
    p = 1
    while p <= top:
        edges.add(p)
        p *= 2
    edges.update(t for t in thresholds if t > 0)
    return tuple(sorted(edges))


def rows_labels(edges: tuple[int, ...]) -> tuple[str, ...]:
    """`1`, `2-3`, …, `512-767`, `768-1023`, …, `16384+` for the given lower edges."""
    return tuple(_label(lo, edges[i + 1] if i + 1 < len(edges) else None) for i, lo in enumerate(edges))


class RowsBuckets:
    """Fine buckets (active and counterfactual thresholds as edges) and the exported label of each.

    The hot path looks ``lut[rows]`` up (rows beyond the table are in the last bucket). Fine
    buckets exist so that every counterfactual policy sees one rows class per bucket; each
    maps onto exactly one exported bucket, whose edges are the active thresholds only.
    """

    __slots__ = ("fine_edges", "label_edges", "labels", "fine_to_label", "lut", "top")

    def __init__(self, active: Iterable[int], extra: Iterable[int] = (), *, top: int = POW2_TOP) -> None:
        active = tuple(active)
        self.label_edges = rows_edges(active, top=top)
        self.fine_edges = rows_edges(active + tuple(extra), top=top)
        self.labels = rows_labels(self.label_edges)
        self.fine_to_label = tuple(bisect_right(self.label_edges, lo) - 1 for lo in self.fine_edges)
        last = self.fine_edges[-1]
        lut = [0] * (last + 1)
        for i, lo in enumerate(self.fine_edges):
            hi = self.fine_edges[i + 1] if i + 1 < len(self.fine_edges) else last + 1
            lut[lo:hi] = [i] * (hi - lo)
        self.lut = lut
        self.top = len(self.fine_edges) - 1

    def fine(self, rows: int) -> int:
        """The fine bucket of ``rows`` (the hot path inlines this)."""
        return self.lut[rows] if rows < len(self.lut) else self.top

    def label(self, rows: int) -> str:
        return self.labels[self.fine_to_label[self.fine(rows)]]

    @property
    def n_fine(self) -> int:
        return len(self.fine_edges)


def latency_bounds_s() -> tuple[float, ...]:
    """1 µs … 100 s, 1-2.5-5 per decade (docs/metrics.md)."""
    out: list[float] = []
    for exp in range(-6, 2):
        for mant in (1.0, 2.5, 5.0):
            out.append(float(f"{mant}e{exp}"))
    out.append(100.0)
    return tuple(out)


LATENCY_BOUNDS_S = latency_bounds_s()
LATENCY_BOUNDS_NS = tuple(round(b * 1e9) for b in LATENCY_BOUNDS_S)
N_LATENCY_BUCKETS = len(LATENCY_BOUNDS_S) + 1  # the last is +Inf


def quantile(counts: list[int], q: float, bounds: tuple[float, ...] = LATENCY_BOUNDS_S) -> float | None:
    """Prometheus' histogram_quantile on non-cumulative bucket counts (linear within a bucket)."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    acc = 0
    for i, c in enumerate(counts):
        if c and acc + c >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lo = bounds[i - 1] if i > 0 else 0.0
            return lo + (bounds[i] - lo) * ((rank - acc) / c)
        acc += c
    return bounds[-1]
