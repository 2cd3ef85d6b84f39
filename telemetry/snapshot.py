"""Telemetry.snapshot(): the totals as plain JSON-ready dicts for /routing and people."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .buckets import quantile
from .spec import DROP_REASONS, STAGES
from .view import Totals

if TYPE_CHECKING:
    from .core import Telemetry


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


def _where_decided(tel: Telemetry) -> str:
    """Where counterfactuals are decided, for people: "what-if gfx942", or the real platform's arch."""
    arch = tel.config.counterfactual_arch
    return f"what-if {arch}" if arch else tel.platform.arch


def _latency(t: Totals) -> list[dict[str, Any]]:
    out = []
    for (k, b, m), (counts, total) in sorted(t.latency.items()):
        n = sum(counts)
        out.append({
            "kernel": k, "rows_bucket": b, "model": m, "samples": n, "sum_s": total,
            "mean_s": total / n if n else None,
            "p50_s": quantile(counts, 0.5), "p90_s": quantile(counts, 0.9), "p99_s": quantile(counts, 0.99),
        })
    return out


def _decisions(tel: Telemetry) -> list[dict[str, Any]]:
    dq = tel._decisions
    if dq is None:
        return []
    info = tel._agg.info
    off = tel._wall_offset_ns
    out = []
    for t_ns, s, rows, d in list(dq):
        inf = info[s]
        out.append({
            "ts": (t_ns + off) / 1e9, "kernel": inf.kernel, "reason": inf.decision.reason,
            "reason_code": inf.reason, "rows": rows, "rows_bucket": inf.bucket, "model": inf.model,
            "call_class": inf.call_class, "decode_rows": d,
        })
    return out


def build_snapshot(tel: Telemetry, own: Totals, *, merged: Totals | None = None) -> dict[str, Any]:
    """Keys: platform, policy, counterfactuals, counterfactual_platform, counts, decode_in_prefill, latency, decisions,
    would_route, errors, guard, graph_captured, decode_path, health, scope (plus rank, arch, timing, rows_buckets).

    The series come from ``merged`` (every process's, multiprocess mode) when given, else from
    ``own``; decisions, first occurrences and health are always this process's.
    """
    agg = tel._agg
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
        "rows_buckets": list(agg.buckets.labels),
        "counts": _counts(t),
        "decode_in_prefill": {"counts": dip, "first_occurrences": [dict(r) for r in agg.first_dip]},
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
        "decode_path": [
            {"model": m, "calls": n, "rows": t.decode_path_rows.get((m,), 0)} for (m,), n in sorted(t.decode_path_calls.items())
        ],
        "scope": {"series": "every process" if merged is not None else "this process", "decisions": "this process",
                  "health": "this process"},
        "health": {
            "telemetry_errors": {k[0]: v for k, v in own.telemetry_errors.items()},
            "dropped": {k[0]: v for k, v in own.dropped.items()},
            "last_flush_ts": own.ts or None,
            "flush_lag_s": (now - tel._bg_flush_ts) if tel._bg_flush_ts else None,
            "flush_thread": tel.running,
            "probe_failures": tel.probe_failures,
            "slots": agg.n_slots,
            "max_slots": agg.max_slots,
            "multiprocess_dir": tel._mp_path,
        },
    }


def empty_snapshot(tel: Telemetry) -> dict[str, Any]:
    """Every key, no data: what snapshot() returns if building the real one failed (health still says why)."""
    agg = tel._agg
    return {
        "platform": tel.platform.to_dict(), "policy": tel.policy.to_dict(), "counterfactuals": [],
        "counterfactual_platform": tel.counterfactual_platform.to_dict(),
        "rank": tel.config.rank, "arch": tel.platform.arch, "timing": tel.timing, "rows_buckets": [],
        "counts": [], "decode_in_prefill": {"counts": [], "first_occurrences": []}, "latency": [],
        "decisions": [], "would_route": [], "errors": [], "guard": {"mode": tel.policy.guard.value, "rerouted": [],
        "refused": []}, "graph_captured": [], "decode_path": [],
        "scope": {"series": "this process", "decisions": "this process", "health": "this process"},
        "health": {
            "telemetry_errors": {s: agg.errs[i] for i, s in enumerate(STAGES)},
            "dropped": {r: agg.dropped[i] for i, r in enumerate(DROP_REASONS)},
            "last_flush_ts": tel.totals.ts or None, "flush_lag_s": None, "flush_thread": tel.running,
            "probe_failures": 0, "snapshot_failed": True,
        },
    }
