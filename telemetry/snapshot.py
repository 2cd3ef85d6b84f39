"""Telemetry.snapshot(): the totals as plain JSON-ready dicts for /routing and people."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Protocol

from dispatcher.platform import Platform
from dispatcher.policy import Policy

from .aggregates import Aggregates
from .buckets import quantile
from .native import SCHEMA
from .config import TelemetryConfig
from .spec import DROP_REASONS, STAGES, TRAFFIC_LABELS
from .view import Totals


class Source(Protocol):
    """What a snapshot reads from its Telemetry (telemetry.core.Telemetry provides it)."""

    config: TelemetryConfig
    platform: Platform
    policy: Policy
    counterfactuals: tuple[Policy, ...]
    counterfactual_platform: Platform
    timing: str

    @property
    def aggregates(self) -> Aggregates: ...
    @property
    def recent_decisions(self) -> deque | None: ...
    @property
    def wall_offset_ns(self) -> int: ...
    @property
    def last_background_flush(self) -> float | None: ...
    @property
    def running(self) -> bool: ...
    @property
    def probe_failures(self) -> int: ...
    @property
    def multiprocess_dir(self) -> str | None: ...
    @property
    def totals(self) -> Totals: ...
    @property
    def device_frames(self) -> dict[str, int]: ...


def _rows(d: dict, names: tuple[str, ...], value: str = "calls") -> list[dict[str, Any]]:
    return [dict(zip(names, k), **{value: v}) for k, v in sorted(d.items())]


def _counts(t: Totals) -> list[dict[str, Any]]:
    """Calls per impl; rows are per (kernel, bucket, model, class), on the first impl listed for it."""
    out = []
    given: set[tuple] = set()
    for (k, impl, b, m, cc, _arch), n in sorted(t.calls.items()):
        rk = (k, b, m, cc)
        rows = t.rows.get(rk, 0) if rk not in given else 0
        given.add(rk)
        out.append({"kernel": k, "impl": impl, "rows_bucket": b, "model": m, "call_class": cc, "calls": n, "rows": rows})
    return out


def _would_route(t: Totals, *, merged: bool = False) -> list[dict[str, Any]]:
    """Would-route calls per (policy, kernel, bucket, model), and how many carried decode rows into a prefill kernel.

    Merged from every process's files (``merged``) the second count is None: it is never exported.
    """
    return [
        {"policy": p, "kernel": k, "rows_bucket": b, "model": m, "calls": n,
         "decode_in_prefill_calls": None if merged else t.would_dip.get((p, k, b, m), 0)}
        for (p, k, b, m), n in sorted(t.would_route.items())
    ]


def _where_decided(tel: Source) -> str:
    """Where counterfactuals are decided, for people: "what-if gfx942", or the real platform's arch."""
    arch = tel.config.counterfactual_arch
    return f"what-if {arch}" if arch else tel.platform.arch


def _latency(t: Totals) -> list[dict[str, Any]]:
    """Quantiles from the native buckets (4.4% wide) where the totals hold them, else from the classic ones."""
    out = []
    for key, (counts, total) in sorted(t.latency.items()):
        k, b, m, clock = key
        n = sum(counts)
        native = t.latency_native.get(key)
        shape = None
        if native is not None and native.count == n:
            p50, p90, p99 = native.quantile(0.5), native.quantile(0.9), native.quantile(0.99)
            resolution = "native"
            shape = {"schema": SCHEMA, "zero": native.zero,
                     "buckets": [[i, c] for i, c in sorted(native.buckets.items()) if c]}
        else:
            p50, p90, p99 = quantile(counts, 0.5), quantile(counts, 0.9), quantile(counts, 0.99)
            resolution = "classic"
        out.append({
            "kernel": k, "rows_bucket": b, "model": m, "clock": clock, "samples": n, "sum_s": total,
            "mean_s": total / n if n else None, "p50_s": p50, "p90_s": p90, "p99_s": p99, "buckets": resolution,
            "native": shape,
        })
    return out


def _pool(key: tuple) -> int | None:
    """The traffic key's kv pool bucket in bytes; None where the calls' shape did not know it."""
    return int(key[8]) if len(key) > 8 and key[8] else None


def _traffic(t: Totals) -> list[dict[str, Any]]:
    """Calls, rows and decode rows per row-free call shape (what ``routescope advise`` prices)."""
    return [
        {**dict(zip(TRAFFIC_LABELS, key)), "topk": int(key[4]), "kv_pool_bytes": _pool(key),
         "calls": n, "rows": t.traffic_rows.get(key, 0),
         "decode_rows": t.traffic_decode_rows.get(key, 0)}
        for key, n in sorted(t.traffic_calls.items())
    ]


