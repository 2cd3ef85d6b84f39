"""A rank's /metrics server negotiates as `routescope serve` does: protobuf with native histograms for a Prometheus
that asks for it, text without a stray native sample, the histogram mode. Real sockets, a real telemetry registry."""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatcher import Policy
from routescope.vllm import rank_server
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.workload import make_calls, noop_registry
from telemetry.exposition.protobuf import decode_delimited

PROTOBUF = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
            "application/openmetrics-text;version=1.0.0;q=0.8,text/plain;version=0.0.4;q=0.5")
TEXT = "text/plain;version=0.0.4"
HIST = "routescope_call_duration_seconds"


@pytest.fixture(scope="module")
def tel():
    from dispatcher import Dispatcher, what_if

    platform = what_if("gfx942")
    t = Telemetry(TelemetryConfig(models=("glm",), timing="host", sample_every=1, flush_on_exit=False,
                                  log_first_decode_in_prefill=False), platform=platform, policy=Policy())
    d = t.instrument(Dispatcher(platform=platform, policy=Policy(), registry=noop_registry()))
    for args, kw in make_calls(64):
        d(*args, **kw)
    t.flush()
    yield t
    t.close()


def _serve(tel, mode: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return rank_server.start(port, registry=tel.registry, histogram_mode=mode), port


def _get(port: int, accept: str) -> tuple[bytes, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read(), r.headers["Content-Type"]


@pytest.mark.parametrize("mode", ["both", "native", "classic"])
def test_each_format_in_each_mode(tel, mode):
    server, port = _serve(tel, mode)
    try:
        body, content_type = _get(port, PROTOBUF)
        assert content_type.startswith("application/vnd.google.protobuf")
        hists = [m.histogram for f in decode_delimited(body) if f.name == HIST for m in f.metric]
        assert hists
        assert all(bool(h.positive_span) == (mode != "classic") for h in hists), mode
        assert all(bool(h.bucket) == (mode != "native") for h in hists), mode
        text, content_type = _get(port, TEXT)
        assert content_type.startswith("text/plain")
        names = {s.name for f in text_string_to_metric_families(text.decode()) if f.name == HIST for s in f.samples}
        assert HIST not in names, "no native sample in text 0.0.4"
        assert names == {HIST + "_bucket", HIST + "_count", HIST + "_sum"}
        les = {s.labels["le"] for f in text_string_to_metric_families(text.decode()) if f.name == HIST
               for s in f.samples if s.name == HIST + "_bucket"}
        assert (les == {"+Inf"}) is (mode == "native")
        if shutil.which("promtool"):
            res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
            assert res.returncode == 0 and not res.stdout.strip(), res
    finally:
        server.shutdown()
        server.server_close()
