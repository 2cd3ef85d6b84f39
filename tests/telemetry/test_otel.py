"""OpenTelemetry: the in-memory export agrees with the Prometheus scrape; exponential buckets in seconds at the native
histogram's scale; spans carry decisions."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from telemetry import TelemetryConfig
from telemetry.bench.workload import make_calls
from telemetry.native import SCHEMA
from telemetry.spec import COUNTERS, GAUGES, HISTOGRAM

from .conftest import dispatcher, scrape


def otel_points(reader: InMemoryMetricReader) -> dict[str, list]:
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def prom_by_labels(samples: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def test_otel_agrees_with_prometheus(make_tel):
    reader = InMemoryMetricReader()
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4"), otel=True), otel_readers=[reader])
    d = tel.instrument(dispatcher())
    for args, kw in make_calls(3000):
        d(*args, **kw)
    tel.record_decode_path(3, "glm")
    tel.flush()
    points = otel_points(reader)
    prom = scrape(tel.registry)
    for spec in COUNTERS + GAUGES:
        got = {frozenset((k, str(v)) for k, v in p.attributes.items()): p.value for p in points.get(spec.base, [])}
        want = prom_by_labels(prom, spec.name)
        if spec.name == "routescope_telemetry_last_flush_timestamp_seconds":
            assert set(got) == set(want)
            continue
        assert got == want, spec.name
    hist = points[HISTOGRAM.base]
    assert hist, "no histogram points"
    native = tel.totals.latency_native
    for p in hist:
        labels = frozenset((k, str(v)) for k, v in p.attributes.items())
        assert p.count == prom[("routescope_call_duration_seconds_count", labels)]
        assert p.sum == pytest.approx(prom[("routescope_call_duration_seconds_sum", labels)], rel=1e-9, abs=1e-12)
        # exponential buckets at the native histogram's scale: OTel's bucket i is Prometheus' bucket i + 1
        assert p.scale == SCHEMA
        key = tuple(p.attributes[k] for k in ("kernel", "rows_bucket", "model", "clock"))
        got = {p.positive.offset + i + 1: n for i, n in enumerate(p.positive.bucket_counts) if n}
        assert got == {i: n for i, n in native[key].buckets.items() if n}
        assert p.zero_count == native[key].zero
    assert sum(p.count for p in hist) > 0


def test_sampled_spans_carry_the_decision(make_tel):
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4"), otel=True, otel_span_every=1),
                   otel_readers=[InMemoryMetricReader()], tracer_provider=tp)
    d = tel.instrument(dispatcher())
    for args, kw in make_calls(40):
        d(*args, **kw)
    tel.flush()
    spans = exporter.get_finished_spans()
    assert len(spans) == 40  # all sampled: fewer calls per slot than sample_first
    s = spans[0]
    assert s.name == "routescope.sparse_attn_prefill"
    assert {"kernel", "rows_bucket", "model", "reason_code", "reason", "call_class"} <= set(s.attributes)
    assert s.end_time >= s.start_time
