"""Prometheus, single process: a Collector that flushes at scrape and yields families built from Totals.

The latency family's series each carry the classic ``_bucket``/``_count``/``_sum`` samples and, where the flush has
native counts for them, one native sample (telemetry.native.native_histogram) first; telemetry.exposition writes it
where the format can carry it and leaves it out of the classic text formats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from .buckets import LATENCY_BOUNDS_S
from .native import native_histogram
from .spec import ALL, MetricSpec
from .view import Totals

LE = tuple(floatToGoString(b) for b in LATENCY_BOUNDS_S) + ("+Inf",)


def family(spec: MetricSpec, totals: Totals, rank: str) -> Metric:
    """One metric family from ``totals``; ``rank`` is appended where the spec has it."""
    values = getattr(totals, spec.field)
    with_rank = "rank" in spec.labels
    if spec.kind == "histogram":
        fam = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels, unit="")
        natives = getattr(totals, spec.field + "_native", {})
        for key, (counts, total) in sorted(values.items()):
            acc, cum = 0, []
            for le, c in zip(LE, counts):
                acc += c
                cum.append((le, acc))
            label_values = list(key) + [rank]
            native = natives.get(key)
            if native is not None and native.count:
                fam.samples.append(Sample(spec.name, dict(zip(spec.labels, label_values)), native.count, None, None,
                                          native_histogram(native)))
            fam.add_metric(label_values, cum, total)
        return fam
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    fam = cls(spec.base, spec.help, labels=spec.labels)
    for key, v in sorted(values.items()):
        fam.add_metric(list(key) + ([rank] if with_rank else []), v)
    return fam


class TelemetryCollector:
    """Registered in the service's registry; each scrape flushes first, so nothing waits for the thread."""

    def __init__(self, source: Callable[[], Totals], rank: str, on_error: Callable[[str], None]) -> None:
        self._source = source
        self._rank = rank
        self._on_error = on_error

    def describe(self) -> list[Metric]:
        """Names only, so registering never runs a flush (and duplicate names are still caught)."""
        return [family(spec, Totals(), self._rank) for spec in ALL]

    def collect(self) -> Iterator[Metric]:
        try:
            totals = self._source()
        except Exception:  # noqa: BLE001 - a scrape always answers
            self._on_error("export")
            totals = Totals()
        for spec in ALL:
            try:
                fam = family(spec, totals, self._rank)
            except Exception:  # noqa: BLE001
                self._on_error("export")
                continue
            yield fam


def make_registry(collector: TelemetryCollector) -> CollectorRegistry:
    """A fresh registry holding only telemetry's collector (never the process-global REGISTRY)."""
    reg = CollectorRegistry(auto_describe=True)
    reg.register(collector)
    return reg
