"""GET /routing: telemetry's snapshot plus what only the service knows (demo, uptime), as typed models.

``routing_view`` is pure (snapshot and facts in, dict out) so it is tested without a server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from advise.report import AdviceOut
from advise.service import advice_for_routing
from dispatcher.types import PREFILL_KERNELS

from .experiment_control import experiments_of
from .experiment_models import ExperimentOut
from .models import HealthProblem, PlatformOut, PolicyOut
from .settings import ServiceSettings

_PREFILL = frozenset(k.value for k in PREFILL_KERNELS)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class CountRow(_Open):
    kernel: str
    impl: str
    rows_bucket: str
    model: str
    call_class: str
    calls: int
    rows: int


class NativeBucketsOut(BaseModel):
    """A series' native histogram: bucket ``i`` holds (base**(i-1), base**i] seconds, base = 2**2**-schema."""

    schema_: int = Field(alias="schema")
    zero: int = Field(description="samples at or under the zero threshold")
    buckets: list[tuple[int, int]] = Field(description="[index, count] for every non-empty bucket, by index")


class LatencyRow(_Open):
    """Quantiles from the call-duration histogram, linear within a bucket as histogram_quantile: its native buckets
    (4.4% wide, ``buckets: native``) where every sample is in them, else the classic ones (``buckets: classic``)."""

    kernel: str
    rows_bucket: str
    model: str
    samples: int
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    buckets: str | None = None
    native: NativeBucketsOut | None = Field(None, description="the distribution itself, where ``buckets`` is native")


class DecisionRow(_Open):
    ts: float
    kernel: str
    reason: str
    reason_code: str
    rows: int
    model: str
    call_class: str
    decode_rows: int


class DipRow(_Open):
    kernel: str
    model: str
    call_class: str
    calls: int
    rows: int


class DipModel(BaseModel):
    """Per model: decode-entry calls beside decode-in-prefill calls, so the latter reads as a share."""

    model: str
    calls: int
    decode_rows: int
    decode_path_calls: int
    share_of_decode_calls: float | None = Field(None, description="dip calls / (dip calls + decode-entry calls)")


class DecodeInPrefillOut(_Open):
    calls: int = Field(0, description="calls with decode rows that a prefill kernel (no split-K) ran")
    rows: int = Field(0, description="decode rows in those calls")
    by_model: list[DipModel] = []
    counts: list[DipRow] = []
    first_occurrences: list[dict[str, Any]] = []


class WouldRouteRow(_Open):
    """Where a counterfactual policy would have sent these calls (decided, never launched)."""

    policy: str
    kernel: str
    rows_bucket: str
    model: str
    calls: int
    decode_in_prefill_calls: int | None = Field(
        0, description="of these, calls with decode rows the policy would send to a prefill kernel; "
                       "null when the rows are merged from every process (it is never exported)")


class CounterfactualOut(PolicyOut):
    platform: str = Field(description='where it is decided: "what-if gfx942", or the arch the calls ran on')


class ErrorRow(_Open):
    kernel: str
    exception: str
    model: str
    calls: int


class DecodePathRow(_Open):
    model: str
    calls: int
    rows: int


class TelemetryHealth(_Open):
    telemetry_errors: dict[str, int] = {}
    dropped: dict[str, int] = {}
    last_flush_ts: float | None = None
    flush_lag_s: float | None = None
    probe_failures: int = 0
    problems: list[HealthProblem] = Field([], description="multiprocess directory: conditions now, then the files "
                                                          "skipped and quarantined (most recent 32), with why")


class DemoShape(_Open):
    model: str
    heads: int
    nope_head_dim: int
    rope_head_dim: int
    topk: int
    kv_pool: int
    factor: float = Field(description="real per-row work / demo per-row work")
    description: str


class DemoWarmUp(_Open):
    calls: int = Field(description="uncounted calls made before the traffic, so that kernels compile first")
    failed: int
    seconds: float | None = Field(None, description="how long the warm-up took; null while it runs")


class DemoOut(_Open):
    """The embedded workload: how it is scaled, and its own call counters (to compare with telemetry's)."""

    running: bool
    state: str = Field(description="not started, warming up, running, finished (call limit reached), stopped, "
                                   "failed")
    limit: int | None = None
    glm_bug: bool
    device: str
    scaled: bool
    scale_factor: float
    shapes: list[DemoShape]
    scenarios: dict[str, str] = {}
    prefill_calls: int
    prefill_rows: int
    decode_path_calls: int
    refused: int
    errors: int
    last_error: str | None = None
    warm_up: DemoWarmUp | None = Field(None, description="null when the demo does not warm up (on a CPU, by default)")


class ScopeOut(BaseModel):
    """Whose data each part is: in multiprocess mode the series are every process's."""

    series: str = Field(description='"every process" (multiprocess directory) or "this process": counts, '
                                    'decode_in_prefill counts, latency, would_route, errors, guard, decode_path')
    decisions: str = Field(description="decisions and first decode-in-prefill occurrences: always this process's")
    health: str = Field(description="telemetry health: always this process's")


