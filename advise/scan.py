"""Predicted kernel time of one model's traffic under each candidate, and its saving against the active policy. Pure.

The band. Each priced call carries 12 values: 2 interpolants x 3 spreads x 2 bucket readings
(``interp``). A figure (a total, or a saving) is a sum over kernels; its band is the lowest and
highest that sum takes over every choice of interpolant, of bucket reading, and of spread *per
kernel* (all calls of one kernel at its low, middle or high time, each kernel chosen apart from
the others). The estimate is the power-law interpolant, middle times, calls at the mean rows.
A ratio of two kernels' prices (an experiment's predicted B/A, ``ratio_band``) ranges over the same choices.

A saving counts only the calls a candidate moves to another kernel: calls routed alike cost the
same under both and cancel exactly. When a moved call cannot be priced (outside the table),
the saving is unknown, and says why; a total leaves unpriced calls out and counts them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import product

import numpy as np

from .latency import LatencyModel, Miss, Shape
from .policies import Candidate, Target, launches, straddles
from .traffic import TrafficEntry

ESTIMATE = (0, 1, 0)  # loglog, middle spread, mean rows


@dataclass(frozen=True, slots=True)
class Band:
    mid: float
    low: float
    high: float

    def scaled(self, factor: float) -> Band:
        return Band(self.mid * factor, self.low * factor, self.high * factor)

    def negated(self) -> Band:
        return Band(0.0 - self.mid, 0.0 - self.high, 0.0 - self.low)


def _extremes(arrays: list[np.ndarray], combine) -> tuple[float, float]:
    """Lowest and highest of ``combine`` over every choice of interpolant and bucket reading (shared by all the
    arrays) and of spread per array: the choice set of every band advise gives."""
    lo = hi = None
    for spreads in product(range(3), repeat=len(arrays)):
        value = combine([a[:, s, :] for a, s in zip(arrays, spreads)])  # [interp][bucket]
        lo = float(value.min()) if lo is None else min(lo, float(value.min()))
        hi = float(value.max()) if hi is None else max(hi, float(value.max()))
    return lo, hi  # type: ignore[return-value]


def band_of(parts: dict[str, np.ndarray]) -> Band:
    """The estimate and the range of sum_k parts[k][interp, spread_k, bucket] over all choices (see module doc)."""
    if not parts:
        return Band(0.0, 0.0, 0.0)
    mid = float(sum(a[ESTIMATE] for a in parts.values()))
    lo, hi = _extremes(list(parts.values()), sum)
    return Band(mid, min(lo, mid), max(hi, mid))


def ratio_band(num: np.ndarray, den: np.ndarray) -> Band:
    """One kernel's price over another's (B/A of a call), with the band a sum gets: the same interpolant and
    bucket reading for both, each kernel's spread apart (so a table's p20-p80 of each kernel widens it)."""
    mid = float(num[ESTIMATE] / den[ESTIMATE])
    lo, hi = _extremes([num, den], lambda v: v[0] / v[1])
    return Band(mid, min(lo, mid), max(hi, mid))


@dataclass
class Priced:
    """One candidate's figures for one model."""

    candidate: Candidate
    calls: int = 0
    covered_calls: int = 0
    total: dict[str, np.ndarray] = field(default_factory=dict)  # kernel -> seconds [interp][spread][bucket]
    uncovered: Counter = field(default_factory=Counter)  # reason -> calls left unpriced
    delta: dict[str, np.ndarray] = field(default_factory=dict)  # candidate - active, over moved calls
    moved_calls: int = 0
    moved_decode_rows: int = 0
    delta_unknown: Counter = field(default_factory=Counter)  # reasons a moved call has no price
    tables: set[str] = field(default_factory=set)
    notes: dict[str, None] = field(default_factory=dict)  # Outcome.notes of the priced calls, in order, once each

    @property
    def seconds(self) -> Band | None:
        return band_of(self.total) if self.covered_calls else None

    @property
    def saving(self) -> Band | None:
        """Seconds saved against the active policy (positive: less kernel time); None if a moved call is unpriced."""
        if self.delta_unknown:
            return None
        return band_of(self.delta).negated()


def _add(acc: dict[str, np.ndarray], kernel: str, values: np.ndarray) -> None:
    acc[kernel] = acc[kernel] + values if kernel in acc else values.copy()


@dataclass(frozen=True)
class Outcome:
    """Where a candidate sends one entry's calls, and their price (or why there is none)."""

    route: tuple[tuple[str, float], ...] | None  # (kernel, mean rows) per launch; None: the gate splits the bucket
    parts: tuple[tuple[str, np.ndarray], ...] = ()  # (kernel, seconds for all the entry's calls)
    reason: str = ""
    tables: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # how the prices were found, where a reader should know (kv pools, wide gaps)


def price_notes(kernel: str, p) -> list[str]:
    """What a reader of ``kernel``'s price should know: the kv pools it rests on, the wide gaps it spans."""
    out = [f"{kernel}: {p.pool_note}"] if p.pool_note else []
    out += [f"{kernel}: priced between timed rows {a:.0f} and {b:.0f}, more than 2x apart: the band holds a flat "
            "and a power-law curve between them" for a, b in p.gaps]
    return out


def outcome(lm: LatencyModel, entry: TrafficEntry, cand: Candidate, target: Target, recorded: bool) -> Outcome:
    t = straddles(entry, cand, target)
    if t is not None:
        return Outcome(None, reason=f"gate {t} falls inside rows bucket {entry.rows_bucket}: the aggregates "
                                    "cannot tell which calls it moves")
    shape = Shape(entry.topk, entry.layout, entry.q_dtype, entry.kv_dtype, entry.kv_pool_bytes)
    found = launches(entry, cand, target, recorded=recorded)
    route = tuple((x.kernel, x.mean) for x in found)
    parts, tables, notes = [], [], []
    for launch in found:
        p = lm.price(launch.kernel, shape, launch.lo, launch.mean, launch.hi)
        if isinstance(p, Miss):
            return Outcome(route, reason=p.reason)
        parts.append((launch.kernel, p.seconds * launch.calls))
        tables.extend(p.tables)
        notes.extend(price_notes(launch.kernel, p))
    return Outcome(route, tuple(parts), "", tuple(tables), tuple(dict.fromkeys(notes)))


def price_model(entries: list[TrafficEntry], cands: list[Candidate], target: Target, lm: LatencyModel,
                *, recorded: bool) -> list[Priced]:
    """Every candidate's totals and saving over this model's entries (``recorded``: active = what ran).

    ``cands[0]`` is the active policy.
    """
    results = [Priced(c) for c in cands]
    active = results[0]
    for entry in entries:
        n = entry.calls
        base = outcome(lm, entry, active.candidate, target, recorded)
        for res in results:
            out = base if res is active else outcome(lm, entry, res.candidate, target, recorded)
            res.calls += n
            if out.reason:
                res.uncovered[out.reason] += n
            else:
                res.covered_calls += n
                res.tables.update(out.tables)
                res.notes.update(dict.fromkeys(out.notes))
                for kernel, v in out.parts:
                    _add(res.total, kernel, v)
            if res is active or (out.route is not None and out.route == base.route):
                continue
            res.moved_calls += n
            res.moved_decode_rows += entry.decode_rows
            reason = out.reason or base.reason
            if reason:
                res.delta_unknown[reason] += n
                continue
            for kernel, v in out.parts:
                _add(res.delta, kernel, v)
            for kernel, v in base.parts:
                _add(res.delta, kernel, -v)
    return results