def _decisions(tel: Source) -> list[dict[str, Any]]:
    dq = tel.recent_decisions
    if dq is None:
        return []
    info = tel.aggregates.info
    off = tel.wall_offset_ns
    out = []
    for t_ns, s, rows, d in list(dq):
        inf = info[s]
        out.append({
            "ts": (t_ns + off) / 1e9, "kernel": inf.kernel, "reason": inf.decision.reason,
            "reason_code": inf.reason, "rows": rows, "rows_bucket": inf.bucket, "model": inf.model,
            "call_class": inf.call_class, "decode_rows": d,
        })
    return out


def build_snapshot(tel: Source, own: Totals, *, merged: Totals | None = None) -> dict[str, Any]:
    """Keys: platform, policy, counterfactuals, counterfactual_platform, counts, traffic, decode_in_prefill, latency,
    decisions, would_route, errors, guard, graph_captured, graph_replayed, graph_replayed_untimed, decode_path, health,
    scope (plus rank, arch, timing, device_frames, rows_buckets).

    The series come from ``merged`` (every process's, multiprocess mode) when given, else from
    ``own``; decisions, first occurrences and health are always this process's.
    """
    agg = tel.aggregates
    now = time.time()
    where = _where_decided(tel)
    t = merged if merged is not None else own
    dip = [
        {"kernel": k, "model": m, "call_class": cc, "calls": n, "rows": t.dip_rows.get((k, m, cc), 0)}
        for (k, m, cc), n in sorted(t.dip_calls.items())
    ]
    return {
        "platform": tel.platform.to_dict(),
        "policy": tel.policy.to_dict(),
        "counterfactuals": [dict(p.to_dict(), platform=where) for p in tel.counterfactuals],
        "counterfactual_platform": tel.counterfactual_platform.to_dict(),
        "rank": tel.config.rank,
        "arch": tel.platform.arch,
        "timing": tel.timing,
        "device_frames": dict(tel.device_frames),
        "rows_buckets": list(agg.buckets.labels),
        "counts": _counts(t),
        "traffic": _traffic(t),
        "decode_in_prefill": {"counts": dip,
                              "first_occurrences": [dict(r) for r in agg.first_decode_in_prefill.records]},
        "latency": _latency(t),
        "decisions": _decisions(tel),
        "would_route": _would_route(t, merged=merged is not None),
        "errors": _rows(t.kernel_errors, ("kernel", "exception", "model")),
        "guard": {
            "mode": tel.policy.guard.value,
            "rerouted": _rows(t.rerouted, ("from_kernel", "to_kernel", "model")),
            "refused": _rows(t.refused, ("kernel", "model")),
        },
        "graph_captured": _rows(t.captured, ("kernel", "model")),
        "graph_replayed": _rows(t.replayed, ("kernel", "model")),
        "graph_replayed_untimed": _rows(t.replayed_untimed, ("kernel", "model")),
        "decode_path": [
            {"model": m, "calls": n, "rows": t.decode_path_rows.get((m,), 0)} for (m,), n in sorted(t.decode_path_calls.items())
        ],
        "scope": {"series": "every process" if merged is not None else "this process", "decisions": "this process",
                  "health": "this process"},
        "health": {
            "telemetry_errors": {k[0]: v for k, v in own.telemetry_errors.items()},
            "dropped": {k[0]: v for k, v in own.dropped.items()},
            "last_flush_ts": own.ts or None,
            "flush_lag_s": (now - tel.last_background_flush) if tel.last_background_flush else None,
            "flush_thread": tel.running,
            "probe_failures": tel.probe_failures,
            "slots": agg.n_slots,
            "max_slots": agg.max_slots,
            "multiprocess_dir": tel.multiprocess_dir,
        },
    }


def empty_snapshot(tel: Source) -> dict[str, Any]:
    """Every key, no data: what snapshot() returns if building the real one failed (health still says why)."""
    agg = tel.aggregates
    return {
        "platform": tel.platform.to_dict(), "policy": tel.policy.to_dict(), "counterfactuals": [],
        "counterfactual_platform": tel.counterfactual_platform.to_dict(),
        "rank": tel.config.rank, "arch": tel.platform.arch, "timing": tel.timing, "device_frames": {}, "rows_buckets": [],
        "counts": [], "traffic": [], "decode_in_prefill": {"counts": [], "first_occurrences": []}, "latency": [],
        "decisions": [], "would_route": [], "errors": [], "guard": {"mode": tel.policy.guard.value, "rerouted": [],
        "refused": []}, "graph_captured": [], "graph_replayed": [], "graph_replayed_untimed": [],
        "decode_path": [],
        "scope": {"series": "this process", "decisions": "this process", "health": "this process"},
        "health": {
            "telemetry_errors": {s: agg.health.errors[i] for i, s in enumerate(STAGES)},
            "dropped": {r: agg.health.dropped[i] for i, r in enumerate(DROP_REASONS)},
            "last_flush_ts": tel.totals.ts or None, "flush_lag_s": None, "flush_thread": tel.running,
            "probe_failures": 0, "snapshot_failed": True,
        },
    }
