"""telemetry.exposition: which format each Accept header gets, and that each carries the same series.

The protobuf stream is read back with the generated ``metrics_pb2`` classes; the real Prometheus reading it is
tests/dashboards/test_native_e2e.py.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar, Sample

from telemetry import TelemetryConfig
from telemetry.bench.workload import make_calls
from telemetry.exposition import PROTOBUF_CONTENT_TYPE, negotiate, wants_protobuf
from telemetry.exposition import metrics_pb2 as pb
from telemetry.exposition.protobuf import decode_delimited, encode_families, family_message
from telemetry.native import SCHEMA, NativeCounts, counts_from_native, from_spans, native_histogram

from .conftest import dispatcher

PROMETHEUS_242_NATIVE = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                         "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;"
                         "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_CLASSIC = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                      "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
HIST = "routescope_call_duration_seconds"


@pytest.mark.parametrize(("accept", "protobuf"), [
    (PROMETHEUS_242_NATIVE, True),
    (PROMETHEUS_CLASSIC, False),
    ("", False),
    (None, False),
    ("*/*", False),
    ("text/plain;q=0.9," + PROTOBUF_CONTENT_TYPE.replace(" ", ""), True),  # q decides, not order
    ("text/plain," + PROTOBUF_CONTENT_TYPE + ";q=0.5", False),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text", False),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0", False),
])
def test_negotiation(accept, protobuf):
    assert wants_protobuf(accept) is protobuf
    _encoder, content_type = negotiate(accept)
    assert (content_type == PROTOBUF_CONTENT_TYPE) is protobuf


@pytest.fixture
def busy(make_tel):
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4"), timing="host", sample_every=1))
    d = tel.instrument(dispatcher())
    for args, kw in make_calls(300):
        d(*args, **kw)
    tel.flush()
    return tel


def _text_series(body: bytes) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_text_formats_carry_the_classic_series_only(busy):
    encoder, content_type = negotiate(PROMETHEUS_CLASSIC)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    om1 = encoder(busy.registry)
    text_encoder, _ = negotiate("text/plain")
    text = text_encoder(busy.registry)
    series = _text_series(text)
    names = {name for name, _labels in series}
    assert HIST + "_bucket" in names and HIST not in names
    assert b"schema:" not in om1 and b"schema:" not in text
    hist_families = [f for f in text_string_to_metric_families(text.decode()) if f.name == HIST]
    assert len(hist_families) == 1 and hist_families[0].type == "histogram"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_negotiated_text_passes_promtool(busy):
    encoder, _ = negotiate("text/plain")
    res = subprocess.run([shutil.which("promtool"), "check", "metrics"], input=encoder(busy.registry),
                         capture_output=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res


def test_openmetrics_2_carries_native_beside_classic(busy):
    encoder, content_type = negotiate("application/openmetrics-text;version=2.0.0")
    assert "version=2.0.0" in content_type
    body = encoder(busy.registry).decode()
    native_lines = [line for line in body.splitlines() if line.startswith(HIST + "{")]
    bucket_lines = [line for line in body.splitlines() if line.startswith(HIST + "_bucket{")]
    assert native_lines and bucket_lines
    assert all(f"schema:{SCHEMA}," in line for line in native_lines)
    assert len(bucket_lines) == 26 * len(native_lines)


def test_protobuf_carries_every_family_and_the_native_buckets(busy):
    encoder, content_type = negotiate(PROMETHEUS_242_NATIVE)
    assert content_type == PROTOBUF_CONTENT_TYPE
    families = {f.name: f for f in decode_delimited(encoder(busy.registry))}
    text = _text_series(negotiate("text/plain")[0](busy.registry))
    text_names = {name for name, _ in text}
    # every text family is there under its text name (counters with _total), and the counter values agree
    assert {n for n in text_names if not n.startswith(HIST)} <= set(families)
    calls = families["routescope_calls_total"]
    assert calls.type == pb.COUNTER
    proto_calls = {frozenset((lp.name, lp.value) for lp in m.label): m.counter.value for m in calls.metric}
    assert proto_calls == {labels: v for (name, labels), v in text.items() if name == "routescope_calls_total"}
    hist = families[HIST]
    assert hist.type == pb.HISTOGRAM and hist.metric
    totals = busy.totals
    for metric in hist.metric:
        labels = {lp.name: lp.value for lp in metric.label}
        key = tuple(labels[k] for k in ("kernel", "rows_bucket", "model", "clock"))
        h = metric.histogram
        assert h.schema == SCHEMA and h.zero_threshold > 0
        back = NativeCounts()
        back.count, back.zero, back.sum_ns = h.sample_count, h.zero_count, round(h.sample_sum * 1e9)
        back.buckets = dict(from_spans([(s.offset, s.length) for s in h.positive_span], h.positive_delta))
        assert back == totals.latency_native[key]
        classic_counts, _sum = totals.latency[key]
        assert [b.cumulative_count for b in h.bucket][-1] == sum(classic_counts[:-1])  # +Inf is the count
        assert h.sample_count == sum(classic_counts)


def test_an_empty_native_histogram_stays_native():
    """A series with no samples yet gets the no-op span, so a reader cannot take it for a classic histogram."""
    fam = HistogramMetricFamily(HIST, "h", labels=("a",))
    fam.samples.append(Sample(HIST, {"a": "x"}, 0, None, None, native_histogram(NativeCounts())))
    fam.add_metric(["x"], [("+Inf", 0)], 0)
    message = family_message(fam)
    h = message.metric[0].histogram
    assert [(s.offset, s.length) for s in h.positive_span] == [(0, 0)]
    assert counts_from_native(native_histogram(NativeCounts())) == NativeCounts()


def test_every_family_type_encodes():
    """Each prometheus_client family type becomes the MetricFamily type Prometheus expects, values intact."""
    counter = CounterMetricFamily("c", "c help", labels=("a",))
    counter.add_metric(["x"], 3.0, created=1700000000.0)
    gauge = GaugeMetricFamily("g", "g help", value=2.5)
    info = InfoMetricFamily("i", "i help", value={"version": "1"})
    stateset = StateSetMetricFamily("s", "s help", value={"on": True, "off": False})
    unknown = UnknownMetricFamily("u", "u help", value=7.0)
    summary = SummaryMetricFamily("sm", "sm help", count_value=4, sum_value=1.5)
    gh = GaugeHistogramMetricFamily("gh", "gh help", buckets=[("0.5", 1), ("+Inf", 3)], gsum_value=2.0)
    hist_ex = Exemplar({"trace": "t1"}, 0.25, 1700000000.5)
    hist = HistogramMetricFamily("h", "h help", buckets=[("0.5", 1, hist_ex), ("+Inf", 2)], sum_value=1.25)
    got = {f.name: f for f in decode_delimited(encode_families([counter, gauge, info, stateset, unknown, summary, gh,
                                                                hist]))}
    assert got["c_total"].type == pb.COUNTER and got["c_total"].metric[0].counter.value == 3.0
    assert len(got["c_total"].metric) == 1  # the _created sample is not a series of its own
    assert got["g"].metric[0].gauge.value == 2.5
    assert got["i_info"].type == pb.GAUGE and {(lp.name, lp.value) for lp in got["i_info"].metric[0].label} == {
        ("version", "1")}
    assert sorted(m.gauge.value for m in got["s"].metric) == [0.0, 1.0]
    assert got["u"].type == pb.UNTYPED and got["u"].metric[0].untyped.value == 7.0
    s = got["sm"].metric[0].summary
    assert (got["sm"].type, s.sample_count, s.sample_sum) == (pb.SUMMARY, 4, 1.5)
    g = got["gh"].metric[0].histogram
    assert got["gh"].type == pb.GAUGE_HISTOGRAM and [b.cumulative_count for b in g.bucket] == [1]
    assert g.sample_count == 3 and g.sample_sum == 2.0
    h = got["h"].metric[0].histogram
    assert [(b.upper_bound, b.cumulative_count) for b in h.bucket] == [(0.5, 1)] and h.sample_count == 2
    ex = h.bucket[0].exemplar
    assert ex.value == 0.25 and ex.timestamp.seconds == 1700000000 and ex.timestamp.nanos == 500_000_000
    assert not h.HasField("schema")  # classic only: Prometheus stores it as classic


def test_a_series_is_one_metric_whatever_its_label_order():
    fam = HistogramMetricFamily(HIST, "h", labels=("a", "b"))
    fam.add_metric(["x", "y"], [("0.5", 1), ("+Inf", 2)], 1.0)
    fam.samples.append(Sample(HIST, {"b": "y", "a": "x"}, 2, None, None, native_histogram(NativeCounts())))
    fam.samples.append(Sample(HIST + "_bucket", {"le": "1.0", "b": "y", "a": "x"}, 2))
    message = family_message(fam)
    assert len(message.metric) == 1
    h = message.metric[0].histogram
    assert [b.upper_bound for b in h.bucket] == [0.5, 1.0] and h.sample_count == 2 and h.schema == SCHEMA


def test_counters_and_gauges_written_directly_are_the_messages_bytes(tmp_path):
    """The protobuf encoder writes counter and gauge families without building messages; the bytes must be what
    serializing ``family_message`` gives, for a real multiprocess directory's families (every type, labels, zeros,
    empty help) and twice over (the second time from kept label bytes)."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.samples import Sample

    from telemetry.exposition.protobuf import encode_families, encode_messages, family_message
    from tests.reliability.test_liveness import eight_processes
    from telemetry.multiproc.reader import ReaderCache, multiprocess_registry

    eight_processes(tmp_path)
    reg = multiprocess_registry(str(tmp_path), cache=ReaderCache())
    odd = Metric("odd", "", "gauge")
    odd.samples = [Sample("odd", {"a": "", "ü": "é\n"}, 0.0), Sample("odd", {}, -1.5e300)]
    for _ in range(2):
        families = list(reg.collect()) + [odd]
        assert {f.type for f in families} >= {"counter", "gauge", "histogram"}
        by_messages = encode_messages(m for m in map(family_message, families) if m is not None and m.metric)
        assert encode_families(families) == by_messages
