"""OpenTelemetry: the same totals as observable instruments, sampled latencies as a histogram in seconds.

Counters are observable (their callbacks read the last flush), so nothing is recorded per
call; latencies are recorded at flush from the sampled-call buffer, in seconds, into the SDK's
exponential (base-2) bucket histogram capped at scale ``SCHEMA`` (4: buckets 4.4% wide, as the
Prometheus native histogram's), so a quantile read from the export is within that of the samples.
Spans, when asked for, are built at flush from sampled calls with their real start and end times.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from .native import SCHEMA
from .slots import SlotInfo
from .spec import COUNTERS, GAUGES, HISTOGRAM, MetricSpec
from .view import Totals

log = logging.getLogger("routescope.telemetry")

# Buckets per sign before the SDK lowers the scale: at scale 4 (16 a factor of 2) 320 cover a 2^20 spread of one
# series' latencies (1 µs to 1 s) without leaving 4.4% buckets.
EXPONENTIAL_MAX_SIZE = 320


def otlp_metric_reader() -> MetricReader | None:
    """A periodic OTLP/HTTP reader configured by OTEL_* variables, if the exporter package is installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        log.warning("OTLP requested but opentelemetry-exporter-otlp-proto-http is not installed")
        return None
    return PeriodicExportingMetricReader(OTLPMetricExporter())


def otlp_tracer_provider() -> Any | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return None
    tp = TracerProvider(resource=Resource.create({"service.name": "routescope"}))
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return tp


class OtelExporter:
    """Owns a MeterProvider (and optionally uses a TracerProvider); fed by Telemetry.flush."""

    def __init__(
        self,
        *,
        totals: Callable[[], Totals],
        rank: str,
        readers: Sequence[MetricReader] = (),
        otlp: bool = False,
        tracer_provider: Any | None = None,
        span_every: int = 0,
        on_error: Callable[[str], None] = lambda stage: None,
    ) -> None:
        self._totals = totals
        self._rank = rank
        self._on_error = on_error
        readers = list(readers)
        if otlp:
            r = otlp_metric_reader()
            if r is not None:
                readers.append(r)
            if tracer_provider is None and span_every:
                tracer_provider = otlp_tracer_provider()
        view = View(instrument_name=HISTOGRAM.base,
                    aggregation=ExponentialBucketHistogramAggregation(max_size=EXPONENTIAL_MAX_SIZE, max_scale=SCHEMA))
        self.provider = MeterProvider(
            metric_readers=readers, views=[view], shutdown_on_exit=False,
            resource=Resource.create({"service.name": "routescope"}),
        )
        meter = self.provider.get_meter("routescope.telemetry")
        for spec in COUNTERS:
            meter.create_observable_counter(spec.base, callbacks=[self._callback(spec)], description=spec.help)
        for spec in GAUGES:
            meter.create_observable_gauge(spec.base, callbacks=[self._callback(spec)], description=spec.help)
        self._hist = meter.create_histogram(HISTOGRAM.base, unit="s", description=HISTOGRAM.help)
        self._tracer = tracer_provider.get_tracer("routescope.telemetry") if tracer_provider and span_every else None
        self._span_every = span_every
        self._span_n = 0
        self._attrs: dict[tuple, dict[str, str]] = {}

    def _callback(self, spec: MetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        names = spec.labels
        with_rank = "rank" in names

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            try:
                values = getattr(self._totals(), spec.field)
                out = []
                for key, v in values.items():
                    lv = key + ((self._rank,) if with_rank else ())
                    out.append(Observation(v, dict(zip(names, lv))))
                return out
            except Exception:  # noqa: BLE001 - an exporter never raises into the SDK's collection
                self._on_error("otel")
                return []

        return observe

    def feed(self, samples: deque, info: list[SlotInfo]) -> None:
        """Record every sampled latency queued since the last flush (and a span for one in N)."""
        rank = self._rank
        for _ in range(len(samples)):
            s, clock, dt_ns, wall_ns = samples.popleft()
            attrs = self._attrs.get((s, clock))
            inf = info[s]
            if attrs is None:
                attrs = self._attrs[(s, clock)] = {"kernel": inf.kernel, "rows_bucket": inf.bucket,
                                                   "model": inf.model, "clock": clock.value, "rank": rank}
            self._hist.record(dt_ns / 1e9, attrs)
            if self._tracer is not None:
                self._span_n += 1
                if self._span_n % self._span_every == 0:
                    self._span(inf, attrs, dt_ns, wall_ns)

    def _span(self, inf: SlotInfo, attrs: dict[str, str], dt_ns: int, wall_ns: int) -> None:
        span = self._tracer.start_span(  # type: ignore[union-attr]
            "routescope.sparse_attn_prefill", start_time=wall_ns,
            attributes={**attrs, "call_class": inf.call_class, "reason_code": inf.reason,
                        "reason": inf.decision.reason, "decode_in_prefill": inf.decode_in_prefill},
        )
        span.end(end_time=wall_ns + dt_ns)

    def shutdown(self) -> None:
        self.provider.shutdown()
