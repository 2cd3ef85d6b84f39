"""Aggregates -> label-keyed totals, off the hot path; every exporter and snapshot() reads these.

Keys are label tuples in docs/metrics.md order without ``rank`` (the exporters add it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dispatcher.policy import Policy

from .aggregates import Aggregates
from .buckets import LATENCY_BOUNDS_NS
from .native import NativeCounts
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
    replayed: dict[Key, int] = field(default_factory=dict)
    replayed_untimed: dict[Key, int] = field(default_factory=dict)
    traffic_calls: dict[Key, int] = field(default_factory=dict)
    traffic_rows: dict[Key, int] = field(default_factory=dict)
    traffic_decode_rows: dict[Key, int] = field(default_factory=dict)
    decode_path_calls: dict[Key, int] = field(default_factory=dict)
    decode_path_rows: dict[Key, int] = field(default_factory=dict)
    telemetry_errors: dict[Key, int] = field(default_factory=dict)
    dropped: dict[Key, int] = field(default_factory=dict)
    latency: dict[Key, tuple[list[int], float]] = field(default_factory=dict)  # (bucket counts, sum s), keyed with clock
    latency_native: dict[Key, NativeCounts] = field(default_factory=dict)  # the same samples in native buckets
    last_flush: dict[Key, float] = field(default_factory=dict)
    thresholds: dict[Key, float] = field(default_factory=dict)
    cf_info: dict[Key, float] = field(default_factory=dict)  # (policy, arch it is decided on) -> 1
    build_info: dict[Key, float] = field(default_factory=dict)
    clock_constants: dict[Key, float] = field(default_factory=dict)  # (clock, device) -> seconds
    ts: float = 0.0


def _add(d: dict, key: Key, n: int) -> None:
    d[key] = d.get(key, 0) + n


def _default_impl(kernel: str, seen: dict[str, str]) -> str:
    """Impl of slots whose calls all raised before ``stop``: AITER kernels are aiter, else what the kernel ran elsewhere."""
    if kernel.startswith("aiter."):
        return "aiter"
    return seen.get(kernel, "torch")


def _add_latency(t: Totals, key: Key, counts: list[int], total_ns: int, native: NativeCounts | None) -> None:
    if not any(counts):
        return
    have, total = t.latency.get(key, ([0] * (len(LATENCY_BOUNDS_NS) + 1), 0.0))
    t.latency[key] = ([x + y for x, y in zip(have, counts)], total + total_ns / 1e9)
    if native is not None:
        merged = t.latency_native.get(key)
        if merged is None:
            merged = t.latency_native[key] = NativeCounts()
        merged.merge(native)


def build_totals(
    agg: Aggregates,
    *,
    arch: str,
    policies: tuple[Policy, ...],
    build_info: Key,
    cf_arch: str | None = None,
    ts: float | None = None,
    absent_gates: tuple[str, ...] = (),
    clock_constants: dict[Key, int] | None = None,
) -> Totals:
    """Sum slots into series. Reads the hot path's lists without a lock: counts only grow."""
    t = Totals(ts=time.time() if ts is None else ts)
    c = agg.counters
    n = agg.n_slots
    info = agg.info[:n]
    calls, rows, drows = c.calls[:n], c.rows[:n], c.decode_rows[:n]
    captured, replayed, untimed, impls = c.captured[:n], c.replayed[:n], c.replayed_untimed[:n], c.impl[:n]
    extra: dict[int, list[tuple[str, int]]] = {}
    for (s, impl), count in list(c.impl_extra.items()):
        extra.setdefault(s, []).append((impl, count))
    seen_impl = {info[s].kernel: impls[s] for s in range(n) if impls[s]}
    cf_names = tuple(p.name for p in policies)
    for s in range(n):
        inf = info[s]
        k, m, b, cc = inf.kernel, inf.model, inf.bucket, inf.call_class
        calls_s = calls[s]
        if calls_s > 0:
            _add(t.decisions, (k, inf.reason, m), calls_s)
            for name, wk, wd in zip(cf_names, inf.would, inf.would_dip):
                _add(t.would_route, (name, wk, b, m), calls_s)
                if wd:
                    _add(t.would_dip, (name, wk, b, m), calls_s)
            if inf.refused:
                _add(t.refused, (k, m), calls_s)
            else:
                main = calls_s
                for impl, count in extra.get(s, ()):
                    _add(t.calls, (k, impl, b, m, cc, arch), count)
                    main -= count
                if main:
                    _add(t.calls, (k, impls[s] or _default_impl(k, seen_impl), b, m, cc, arch), main)
                _add(t.rows, (k, b, m, cc), rows[s])
                traffic = (k, b, m, cc) + inf.traffic_key
                _add(t.traffic_calls, traffic, calls_s)
                _add(t.traffic_rows, traffic, rows[s])
                _add(t.traffic_decode_rows, traffic, drows[s])
                if inf.decode_in_prefill:
                    _add(t.dip_calls, (k, m, cc), calls_s)
                    _add(t.dip_rows, (k, m, cc), drows[s])
                if inf.rerouted_from:
                    _add(t.rerouted, (inf.rerouted_from, k, m), calls_s)
                if replayed[s]:
                    _add(t.replayed, (k, m), replayed[s])
                    if untimed[s]:
                        _add(t.replayed_untimed, (k, m), untimed[s])
        if captured[s]:
            _add(t.captured, (k, m), captured[s])
        hist, clock = c.latency[s], c.latency_clock[s]
        if hist is not None and clock is not None:
            _add_latency(t, (k, b, m, clock.value), hist, c.latency_sum_ns[s], c.latency_native[s])
    for (s, clock), (counts, total) in list(c.other_clock.items()):
        inf = agg.info[s]
        _add_latency(t, (inf.kernel, inf.bucket, inf.model, clock.value), counts, total[0],
                     c.other_clock_native.get((s, clock)))
    for (s, exc), count in list(agg.kernel_errors.counts.items()):
        inf = agg.info[s]
        _add(t.kernel_errors, (inf.kernel, exc, inf.model), count)
    dp = agg.decode_path
    for mi, name in enumerate(agg.model_names):
        if dp.calls[mi]:
            t.decode_path_calls[(name,)] = dp.calls[mi]
            t.decode_path_rows[(name,)] = dp.rows[mi]
    health = agg.health
    t.telemetry_errors = {(stage,): health.errors[i] for i, stage in enumerate(STAGES)}
    t.dropped = {(r,): health.dropped[i] for i, r in enumerate(DROP_REASONS)}
    t.last_flush = {(): t.ts}
    for p in (agg.policy,) + policies:
        for gate in ("gfx942_min_rows", "gfx950_min_rows"):
            if p is not agg.policy or gate not in absent_gates:  # a gate the router lacks has no threshold
                t.thresholds[(gate, p.name)] = float(getattr(p, gate))
    t.cf_info = {(p.name, cf_arch or arch): 1.0 for p in policies}
    t.build_info = {build_info: 1.0}
    t.clock_constants = {key: ns / 1e9 for key, ns in (clock_constants or {}).items()}
    return t
