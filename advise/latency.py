"""One latency model over one or more tables of a single arch: per-call time of a kernel at a shape, or why not.

Where two tables time the same series (kernel x top-k x layout x dtypes x kv pool), the first given wins.
A table that times several kv pools prices a shape at the pool ``pools.choose`` picks for the shape's
``kv_pool_bytes`` (None: not known), the band across the pools it rests on.
A kernel with no absolute points of its own may be derived from a ratio table: its time is the
other kernel's time over the ratio, both interpolated at the same rows (``interp``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import pools
from .interp import Curve, bucket_values
from .tables import LatencyTable, SeriesKey, TableMeta


@dataclass(frozen=True, slots=True)
class Priced:
    """Seconds per call, [interp][spread][bucket] (see ``interp``), and the tables it rests on."""

    seconds: np.ndarray
    tables: tuple[str, ...]
    gaps: tuple[tuple[float, float], ...] = ()  # timed rows > 2x apart the price fell between (band widened)
    pool_note: str = ""  # which kv pools priced it, when not the shape's own


@dataclass(frozen=True, slots=True)
class Miss:
    """Why no time can be given: a sentence for people."""

    reason: str


@dataclass(frozen=True, slots=True)
class Shape:
    """What a table is keyed by, besides the kernel and the rows."""

    topk: int
    layout: str
    q_dtype: str
    kv_dtype: str
    kv_pool_bytes: int | None = None  # the pool's power-of-two bucket (telemetry's label); None: not known


def _fmt(rows: float) -> str:
    return f"{rows:.0f}" if rows >= 10 or rows == int(rows) else f"{rows:.1f}"


class LatencyModel:
    """Prices a call of a kernel at a shape and a rows bucket, from the tables given (first wins)."""

    def __init__(self, tables: Sequence[LatencyTable]) -> None:
        if not tables:
            raise ValueError("a latency model needs at least one table")
        archs = {t.meta.arch for t in tables}
        if len(archs) > 1:
            names = ", ".join(f"{t.meta.name} ({t.meta.arch})" for t in tables)
            raise ValueError(f"tables of different archs cannot price one routing: {names}")
        self.arch = archs.pop()
        self.tables = tuple(tables)
        self._series: dict[SeriesKey, tuple[Curve, str]] = {}
        self._pools: dict[tuple, list[int | None]] = {}  # series less its pool -> the pools timed
        self._ratios: dict[tuple, tuple[Curve, str]] = {}
        for t in tables:
            for key, curve in t.series.items():
                if key not in self._series:
                    self._series[key] = (curve, t.meta.name)
                    self._pools.setdefault(key[:5], []).append(key[5])
            for key, curve in t.ratios.items():
                self._ratios.setdefault(key, (curve, t.meta.name))
        self._cache: dict[tuple, Priced | Miss] = {}

    @property
    def metas(self) -> tuple[TableMeta, ...]:
        return tuple(t.meta for t in self.tables)

    def _direct(self, kernel: str, shape: Shape):
        """(curve, table name) of each pool that prices ``kernel`` at ``shape``, and the choice; None if none."""
        base = (kernel, shape.topk, shape.layout, shape.q_dtype, shape.kv_dtype)
        timed = self._pools.get(base)
        if not timed:
            return None
        choice = pools.choose(timed, shape.kv_pool_bytes)
        return [self._series[base + (p,)] for p in choice.pools], choice

    def _derived(self, kernel: str, shape: Shape):
        """(ratio curve, numerator curve, tables) deriving ``kernel`` at ``shape``, or None."""
        for (num, over, topk, lay, q, kv), (ratio, name) in self._ratios.items():
            if over != kernel or (topk, lay, q, kv) != (shape.topk, shape.layout, shape.q_dtype, shape.kv_dtype):
                continue
            base = self._direct(num, shape)
            if base is not None:
                return ratio, base, tuple(dict.fromkeys([n for _, n in base[0]] + [name]))
        return None

    def curve_at(self, kernel: str, shape: Shape):
        """A function rows -> [interp][spread] seconds (None outside), its tables, and the rows it covers."""
        direct = self._direct(kernel, shape)
        derived = self._derived(kernel, shape)
        if direct is None and derived is None:
            return None
        spans = []
        if direct is not None:
            spans.append((max(c.first for c, _ in direct[0]), min(c.last for c, _ in direct[0])))
        if derived is not None:
            ratio, (base, _) = derived[0], derived[1]
            spans.append((max([ratio.first] + [c.first for c, _ in base]),
                          min([ratio.last] + [c.last for c, _ in base])))

        def across(found, rows: float):
            """The chosen pools' curves at ``rows``, combined; None if any is outside."""
            curves, choice = found
            values = [c.at(rows) for c, _ in curves]
            if any(v is None for v in values):
                return None, ()
            gaps = tuple(g for g in (c.gap(rows) for c, _ in curves) if g is not None)
            return pools.combine(choice, values), gaps

        def at(rows: float):
            if direct is not None:
                v, gaps = across(direct, rows)
                if v is not None:
                    return v * 1e-6, tuple(dict.fromkeys(n for _, n in direct[0])), gaps
            if derived is not None:
                r, (b, gaps) = derived[0].at(rows), across(derived[1], rows)
                if r is not None and b is not None:
                    gap = derived[0].gap(rows)
                    # each interpolant's ratio divides its own base
                    return b * 1e-6 / r[:, 1:2], derived[2], gaps + ((gap,) if gap else ())
            return None, (), ()

        return at, spans

    def price(self, kernel: str, shape: Shape, lo: float, mean: float, hi: float | None) -> Priced | Miss:
        """A call of ``kernel`` at ``mean`` rows in the bucket [lo, hi] (hi None: open above)."""
        key = (kernel, shape, lo, mean, hi)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._price(kernel, shape, lo, mean, hi)
        return hit

    def _price(self, kernel: str, shape: Shape, lo: float, mean: float, hi: float | None) -> Priced | Miss:
        found = self.curve_at(kernel, shape)
        if found is None:
            return Miss(self._no_series(kernel, shape))
        at, spans = found
        used: list[str] = []
        gaps: list[tuple[float, float]] = []

        def values(rows: float):
            v, names, fell = at(rows)
            if v is not None:
                used.extend(names)
                gaps.extend(fell)
            return v

        priced = bucket_values(values, lo, mean, hi)
        if priced is None:
            timed = ", ".join(f"{_fmt(a)}-{_fmt(b)}" for a, b in spans)
            return Miss(f"{kernel} at {_fmt(mean)} rows: outside the table (timed {timed} rows at top-k "
                        f"{shape.topk}, {shape.layout})")
        choice = self._choice(kernel, shape)
        return Priced(priced, tuple(dict.fromkeys(used)), tuple(dict.fromkeys(gaps)), choice.note if choice else "")

    def _choice(self, kernel: str, shape: Shape) -> pools.PoolChoice | None:
        direct = self._direct(kernel, shape)
        if direct is not None:
            return direct[1]
        derived = self._derived(kernel, shape)
        return derived[1][1] if derived is not None else None

    def pools_of(self, kernel: str, shape: Shape) -> tuple[int, ...]:
        """The kv pools (bytes) the tables time ``kernel`` at ``shape``'s other keys; () for tables without."""
        base = (kernel, shape.topk, shape.layout, shape.q_dtype, shape.kv_dtype)
        return tuple(sorted(p for p in self._pools.get(base, ()) if p is not None))

    def _no_series(self, kernel: str, shape: Shape) -> str:
        have = [k for k in self._series if k[0] == kernel] + [
            (k[1],) + k[2:] for k in self._ratios if k[1] == kernel and self._direct(k[0], Shape(*k[2:6]))]
        if not have:
            return f"no table times {kernel} on {self.arch}"
        topks = sorted({k[1] for k in have})
        layouts = sorted({k[2] for k in have})
        dtypes = sorted({f"{k[3]}/{k[4]}" for k in have})
        return (f"{kernel} at top-k {shape.topk}, {shape.layout}, q/kv {shape.q_dtype}/{shape.kv_dtype}: not in the "
                f"table (it has top-k {', '.join(map(str, topks))}; {', '.join(layouts)}; {', '.join(dtypes)})")
