"""Aggregates -> label-keyed totals, off the hot path; every exporter and snapshot() reads these.

Keys are label tuples in docs/metrics.md order without ``rank`` (the exporters add it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dispatcher.policy import Policy

from .aggregates import Aggregates
from .buckets import LATENCY_BOUNDS_NS
from .spec import DROP_REASONS, STAGES

Key = tuple[str, ...]


@dataclass
class Totals:
    """One flush's view of every series; dicts from label tuples to numbers."""

    calls: dict[Key, int] = field(default_factory=dict)
    rows: dict[Key, int] = field(default_factory=dict)
    decisions: dict[Key, int] = field(default_factory=dict)
    dip_calls: dict[Key, int] = field(default_factory=dict)
    dip_rows: dict[Key, int] = field(default_factory=dict)
    rerouted: dict[Key, int] = field(default_factory=dict)
    refused: dict[Key, int] = field(default_factory=dict)
    would_route: dict[Key, int] = field(default_factory=dict)
    would_dip: dict[Key, int] = field(default_factory=dict)  # of would_route: decode rows into a prefill kernel (snapshot only)
    kernel_errors: dict[Key, int] = field(default_factory=dict)
    captured: dict[Key, int] = field(default_factory=dict)
    decode_path_calls: dict[Key, int] = field(default_factory=dict)
    decode_path_rows: dict[Key, int] = field(default_factory=dict)
    telemetry_errors: dict[Key, int] = field(default_factory=dict)
    dropped: dict[Key, int] = field(default_factory=dict)
    latency: dict[Key, tuple[list[int], float]] = field(default_factory=dict)  # (bucket counts, sum s)
    last_flush: dict[Key, float] = field(default_factory=dict)
    thresholds: dict[Key, float] = field(default_factory=dict)
    cf_info: dict[Key, float] = field(default_factory=dict)  # (policy, arch it is decided on) -> 1
    build_info: dict[Key, float] = field(default_factory=dict)
    ts: float = 0.0


def _add(d: dict, key: Key, n: int) -> None:
    d[key] = d.get(key, 0) + n


def _default_impl(kernel: str, seen: dict[str, str]) -> str:
    """Impl of slots whose calls all raised before ``stop``: AITER kernels are aiter, else what the kernel ran elsewhere."""
    if kernel.startswith("aiter."):
        return "aiter"
    return seen.get(kernel, "torch")


def build_totals(
    agg: Aggregates,
    *,
    arch: str,
    policies: tuple[Policy, ...],
    build_info: Key,
    cf_arch: str | None = None,
    ts: float | None = None,
) -> Totals:
    """Sum slots into series. Reads the hot path's lists without a lock: counts only grow."""
    t = Totals(ts=time.time() if ts is None else ts)
    n = agg.n_slots
    info = agg.info[:n]
    calls, rows, drows = agg.calls[:n], agg.rows[:n], agg.drows[:n]
    captured, impls, hsum = agg.captured[:n], agg.impl[:n], agg.hsum[:n]
    extra: dict[int, list[tuple[str, int]]] = {}
    for (s, impl), c in list(agg.impl_extra.items()):
        extra.setdefault(s, []).append((impl, c))
    seen_impl = {info[s].kernel: impls[s] for s in range(n) if impls[s]}
    cf_names = tuple(p.name for p in policies)
    for s in range(n):
        inf = info[s]
        k, m, b, cc = inf.kernel, inf.model, inf.bucket, inf.call_class
        c = calls[s]
        if c > 0:
            _add(t.decisions, (k, inf.reason, m), c)
            for name, wk, wd in zip(cf_names, inf.would, inf.would_dip):
                _add(t.would_route, (name, wk, b, m), c)
                if wd:
                    _add(t.would_dip, (name, wk, b, m), c)
            if inf.refused:
                _add(t.refused, (k, m), c)
            else:
                main = c
                for impl, ce in extra.get(s, ()):
                    _add(t.calls, (k, impl, b, m, cc, arch), ce)
                    main -= ce
                if main:
                    _add(t.calls, (k, impls[s] or _default_impl(k, seen_impl), b, m, cc, arch), main)
                _add(t.rows, (k, b, m, cc), rows[s])
                if inf.decode_in_prefill:
                    _add(t.dip_calls, (k, m, cc), c)
                    _add(t.dip_rows, (k, m, cc), drows[s])
                if inf.rerouted_from:
                    _add(t.rerouted, (inf.rerouted_from, k, m), c)
        if captured[s]:
            _add(t.captured, (k, m), captured[s])
        h = agg.hists[s]
        if h is not None and hsum[s] >= 0 and any(h):
            key = (k, b, m)
            counts, total = t.latency.get(key, ([0] * (len(LATENCY_BOUNDS_NS) + 1), 0.0))
            t.latency[key] = ([x + y for x, y in zip(counts, h)], total + hsum[s] / 1e9)
    for (s, exc), c in list(agg.errors.items()):
        inf = info[s] if s < n else agg.info[s]
        _add(t.kernel_errors, (inf.kernel, exc, inf.model), c)
    for mi, name in enumerate(agg.model_names):
        if agg.dp_calls[mi]:
            t.decode_path_calls[(name,)] = agg.dp_calls[mi]
            t.decode_path_rows[(name,)] = agg.dp_rows[mi]
    t.telemetry_errors = {(stage,): agg.errs[i] for i, stage in enumerate(STAGES)}
    t.dropped = {(r,): agg.dropped[i] for i, r in enumerate(DROP_REASONS)}
    t.last_flush = {(): t.ts}
    for p in (agg.policy,) + policies:
        t.thresholds[("gfx942_min_rows", p.name)] = float(p.gfx942_min_rows)
        t.thresholds[("gfx950_min_rows", p.name)] = float(p.gfx950_min_rows)
    t.cf_info = {(p.name, cf_arch or arch): 1.0 for p in policies}
    t.build_info = {build_info: 1.0}
    return t