class ServiceInfo(BaseModel):
    version: str
    ts: float
    started_ts: float
    uptime_s: float
    rank: str
    models: list[str] = Field(description="the bounded model label set; anything else is `other`")
    refresh_s: float = Field(2.0, description="how often the page polls this endpoint")


class RateOut(BaseModel):
    ts: float = Field(description="the later flush's wall time")
    dt_s: float
    calls_per_s: float = Field(description="prefill-entry calls per second between two flushes")
    decode_in_prefill_per_s: float


class HistoryOut(BaseModel):
    """Rates between the flushes of the last ``span_s`` seconds that /routing was built on (service/history.py)."""

    span_s: float
    rates: list[RateOut]


class RoutingOut(_Open):
    """Everything the page shows, and what a script needs to read routing without PromQL."""

    service: ServiceInfo
    platform: PlatformOut
    policy: PolicyOut
    counterfactuals: list[CounterfactualOut] = Field(description="what-if policies; their counts are never launches")
    counterfactual_platform: PlatformOut | None = Field(
        None, description="the platform counterfactuals are decided on: this one, or a what-if arch (what_if true)")
    rows_buckets: list[str] = Field(description="every rows bucket label, in order")
    counts: list[CountRow]
    decode_in_prefill: DecodeInPrefillOut
    latency: list[LatencyRow]
    decisions: list[DecisionRow] = Field(description="most recent first")
    would_route: list[WouldRouteRow]
    errors: list[ErrorRow]
    decode_path: list[DecodePathRow] = []
    health: TelemetryHealth
    scope: ScopeOut | None = None
    demo: DemoOut | None = None
    advice: AdviceOut | None = Field(
        None, description="what a gate change would cost or save on this traffic: predicted from a latency table, "
                          "never measured (routescope advise; docs/advise.md)")
    experiments: list[ExperimentOut] = Field(
        [], description="the experiments measuring a candidate on this traffic: `GET /experiments`'s list")
    history: HistoryOut | None = Field(None, description="calls and decode-in-prefill calls per second, flush to flush")


def _dip_summary(snapshot: dict) -> dict:
    dip = snapshot.get("decode_in_prefill") or {}
    counts = [r for r in dip.get("counts", []) if r.get("kernel") in _PREFILL]
    decode_path = {r["model"]: r.get("calls", 0) for r in snapshot.get("decode_path", [])}
    per: dict[str, list[int]] = {}
    for r in counts:
        acc = per.setdefault(r["model"], [0, 0])
        acc[0] += r.get("calls", 0)
        acc[1] += r.get("rows", 0)
    by_model = []
    for model in sorted(set(per) | set(decode_path)):
        calls, rows = per.get(model, (0, 0))
        dp = decode_path.get(model, 0)
        share = calls / (calls + dp) if calls + dp else None
        by_model.append({"model": model, "calls": calls, "decode_rows": rows, "decode_path_calls": dp,
                         "share_of_decode_calls": share})
    return {
        **dip,
        "calls": sum(r["calls"] for r in by_model),
        "rows": sum(r["decode_rows"] for r in by_model),
        "by_model": by_model,
    }


def routing_view(
    snapshot: dict,
    *,
    demo: dict | None,
    settings: ServiceSettings,
    started_ts: float,
    version: str = "",
    now: float | None = None,
    problems: list[dict] | None = None,
    advice: Callable[[dict], dict] = advice_for_routing,
    experiments: list[dict] | None = None,
) -> dict:
    """Telemetry's snapshot, trimmed (last N decisions, newest first) and joined with service facts."""
    now = time.time() if now is None else now
    if not version:
        from routescope import __version__ as version
    out = dict(snapshot)
    decisions = list(snapshot.get("decisions", []))[-settings.decisions:]
    decisions.reverse()
    out["decisions"] = decisions
    out["decode_in_prefill"] = _dip_summary(snapshot)
    out["service"] = {
        "version": version,
        "ts": now,
        "started_ts": started_ts,
        "uptime_s": max(0.0, now - started_ts),
        "rank": str(snapshot.get("rank", settings.rank)),
        "models": settings.model_set(),
        "refresh_s": 2.0,
    }
    out["demo"] = demo
    out["advice"] = advice(out)
    out["experiments"] = list(experiments or ())
    if problems is not None:
        out["health"] = {**snapshot.get("health", {}), "problems": problems}
    return out


def routing_of(state: Any) -> dict:
    """/routing's document for a ServiceState: what the endpoint answers and the advice gauges read."""
    doc = routing_view(
        state.telemetry.snapshot(),
        demo=state.demo.info() if state.demo is not None else None,
        settings=state.settings,
        started_ts=state.started_ts,
        problems=state.telemetry.health_problems(),
        advice=state.advice,
        experiments=experiments_of(state.experiments),
    )
    history = getattr(state, "history", None)
    if history is not None:
        calls = sum(r.get("calls", 0) for r in doc.get("counts", []))
        history.record((doc.get("health") or {}).get("last_flush_ts"), calls, doc["decode_in_prefill"]["calls"])
        doc["history"] = history.document()
    return doc
