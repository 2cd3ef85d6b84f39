"""The `routescope_experiment_*` series: each scrape turns `GET /experiments`'s list into metric families.

The list is already merged across processes by the experiments package, so the service exports one
series per experiment and cell, and no `rank` label. Counters are the experiment's own counts since
it started; a ratio, band or saving with no value yet (too few timed calls) has no sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from .experiment_models import STATES

log = logging.getLogger("routescope.service")
CELL_LABELS = ("experiment", "model", "rows_bucket", "shape", "call_class")
ESTIMATES = (("mid", "ratio"), ("low", "ratio_low"), ("high", "ratio_high"))
SAVINGS = (("mid", "seconds"), ("low", "low"), ("high", "high"))
ARMS = ("a", "b")


def _label(value: Any) -> str:
    return "" if value is None else str(value)


def cell_key(experiment_id: str, cell: Mapping[str, Any]) -> tuple[str, ...]:
    """A cell's labels: model, rows bucket, the call's shape (heads, dims, top-k, dtypes) and call class."""
    return (experiment_id, _label(cell.get("model")), _label(cell.get("rows_bucket")), _label(cell.get("shape")),
            _label(cell.get("call_class")))


def never_moved(experiment: Mapping[str, Any]) -> dict[str, int]:
    """Calls the experiment never moves to B, by reason (experiments.NotMoved: capture, candidate_unavailable, ...)."""
    raw = experiment.get("never_moved") or {}
    if isinstance(raw, Mapping):
        return {str(k): int(v) for k, v in raw.items()}
    return {str(r["reason"]): int(r["calls"]) for r in raw}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def families(experiments: Sequence[Mapping[str, Any]]) -> list[Metric]:
    """Every experiment series for ``experiments`` (the contract's list); empty families for an empty list."""
    state = GaugeMetricFamily("routescope_experiment_state", "1 for each experiment's current state: running, "
                              "stopped (stop_reason says why; user: a person) or finished.",
                              labels=("experiment", "candidate", "state", "stop_reason"))
    fraction = GaugeMetricFamily("routescope_experiment_fraction", "Probability that an eligible call goes to arm B.",
                                 labels=("experiment", "candidate"))
    calls = CounterMetricFamily("routescope_experiment_calls", "Calls of the experiment's cells run on each arm.",
                                labels=(*CELL_LABELS, "arm", "kernel"))
    timed = CounterMetricFamily("routescope_experiment_timed_calls", "Of those, the calls timed by the production "
                                "clock (every B call, an equal sample of A).", labels=(*CELL_LABELS, "arm", "kernel"))
    ratio = GaugeMetricFamily("routescope_experiment_time_ratio", "Mean kernel time of B / mean of A per cell "
                              "(estimate=mid), with its anytime-valid 95% band (low, high).",
                              labels=(*CELL_LABELS, "estimate"))
    saving = GaugeMetricFamily("routescope_experiment_saving_seconds", "Kernel seconds B would have saved over the "
                               "observed traffic (negative: cost), estimate=mid, with its band (low, high).",
                               labels=("experiment", "estimate"))
    unmoved = CounterMetricFamily("routescope_experiment_never_moved_calls", "Calls the experiment never moves to B, "
                                  "by reason.", labels=("experiment", "reason"))
    acked = GaugeMetricFamily("routescope_experiment_acknowledged_timestamp_seconds", "When a person acknowledged a "
                              "stopped experiment's stop (routescope experiment ack); no sample until then. "
                              "RoutescopeExperimentStopped fires until it appears.", labels=("experiment", "candidate"))
    out = [state, fraction, calls, timed, ratio, saving, unmoved, acked]
    seen: set[tuple[str, ...]] = set()
    for e in experiments:
        eid, candidate = str(e["id"]), str(e.get("candidate", ""))
        st = str(e.get("state", ""))
        reason = _label(e.get("stop_reason")) if st == "stopped" else ""
        state.add_metric([eid, candidate, st if st in STATES else "unknown", reason], 1.0)
        if (f := _number(e.get("fraction"))) is not None:
            fraction.add_metric([eid, candidate], f)
        for cell in e.get("cells") or ():
            key = cell_key(eid, cell)
            if key in seen:  # two cells that differ in nothing exported: keep the first, say so
                log.warning("experiment %s: cell %s repeated; its second entry is not exported", eid, key[1:])
                continue
            seen.add(key)
            for arm in ARMS:
                kernel = _label(cell.get(f"kernel_{arm}"))
                calls.add_metric([*key, arm, kernel], float(cell.get(f"calls_{arm}") or 0))
                timed.add_metric([*key, arm, kernel], float(cell.get(f"timed_{arm}") or 0))
            for estimate, field in ESTIMATES:
                if (v := _number(cell.get(field))) is not None:
                    ratio.add_metric([*key, estimate], v)
        for estimate, field in SAVINGS:
            if (v := _number((e.get("saving") or {}).get(field))) is not None:
                saving.add_metric([eid, estimate], v)
        for why, n in sorted(never_moved(e).items()):
            unmoved.add_metric([eid, why], float(n))
        ack = e.get("acknowledged")
        if st == "stopped" and isinstance(ack, Mapping) and (at := _number(ack.get("at"))) is not None:
            acked.add_metric([eid, candidate], at)
    return out


class ExperimentCollector:
    """Registered on the service's registry: each scrape exports the experiments of that moment."""

    def __init__(self, experiments: Callable[[], Sequence[Mapping[str, Any]]]) -> None:
        self._experiments = experiments

    def describe(self) -> list[Metric]:
        return families(())

    def collect(self) -> Iterator[Metric]:
        try:
            experiments = self._experiments()
        except Exception as exc:  # noqa: BLE001 - a scrape always answers
            log.warning("experiments for /metrics failed: %s: %s", exc.__class__.__name__, exc)
            experiments = ()
        try:
            yield from families(experiments)
        except Exception as exc:  # noqa: BLE001 - a malformed experiment costs its series, never the scrape
            log.warning("experiment series failed: %s: %s", exc.__class__.__name__, exc)
            yield from families(())
