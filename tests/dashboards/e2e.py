"""Checks shared by the end-to-end tests: dashboard queries and alerts on a live Prometheus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dashboards.queries import PanelQuery, Values, panel_queries, variable_queries
from tests.promserver import PromServer

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
RULE_FILES = [DASHBOARDS / "recording.yml", DASHBOARDS / "alerts.yml"]

# Panels whose fallback-free query must return real series when one instance misroutes.
DECODE_PANELS = ("Decode-in-prefill calls/s by model", "Decode rows in prefill kernels, rows/s by model")
# The advice row: data where a latency table prices the traffic (docs/advise.md; the CPU demo: the H200's).
ADVICE_PANELS = tuple(dict.fromkeys(q.panel for q in panel_queries() if q.panel.startswith("Advice")))


def _has_data(result: dict[str, Any]) -> bool:
    """At least one sample with a number: a histogram_quantile over no calls is all NaN."""
    samples = [s["value"][1] for s in result.get("result", [])] if result.get("resultType") == "vector" else []
    return any(v.lower() != "nan" for v in samples)


def missing_panel_data(prom: PromServer, *, strict_panels: tuple[str, ...] = DECODE_PANELS,
                       values: Values | None = None) -> list[str]:
    """Queries that return no data now: any panel query, and the core (without fallback) of strict panels; with
    ``values``, the dashboard's variables set to them (Grafana's substitution), else all at "All"."""
    missing = []
    for q in panel_queries(values):
        if not _has_data(prom.query(q.expr)):
            missing.append(f"[{q.panel} / {q.ref_id}] {q.expr}")
        elif q.panel in strict_panels and q.has_fallback and not _has_data(prom.query(q.core)):
            missing.append(f"[{q.panel} / {q.ref_id}] (without fallback) {q.core}")
    return missing


FLEET_VARIABLES = ("cluster", "node")  # labels a fleet's agents add: values only on a fleet's store


def missing_variable_values(prom: PromServer, *, fleet: bool = False, values: Values | None = None) -> list[str]:
    """Variables whose label_values() query has no value; ``cluster`` and ``node`` only count on a fleet's store."""
    return [f"${name}: label_values({sel}, {label})" for name, sel, label in variable_queries(values)
            if (fleet or name not in FLEET_VARIABLES) and not prom.label_values(label, sel)]


def wait_panels_have_data(prom: PromServer, timeout: float, *, fleet: bool = False,
                          values: Values | None = None, strict_panels: tuple[str, ...] = DECODE_PANELS,
                          ) -> list[PanelQuery]:
    """Wait until every panel query (and every variable) returns data; fail listing the rest."""
    last: list[str] = []

    def probe() -> bool:
        nonlocal last
        last = (missing_panel_data(prom, values=values, strict_panels=strict_panels)
                + missing_variable_values(prom, fleet=fleet, values=values))
        return not last

    try:
        prom.wait_for(probe, timeout=timeout, interval=1.0, what="all panel queries return data")
    except TimeoutError:
        raise AssertionError("panel queries without data after %ss:\n  %s" % (timeout, "\n  ".join(last))) from None
    return panel_queries(values)


def decode_in_prefill(prom: PromServer, instance: str) -> list[dict[str, Any]]:
    return [a for a in prom.alerts()
            if a["labels"].get("alertname") == "DecodeInPrefill" and a["labels"].get("instance") == instance]


def wait_decode_in_prefill(prom: PromServer, instance: str, *, states: tuple[str, ...], timeout: float) -> dict[str, Any]:
    """Wait until DecodeInPrefill for `instance` is in one of `states`; return that alert."""
    def probe() -> dict[str, Any] | None:
        return next((a for a in decode_in_prefill(prom, instance) if a["state"] in states), None)

    try:
        return prom.wait_for(probe, timeout=timeout, interval=0.5, what=f"DecodeInPrefill {states} for {instance}")
    except TimeoutError:
        raise AssertionError(
            f"DecodeInPrefill not {states} for {instance} within {timeout}s; alerts: {prom.alerts()}"
        ) from None
