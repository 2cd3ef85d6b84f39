"""The advice in the service: /routing's section (pure view, OpenAPI), the Prometheus gauges (promtool), fail-safe."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from advise.report import AdviceOut
from advise.service import AdviceCollector, AdviceSettings, Cached, advice_for_routing, families
from service.routing import RoutingOut

from .fixtures import demo_entries, routing_doc

GLM, DSV = "GLM-5.3-Flash", "DeepSeek-V4.1-Flash"


@pytest.fixture(scope="module")
def demo_advice() -> dict:
    """The advice of a CPU demo with the GLM bug: priced on the H200 table, the demo's opt-in."""
    return advice_for_routing(routing_doc(demo_entries(steps=3000)), AdviceSettings())


def by_model(advice: dict) -> dict:
    return {m["model"]: m for m in advice["models"]}


def test_the_cpu_demo_opts_into_the_h200_table_and_says_so(demo_advice):
    a = AdviceOut.model_validate(demo_advice)
    assert a.status == "ok" and a.target.what_if and a.target.platform_arch == "cpu" and a.target.arch == "sm90"
    assert "demo on cpu" in a.target.note and "what-if" in a.target.note
    assert [t.name for t in a.tables] == ["h200-sweep-cupti"] and a.tables[0].provenance == "measured here"
    assert any("real models' shapes" in n for n in a.notes)
    assert "nothing here was measured" in a.prediction


def test_glm_decode_in_prefill_costs_and_decodes_to_split_k_saves(demo_advice):
    models = by_model(demo_advice)
    glm = models[GLM]
    assert glm["decode_in_prefill"]["calls"] > 0
    assert glm["decode_in_prefill"]["cost_per_hour"]["low"] > 0
    guard = next(c for c in glm["candidates"] if c["name"] == "decodes_split_k")
    assert guard["saving"]["mid"] > 0 and guard["moved_calls"] > 0
    assert models[DSV]["decode_in_prefill"]["calls"] == 0  # its decodes use the decode entry
    assert "decode rows that reached a prefill kernel cost" in glm["headline"]


def test_without_a_table_there_is_no_figure():
    advice = advice_for_routing(routing_doc(demo_entries(steps=200), demo=False))
    assert advice["status"] == "no_table" and advice["models"] == [] and "no latency table covers cpu" in advice["message"]


def test_without_the_traffic_aggregate_advice_says_why():
    advice = advice_for_routing(routing_doc(None))
    assert advice["status"] == "no_traffic" and "`traffic`" in advice["message"]


def test_a_failure_is_reported_not_raised():
    doc = routing_doc([{"model": "m", "kernel": "k", "rows_bucket": "x"}])  # an entry that does not validate
    advice = advice_for_routing(doc)
    assert advice["status"] == "error" and "ValidationError" in advice["message"]


def test_routing_view_carries_the_advice():
    from service.routing import routing_view
    from service.settings import ServiceSettings

    snap = routing_doc(demo_entries(steps=300, scaled=False), arch="sm90", demo=False)
    snap.update(rows_buckets=[], counts=[], decode_in_prefill={"counts": []}, latency=[], decisions=[], would_route=[],
                errors=[], health={})
    out = routing_view(snap, demo=None, settings=ServiceSettings(), started_ts=1.0, version="0", now=3601.0)
    model = RoutingOut.model_validate(out)
    assert model.advice is not None and model.advice.status == "ok" and not model.advice.target.what_if
    assert model.advice.source.span_s == 3600.0  # the service's uptime


def test_openapi_documents_the_advice(client_for):
    c = client_for()
    spec = c.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert {"AdviceOut", "CandidateOut", "BandOut", "TableOut", "DecodeCostOut"} <= set(schemas)
    advice = schemas["RoutingOut"]["properties"]["advice"]
    assert any(x.get("$ref", "").endswith("/AdviceOut") for x in advice.get("anyOf", []))
    body = c.get("/routing").json()
    assert body["advice"]["status"] in ("no_traffic", "no_table")  # no demo on this CPU: no table covers it


def test_gauges_are_bounded_and_promtool_clean(demo_advice):
    registry = CollectorRegistry()
    registry.register(AdviceCollector(lambda: demo_advice))
    text = generate_latest(registry)
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    kernel = fams["routescope_advice_kernel_seconds_per_hour"].samples
    policies = {s.labels["policy"] for s in kernel}
    assert "active" in policies and "decodes_split_k" in policies and not any(p.startswith("fix") for p in policies)
    assert {s.labels["estimate"] for s in kernel} == {"mid", "low", "high"}
    assert len(kernel) == 3 * len(policies) * 2  # two models
    dip = {s.labels["model"]: s.value for s in fams["routescope_advice_decode_in_prefill_seconds_per_hour"].samples
           if s.labels["estimate"] == "mid"}
    assert set(dip) == {GLM} and dip[GLM] > 0
    info = fams["routescope_advice_table_info"].samples
    assert [(s.labels["table"], s.labels["provenance"]) for s in info] == [("h200-sweep-cupti", "measured here")]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr


def test_the_collector_never_raises():
    def broken():
        raise RuntimeError("boom")

    fams = list(AdviceCollector(broken).collect())
    assert [f.name for f in fams] == [f.name for f in families(None)] and all(not f.samples for f in fams)


def test_cached_reuses_within_its_ttl():
    now = [0.0]
    calls = []
    cached = Cached(lambda: calls.append(1) or len(calls), ttl_s=1.0, clock=lambda: now[0])
    assert cached() == 1 and cached() == 1
    now[0] = 1.5
    assert cached() == 2


def test_settings_read_the_environment(monkeypatch):
    monkeypatch.setenv("ROUTESCOPE_ADVISE_TABLES", "gfx942, h200")
    monkeypatch.setenv("ROUTESCOPE_ADVISE_GATES", "256,64")
    s = AdviceSettings()
    assert s.table_specs() == ["gfx942", "h200"] and s.gate_values() == (64, 256)
    assert os.environ["ROUTESCOPE_ADVISE_GATES"] == "256,64"


def test_cached_advice_scans_at_most_once_a_ttl(monkeypatch):
    import advise.service as svc

    scans = []
    monkeypatch.setattr(svc, "advice_for_routing", lambda doc: scans.append(doc) or {"status": "ok", "n": len(scans)})
    now = [100.0]
    cache = svc.CachedAdvice(ttl_s=1.0, clock=lambda: now[0])
    assert cache({"a": 1})["n"] == 1
    now[0] += 0.5
    assert cache({"a": 2})["n"] == 1, "a poll within the ttl reuses the last scan"
    now[0] += 0.6
    assert cache({"a": 3})["n"] == 2 and scans[-1] == {"a": 3}
