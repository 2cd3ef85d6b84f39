"""The advice inside `routescope serve`: /routing's ``advice`` section and the Prometheus gauges, off the hot path.

Both are computed from the same /routing document (telemetry's snapshot plus the service's
uptime and demo facts), when asked for: a scrape or a request, never a call being routed.
Neither ever raises: a failure becomes ``status: error`` in /routing and no advice series.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .choose import choose_tables
from .policies import DEFAULT_GATES
from .report import AdviceOut, SourceOut, advise
from .sources import SourceError, traffic_from_routing

log = logging.getLogger("routescope.advise")
EXPORTED_KINDS = ("active", "counterfactual", "gate", "guard")  # the fixes show as the decode-in-prefill cost
ESTIMATES = ("mid", "low", "high")


class AdviceSettings(BaseSettings):
    """ROUTESCOPE_ADVISE_TABLES (comma list of h200, gfx942 or files; empty: the platform's) and _GATES."""

    model_config = SettingsConfigDict(env_prefix="ROUTESCOPE_ADVISE_", extra="ignore")

    tables: str = Field("", description="latency tables, first wins; empty: the one covering the platform")
    gates: str = Field(",".join(map(str, DEFAULT_GATES)), description="gates to scan, in rows")

    def table_specs(self) -> list[str]:
        return [t.strip() for t in self.tables.split(",") if t.strip()]

    def gate_values(self) -> tuple[int, ...]:
        return tuple(sorted({int(g) for g in self.gates.split(",") if g.strip()}))


def advice_for_routing(doc: Mapping[str, Any], settings: AdviceSettings | None = None) -> dict[str, Any]:
    """The ``advice`` section for a /routing document; failures are reported in it, never raised."""
    where = "this service's traffic"
    try:
        settings = settings or AdviceSettings()
        try:
            traffic = traffic_from_routing(doc, where)
        except SourceError as exc:
            return AdviceOut(status="no_traffic", message=str(exc), source=SourceOut(kind="routing", where=where)).model_dump()
        tables, note = choose_tables(settings.table_specs(), traffic)
        return advise(traffic, tables, gates=settings.gate_values(), target_note=note).model_dump()
    except Exception as exc:  # noqa: BLE001 - /routing must answer whatever advise thinks of the traffic
        log.warning("advice failed: %s: %s", exc.__class__.__name__, exc)
        return AdviceOut(status="error", message=f"{exc.__class__.__name__}: {exc}",
                         source=SourceOut(kind="routing", where=where)).model_dump()


class CachedAdvice:
    """``advice_for_routing`` at most once per ``ttl_s`` (a scan costs tens of ms; the page polls every 2 s)."""

    def __init__(self, ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl, self._clock = ttl_s, clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._value: dict[str, Any] | None = None

    def __call__(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            if self._value is None or self._at is None or now - self._at >= self._ttl:
                self._value, self._at = advice_for_routing(doc), now
            return self._value


class Cached:
    """The last value of ``compute`` for ``ttl_s`` seconds: a page poll and a scrape in the same second share it."""

    def __init__(self, compute: Callable[[], Any], ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._compute, self._ttl, self._clock = compute, ttl_s, clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._value: Any = None

    def __call__(self) -> Any:
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self._ttl:
                self._value, self._at = self._compute(), now
            return self._value


def families(advice: Mapping[str, Any] | None) -> list[Metric]:
    """The advice's gauges; empty families when there is no figure (no table, no traffic)."""
    total = GaugeMetricFamily("routescope_advice_kernel_seconds_per_hour",
                              "Predicted kernel seconds per hour of observed traffic under each policy (not measured).",
                              labels=("model", "policy", "estimate"))
    saving = GaugeMetricFamily("routescope_advice_saving_seconds_per_hour",
                               "Predicted kernel seconds per hour each policy saves against the active one (not measured).",
                               labels=("model", "policy", "estimate"))
    dip = GaugeMetricFamily("routescope_advice_decode_in_prefill_seconds_per_hour",
                            "Predicted kernel seconds per hour the decode rows in prefill kernels cost (not measured).",
                            labels=("model", "estimate"))
    info = GaugeMetricFamily("routescope_advice_table_info", "The latency tables the advice rests on (value 1).",
                             labels=("table", "device", "arch", "date", "provenance"))
    out = [total, saving, dip, info]
    if not advice or advice.get("status") != "ok":
        return out
    for t in advice.get("tables", []):
        info.add_metric([t["name"], t["device"], t["arch"], t["date"], t["provenance"]], 1.0)
    for m in advice.get("models", []):
        for c in m["candidates"]:
            if c["kind"] not in EXPORTED_KINDS:
                continue
            for fam, band in ((total, c.get("seconds_per_hour")), (saving, c.get("saving_per_hour"))):
                if band is not None and not (fam is saving and c["kind"] == "active"):
                    for est in ESTIMATES:
                        fam.add_metric([m["model"], c["name"], est], band[est])
        cost = (m.get("decode_in_prefill") or {}).get("cost_per_hour")
        if cost is not None:
            for est in ESTIMATES:
                dip.add_metric([m["model"], est], cost[est])
    return out


class AdviceCollector:
    """Registered on the service's registry: each scrape exports the advice of that moment.

    The families are built again only when ``advice`` returns another object (a cached advice is the same object
    between its refreshes), so scrapes in between share them: read them, never change them."""

    def __init__(self, advice: Callable[[], Mapping[str, Any] | None]) -> None:
        self._advice = advice
        self._built: tuple[Any, list[Metric]] | None = None  # (the advice, its families)

    def describe(self) -> list[Metric]:
        return families(None)

    def collect(self) -> Iterator[Metric]:
        try:
            advice = self._advice()
        except Exception as exc:  # noqa: BLE001 - a scrape always answers
            log.warning("advice for /metrics failed: %s: %s", exc.__class__.__name__, exc)
            advice = None
        built = self._built
        if built is None or built[0] is not advice or advice is None:
            built = self._built = (advice, families(advice))
        yield from built[1]
