"""GET /metrics answers each scraper in the format it asks for first; only protobuf and OpenMetrics 2.0 carry native
histograms, and every format carries the same counters (the demo's real traffic, run to completion)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from telemetry.exposition import PROTOBUF_CONTENT_TYPE
from telemetry.exposition import metrics_pb2 as pb
from telemetry.exposition.protobuf import decode_delimited

PROMETHEUS_NATIVE = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                     "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;"
                     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
HIST = "routescope_call_duration_seconds"


def _calls(families) -> dict[frozenset, float]:
    return {frozenset(s.labels.items()): s.value for f in families for s in f.samples
            if s.name == "routescope_calls_total"}


def test_each_scraper_gets_its_format(demo_client):
    text = demo_client.get("/metrics")
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert HIST + "_bucket{" in text.text and "schema:" not in text.text
    om1 = demo_client.get("/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"})
    assert om1.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert "schema:" not in om1.text and om1.text.endswith("# EOF\n")
    om2 = demo_client.get("/metrics", headers={"Accept": "application/openmetrics-text;version=2.0.0"})
    assert om2.headers["content-type"].startswith("application/openmetrics-text; version=2.0.0")
    assert f"{HIST}{{" in om2.text and "schema:4," in om2.text
    proto = demo_client.get("/metrics", headers={"Accept": PROMETHEUS_NATIVE})
    assert proto.status_code == 200 and proto.headers["content-type"] == PROTOBUF_CONTENT_TYPE
    families = {f.name: f for f in decode_delimited(proto.content)}
    hist = families[HIST]
    assert hist.type == pb.HISTOGRAM and hist.metric
    assert all(m.histogram.schema == 4 and m.histogram.positive_delta for m in hist.metric)
    # the service's own HTTP series come along in every format
    assert any(name.startswith("routescope_http_") or name.startswith("http_") for name in families)
    # the demo stopped: every format reports the same calls
    from_text = _calls(text_string_to_metric_families(text.text))
    from_proto = {frozenset((lp.name, lp.value) for lp in m.label): m.counter.value
                  for m in families["routescope_calls_total"].metric}
    assert from_text and from_text == from_proto
