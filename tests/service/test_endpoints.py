"""Every endpoint and every error, in process (TestClient runs the app's lifespan)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from service.app import create_app
from service.routes import static_dir
from service.settings import ServiceSettings

PATHS = ["/", "/healthz", "/readyz", "/metrics", "/routing", "/routing/explain?rows=1"]


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_readyz_once_started(client):
    r = client.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True and {c["name"] for c in body["checks"]} == {"startup", "telemetry"}


def test_readyz_is_503_before_the_lifespan_ran():
    from fastapi.testclient import TestClient

    c = TestClient(create_app(ServiceSettings()), base_url="http://127.0.0.1")  # no `with`: startup never ran
    r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json()["ready"] is False and r.json()["checks"][0] == {"name": "startup", "ok": False, "detail": "starting"}


def test_readyz_with_demo_reports_it(demo_client):
    body = demo_client.get("/readyz").json()
    assert {"name": "demo", "ok": True, "detail": "finished"} in body["checks"]


def test_readyz_waits_for_the_demo_warm_up():
    from fastapi.testclient import TestClient

    from dispatcher import Dispatcher
    from tests.service.held_demo import HeldWarmUp

    demo = HeldWarmUp(Dispatcher(), limit=10, duty=1.0, min_gap_s=0.0, warm_up=True)
    with TestClient(create_app(ServiceSettings(demo=True, flush_interval_s=0.2), demo=demo), base_url="http://127.0.0.1") as c:
        try:
            r = c.get("/readyz")
            assert r.status_code == 503 and {"name": "demo", "ok": False, "detail": "warming up"} in r.json()["checks"]
            assert c.get("/routing").json()["demo"]["warm_up"] == {"calls": 0, "failed": 0, "seconds": None}
        finally:
            demo.go.set()
        assert demo.wait_done(60)
        body = c.get("/routing").json()["demo"]
        assert body["state"] == "finished" and body["warm_up"]["calls"] > 0
        assert c.get("/readyz").status_code == 200


def test_page_and_its_assets_are_local(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    static = Path(static_dir())
    for f in sorted([*static.glob("*.js"), *static.glob("*.css")]):  # every file inlined: one file, no request
        assert f.read_text(encoding="utf-8").replace("</script", "<\\/script") in html, f.name
    refs = set(re.findall(r'\b(?:src|href)="([^"]*)"', html))
    assert refs <= {"/routing", "/metrics", "/docs"}, refs  # links for people only: no CDN, no other fetch
    assert "@import" not in html and "url(" not in html
    assert 'id="routing-initial"' in html and r.headers["cache-control"] == "no-store"
    for asset, kind in (("/static/app.js", "javascript"), ("/static/style.css", "text/css")):
        a = client.get(asset)  # still served alone, for a reader of the sources
        assert a.status_code == 200 and kind in a.headers["content-type"]
    assert client.get("/static/nope.js").status_code == 404


def test_metrics_prometheus_text_by_default(client):
    client.get("/healthz")
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in parse_text(r.text)}
    assert {"routescope_calls", "routescope_build_info", "routescope_telemetry_last_flush_timestamp_seconds"} <= names
    assert "routescope_http_requests" in names  # the service's own HTTP metrics, from the instrumentator
    assert 'handler="/healthz"' in r.text


def test_metrics_openmetrics_when_asked(client):
    r = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")
    assert {"routescope_calls", "routescope_http_requests"} <= {f.name for f in parse_openmetrics(r.text)}


def test_routing_shape_without_traffic(client):
    r = client.get("/routing")
    assert r.status_code == 200
    body = r.json()
    assert body["platform"]["arch"] == "cpu" and body["platform"]["aiter_importable"] is False
    assert body["platform"]["aiter_reason"]  # why AITER is not available here
    assert body["policy"]["gfx942_min_rows"] == 512 and body["policy"]["gfx950_min_rows"] == 1024
    assert [p["name"] for p in body["counterfactuals"]]
    assert {p["platform"] for p in body["counterfactuals"]} == {"cpu"}  # no demo: decided on this platform
    assert body["counterfactual_platform"]["what_if"] is False
    assert body["counts"] == [] and body["decisions"] == [] and body["demo"] is None
    assert "512-1023" in body["rows_buckets"] and body["rows_buckets"][-1] == "16384+"
    assert body["decode_in_prefill"]["calls"] == 0
    assert body["service"]["models"] == ["DeepSeek-V4.1-Flash", "GLM-5.3-Flash"]


def test_routing_with_demo_traffic(demo_client):
    body = demo_client.get("/routing").json()
    demo = body["demo"]
    assert demo["state"] == "finished" and demo["glm_bug"] is True and demo["scaled"] is True
    assert demo["scale_factor"] == pytest.approx(4096) and demo["device"] == "cpu"
    calls = sum(r["calls"] for r in body["counts"])
    assert calls == demo["prefill_calls"] > 0  # nothing lost between the demo and telemetry
    assert sum(r["calls"] for r in body["decode_path"]) == demo["decode_path_calls"] > 0
    assert {r["model"] for r in body["counts"]} == {"DeepSeek-V4.1-Flash", "GLM-5.3-Flash"}
    dip = body["decode_in_prefill"]
    glm = next(m for m in dip["by_model"] if m["model"] == "GLM-5.3-Flash")
    assert dip["calls"] == glm["calls"] > 0 and glm["decode_rows"] >= glm["calls"]
    assert all(m["calls"] == 0 for m in dip["by_model"] if m["model"] != "GLM-5.3-Flash")
    assert body["latency"] and all(r["samples"] > 0 and r["p50_s"] <= r["p99_s"] for r in body["latency"])
    assert 0 < len(body["decisions"]) <= 50
    ts = [d["ts"] for d in body["decisions"]]
    assert ts == sorted(ts, reverse=True)  # newest first
    # telemetry's counterfactuals: this CPU demo's calls decided again on a what-if gfx942 (never launched)
    assert [(p["name"], p["platform"]) for p in body["counterfactuals"]] == [
        ("gfx942_512", "what-if gfx942"), ("gfx942_1024", "what-if gfx942"), ("no_row_gate", "what-if gfx942")]
    cp = body["counterfactual_platform"]
    assert cp["arch"] == "gfx942" and cp["what_if"] is True and cp["aiter_enabled"] is True
    assert "what_if" not in demo  # one mechanism: telemetry's would_route
    decided = sum(r["calls"] for r in body["counts"]) + sum(r["calls"] for r in body["guard"]["refused"])
    for p in body["counterfactuals"]:
        assert sum(r["calls"] for r in body["would_route"] if r["policy"] == p["name"]) == decided
    kernels = {(r["policy"], r["kernel"]) for r in body["would_route"]}
    assert {("gfx942_512", "aiter.pa_prefill_sparse"), ("no_row_gate", "aiter.pa_prefill_sparse")} <= kernels
    dip = {p["name"]: 0 for p in body["counterfactuals"]}
    for r in body["would_route"]:
        dip[r["policy"]] += r["decode_in_prefill_calls"]
    assert set(dip.values()) == {body["decode_in_prefill"]["calls"]}  # the GLM bug's calls, under every gate
    assert dip["no_row_gate"] > 0
    assert any(line.startswith("routescope_would_route_calls_total{") and 'policy="gfx942_512"' in line
               and 'kernel="aiter.pa_prefill_sparse"' in line for line in demo_client.get("/metrics").text.splitlines())


def test_demo_counterfactuals_defaults_yield_to_the_environment(client_for, monkeypatch):
    monkeypatch.setenv("ROUTESCOPE_TELEMETRY_COUNTERFACTUAL_ARCH", "none")
    c = client_for(demo=True, demo_limit=1, gfx942_min_rows=768)
    body = c.get("/routing").json()
    assert body["counterfactual_platform"]["arch"] == "cpu" and not body["counterfactual_platform"]["what_if"]
    assert [(p["name"], p["platform"]) for p in body["counterfactuals"]] == [
        ("gfx942_768", "cpu"), ("gfx942_1024", "cpu"), ("no_row_gate", "cpu")]
    monkeypatch.setenv("ROUTESCOPE_TELEMETRY_COUNTERFACTUAL_ARCH", "gfx950")
    monkeypatch.setenv("ROUTESCOPE_TELEMETRY_COUNTERFACTUALS", "gfx950_2048")
    body = client_for(demo=True, demo_limit=1).get("/routing").json()
    assert body["counterfactual_platform"]["arch"] == "gfx950"
    assert [(p["name"], p["platform"]) for p in body["counterfactuals"]] == [("gfx950_2048", "what-if gfx950")]


def test_routing_decisions_are_bounded_by_settings(client_for):
    from tests.service.conftest import wait_demo

    c = client_for(demo=True, demo_limit=120, demo_duty=1.0, decisions=5)
    assert len(wait_demo(c)["decisions"]) == 5


def test_explain_answers_like_the_gate(client):
    r = client.get("/routing/explain", params={"arch": "gfx942", "rows": 512})
    assert r.status_code == 200
    assert r.json()["kernel"] == "aiter.pa_prefill_sparse"
    r = client.get("/routing/explain", params={"arch": "gfx942", "rows": 511})
    assert r.json()["kernel"] == "intree.ragged_prefill" and r.json()["reason_code"] == "gfx942_min_rows"


def test_explain_defaults_thresholds_to_the_servers_policy(client_for):
    c = client_for(gfx942_min_rows=1024)
    body = c.get("/routing/explain", params={"rows": 700}).json()
    assert body["kernel"] == "intree.ragged_prefill" and body["policy"]["gfx942_min_rows"] == 1024
    body = c.get("/routing/explain", params={"rows": 700, "gfx942_min_rows": 600}).json()
    assert body["kernel"] == "aiter.pa_prefill_sparse"


def test_explain_query_lens_classify_the_glm_bug(client):
    r = client.get("/routing/explain", params={"query_lens": "1,1,1,1", "gfx942_min_rows": 0})
    body = r.json()
    assert body["call_class"] == "pure_decode" and body["decode_rows"] == 4 and body["decode_in_prefill"] is True
    r = client.get("/routing/explain?query_lens=1&query_lens=1&query_lens=8000")  # repeated form too
    assert r.json()["call_class"] == "mixed" and r.json()["rows"] == 8002


@pytest.mark.parametrize(
    "query, param",
    [
        ("rows=abc", "rows"),
        ("rows=-1", "rows"),
        ("rows=1&q_dtype=int8", "q_dtype"),
        ("rows=1&kv_dtype=float64", "kv_dtype"),
        ("rows=1&aiter=maybe", "aiter"),
        ("rows=1&sink=2", "sink"),
        ("rows=1&guard=ignore", "guard"),
        ("rows=1&layout=llama", "layout"),
        ("rows=1&heads=0", "heads"),
        ("rows=1&topk=0", "topk"),
        ("rows=1&spec_tokens=65", "spec_tokens"),
        ("rows=1&gfx942_min_rows=-5", "gfx942_min_rows"),
        ("rows=1&gfx950_min_rows=x", "gfx950_min_rows"),
        ("rows=1&arch=gfx%20942", "arch"),
        ("rows=1&arch=%00", "arch"),
        ("query_lens=1,a", "query_lens"),
        ("query_lens=0,5", "query_lens"),
        ("rows=5&query_lens=1,2", "rows"),
        ("", "rows"),
        ("rows=1&bogus=1", "bogus"),
    ],
)
def test_explain_malformed_is_422_naming_the_parameter(client, query, param):
    r = client.get("/routing/explain?" + query)
    assert r.status_code == 422, r.text
    body = r.json()
    assert param in body["message"]
    assert any(param in (item["parameter"] or "") for item in body["detail"])


def test_unknown_path_is_404(client):
    assert client.get("/nope").status_code == 404


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_nothing_mutates(client, path, method):
    assert client.request(method, path).status_code == 405


def test_openapi_documents_every_endpoint_with_models(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/healthz", "/readyz", "/metrics", "/routing", "/routing/explain"} <= paths.keys()
    schemas = spec["components"]["schemas"]
    assert {"RoutingOut", "ExplainResponse", "ReadyOut", "HealthOut", "ValidationErrorOut"} <= schemas.keys()
    params = {p["name"] for p in paths["/routing/explain"]["get"]["parameters"]}
    from dispatcher.explain import ExplainRequest

    assert params == set(ExplainRequest.model_fields) | {"allow_unknown_arch"}
    assert "application/openmetrics-text" in paths["/metrics"]["get"]["responses"]["200"]["content"]


def test_a_failing_snapshot_is_a_500_without_a_traceback(client):
    class Broken:
        def snapshot(self):
            raise RuntimeError("secret detail")

    from fastapi.testclient import TestClient

    app = client.app
    real = app.state.routescope.telemetry
    app.state.routescope.telemetry = Broken()
    try:
        r = TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1").get("/routing")
    finally:
        app.state.routescope.telemetry = real
    assert r.status_code == 500
    assert r.json() == {"message": "internal error (RuntimeError)"} and "secret" not in r.text
