"""The histogram mode: which latency-histogram forms each exposition carries in ``both``, ``native`` and ``classic``.

Each format is read back as a scraper reads it: protobuf with the generated classes, text with prometheus_client's
parser and promtool. A real Prometheus and a real agent read the modes in tests/dashboards/test_fleet_e2e.py.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.settings import ServiceSettings
from telemetry import TelemetryConfig
from telemetry.bench.workload import make_calls
from telemetry.config import HistogramMode
from telemetry.exposition import negotiate
from telemetry.exposition.protobuf import decode_delimited

from .conftest import dispatcher
from .test_exposition import HIST, PROMETHEUS_242_NATIVE

OM2 = "application/openmetrics-text;version=2.0.0"
OM1 = "application/openmetrics-text;version=1.0.0"
TEXT = "text/plain;version=0.0.4"


@pytest.fixture(scope="module")
def busy():
    from telemetry import Telemetry
    from dispatcher import Policy

    d0 = dispatcher()
    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), timing="host", sample_every=1, flush_on_exit=False),
                    platform=d0.platform, policy=Policy())
    d = tel.instrument(d0)
    for args, kw in make_calls(300):
        d(*args, **kw)
    tel.flush()
    yield tel
    tel.close()


def _latency_series(tel) -> int:
    return len(tel.totals.latency)


def _text_samples(body: bytes) -> dict[str, int]:
    """Samples per name of the latency family in a text exposition."""
    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name == HIST:
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0) + 1
    return out


def _protobuf_histograms(body: bytes) -> list:
    return [m.histogram for f in decode_delimited(body) if f.name == HIST for m in f.metric]


@pytest.mark.parametrize("mode", list(HistogramMode))
def test_protobuf_carries_the_forms_of_the_mode(busy, mode):
    encoder, _ = negotiate(PROMETHEUS_242_NATIVE, mode=mode)
    hists = _protobuf_histograms(encoder(busy.registry))
    assert len(hists) == _latency_series(busy) > 0
    native = [h for h in hists if h.positive_span or h.zero_count]
    classic = [h for h in hists if h.bucket]
    assert len(native) == (0 if mode is HistogramMode.CLASSIC else len(hists)), mode
    assert len(classic) == (0 if mode is HistogramMode.NATIVE else len(hists)), mode
    counts = {(tuple(sorted((lp.name, lp.value) for lp in m.label))): m.histogram.sample_count
              for f in decode_delimited(encoder(busy.registry)) if f.name == HIST for m in f.metric}
    assert sum(counts.values()) == sum(sum(c) for c, _ in busy.totals.latency.values())  # count kept in every mode


@pytest.mark.parametrize("mode", list(HistogramMode))
def test_openmetrics_2_carries_the_forms_of_the_mode(busy, mode):
    encoder, _ = negotiate(OM2, mode=mode)
    lines = encoder(busy.registry).decode().splitlines()
    native = [line for line in lines if line.startswith(HIST + "{")]
    buckets = [line for line in lines if line.startswith(HIST + "_bucket{")]
    counts = [line for line in lines if line.startswith(HIST + "_count{")]
    n = _latency_series(busy)
    assert len(native) == (0 if mode is HistogramMode.CLASSIC else n)
    assert len(buckets) == (0 if mode is HistogramMode.NATIVE else 26 * n)
    assert len(counts) == (0 if mode is HistogramMode.NATIVE else n)


@pytest.mark.parametrize("accept", [OM1, TEXT])
@pytest.mark.parametrize("mode", list(HistogramMode))
def test_text_formats_keep_a_classic_form(busy, mode, accept):
    """text 0.0.4 and OpenMetrics 1.0 cannot carry a native histogram: native mode keeps +Inf, _count and _sum."""
    encoder, _ = negotiate(accept, mode=mode)
    body = encoder(busy.registry)
    got = _text_samples(body)
    n = _latency_series(busy)
    buckets = 1 if mode is HistogramMode.NATIVE else 26
    assert got.get(HIST + "_bucket") == buckets * n and got.get(HIST + "_count") == n and HIST not in got, got
    if mode is HistogramMode.NATIVE:
        inf = [s for f in text_string_to_metric_families(body.decode()) if f.name == HIST for s in f.samples
               if s.name == HIST + "_bucket"]
        assert {s.labels["le"] for s in inf} == {"+Inf"}
    other = {k: v for k, v in _text_samples(negotiate(accept)[0](busy.registry)).items() if k != HIST + "_bucket"}
    assert {k: v for k, v in got.items() if k != HIST + "_bucket"} == other  # counts and sums unchanged


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_native_mode_text_passes_promtool(busy):
    encoder, _ = negotiate(TEXT, mode="native")
    res = subprocess.run([shutil.which("promtool"), "check", "metrics"], input=encoder(busy.registry),
                         capture_output=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res


def test_the_mode_is_a_setting_env_and_serve_option(monkeypatch):
    assert TelemetryConfig().histogram_mode is HistogramMode.BOTH
    assert TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_HISTOGRAM_MODE": "Native"}).histogram_mode is HistogramMode.NATIVE
    assert TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_HISTOGRAM_MODE": "native"},
                                    histogram_mode="classic").histogram_mode is HistogramMode.CLASSIC
    with pytest.raises(ValueError, match="histogram_mode must be one of both, native, classic"):
        TelemetryConfig(histogram_mode="sparse")
    with pytest.raises(ValueError):
        ServiceSettings(histogram_mode="sparse")
    from typer.testing import CliRunner

    from routescope.cli import build_app

    res = CliRunner().invoke(build_app(), ["serve", "--histogram-mode", "sparse"])
    assert res.exit_code == 2 and "histogram-mode" in res.output, res.output


def test_the_service_serves_its_mode(monkeypatch):
    """`serve --histogram-mode native` reaches /metrics: the app's chain renders in the telemetry config's mode."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    for name in [n for n in __import__("os").environ if n.startswith(("ROUTESCOPE_", "PROMETHEUS_MULTIPROC"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ROUTESCOPE_TELEMETRY_SAMPLE_EVERY", "1")
    app = create_app(ServiceSettings(histogram_mode="native", models=["glm"]))
    state = app.state.routescope
    assert state.telemetry.config.histogram_mode is HistogramMode.NATIVE
    d = state.dispatcher
    for args, kw in make_calls(40):
        d(*args, **kw)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        text = client.get("/metrics", headers={"Accept": TEXT}).content
        proto = client.get("/metrics", headers={"Accept": PROMETHEUS_242_NATIVE}).content
    assert set(_text_samples(text)) == {HIST + "_bucket", HIST + "_count", HIST + "_sum"}
    assert "le=\"0.001\"" not in text.decode()
    hists = _protobuf_histograms(proto)
    assert hists and all(not h.bucket and h.positive_span for h in hists)
