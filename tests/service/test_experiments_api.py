"""GET/POST /experiments and the stop, in process, on the real experiments core and the real dispatcher and kernels.

A registry of the experiments package is attached to a CPU Dispatcher, the app is built around it, and calls go
through the dispatcher's torch kernels; the registry is flushed by hand, so every count is known when it is read.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

import experiments as core
from dispatcher import Dispatcher, detect
from dispatcher.policy import Policy
from service.app import create_app
from service.experiment_control import MANUAL_REASON, CoreControl, build_control
from service.experiment_models import ExperimentsOut
from service.experiments import loopback_refusal
from service.routing import RoutingOut
from service.settings import ServiceSettings

PROMTOOL = shutil.which("promtool")
MODEL = "GLM-5.3-Flash"
LOOPBACK = ("127.0.0.1", 50000)


def call(dispatcher: Dispatcher, rows: int, gen: torch.Generator) -> None:
    """One prefill-entry call of a small GLM-like shape (2 heads, 64+0, top-k 8) on the CPU."""
    q = torch.randn(rows, 2, 64, generator=gen).to(torch.bfloat16)
    kv = torch.randn(64, 1, 64, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, 64, (rows, 8), generator=gen, dtype=torch.int32)
    out = torch.empty(rows, 2, 64, dtype=torch.bfloat16)
    dispatcher(q, kv, idx, None, 64**-0.5, 64, 64, 0, None, out, query_lens=[rows], model=MODEL)


@pytest.fixture
def stack():
    """(app, dispatcher, registry): the app's experiment control is the registry's, Host checks off (any name)."""
    dispatcher = Dispatcher(platform=detect(), policy=Policy())
    registry = core.Registry(dispatcher.platform, dispatcher.policy, torch_mod=torch)
    registry.attach(dispatcher)
    app = create_app(ServiceSettings(allowed_hosts=["*"], models=[MODEL]), dispatcher=dispatcher,
                     experiments=CoreControl(core, registry, registry=registry))
    yield app, dispatcher, registry
    registry.close()


def client(app, host: tuple[str, int] = LOOPBACK, base: str = "http://127.0.0.1") -> TestClient:
    return TestClient(app, base_url=base, client=host, raise_server_exceptions=False)


def test_start_run_read_and_stop_through_http(stack):
    app, dispatcher, registry = stack
    c = client(app)
    assert c.get("/experiments").json() == {"experiments": []}
    r = c.post("/experiments", json={"id": "aa1", "candidate": "aa", "fraction": 0.1, "seed": 3})
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "aa1" and r.json()["state"] == "running" and r.json()["stop_reason"] is None
    gen = torch.Generator().manual_seed(0)
    for i in range(120):
        call(dispatcher, (16, 100, 200, 300)[i % 4], gen)
    registry.flush()
    doc = c.get("/experiments").json()
    ExperimentsOut.model_validate(doc)  # the contract, typed
    (e,) = doc["experiments"]
    assert set(e) >= {"id", "candidate", "fraction", "state", "stop_reason", "cells", "saving"}
    assert {k for k in e["saving"]} >= {"seconds", "low", "high"}
    cells = e["cells"]
    assert cells and all(set(c) >= {"model", "rows_bucket", "kernel_a", "kernel_b", "calls_a", "calls_b", "timed_a",
                                    "timed_b", "ratio", "ratio_low", "ratio_high"} for c in cells)
    assert sum(c["calls_a"] + c["calls_b"] for c in cells) == 120  # every call of an A/A is eligible
    b = sum(c["calls_b"] for c in cells)
    assert 2 <= b <= 30, b  # fraction 0.1 of 120: inside binomial bounds (mean 12, sd 3.3)
    assert {c["kernel_a"] for c in cells} == {c["kernel_b"] for c in cells} == {"intree.ragged_prefill"}
    # /routing carries the same list, and its model documents it
    routing = c.get("/routing").json()
    RoutingOut.model_validate(routing)
    assert [x["id"] for x in routing["experiments"]] == ["aa1"]
    assert sum(x["calls_b"] for x in routing["experiments"][0]["cells"]) == b
    # the series: state, calls per arm that add up to the cells', and the whole exposition passes promtool
    text = c.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (state,) = fams["routescope_experiment_state"].samples
    assert state.labels == {"experiment": "aa1", "candidate": "aa", "state": "running", "stop_reason": ""}
    by_arm = {arm: sum(s.value for s in fams["routescope_experiment_calls"].samples
                       if s.labels["arm"] == arm and s.name.endswith("_total")) for arm in "ab"}
    assert by_arm == {"a": 120 - b, "b": b}
    # arm B's calls are the experiment's, not the guard's: advise reads a guard reroute as guard mode reroute
    assert not [s for s in fams["routescope_guard_rerouted_calls"].samples if s.value > 0]
    if PROMTOOL:
        out = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    # stop: the arms go back to A, the reason says a person did it, and the state series follows
    r = c.post("/experiments/aa1/stop")
    assert r.status_code == 200 and r.json()["state"] == "stopped" and r.json()["stop_reason"] == MANUAL_REASON
    assert dispatcher.arms is None
    call(dispatcher, 300, gen)
    registry.flush()
    after = c.get("/experiments").json()["experiments"][0]
    assert sum(x["calls_a"] + x["calls_b"] for x in after["cells"]) == 120  # a stopped experiment sees no more calls
    (state,) = [s for s in text_string_to_metric_families(c.get("/metrics").text)
                if s.name == "routescope_experiment_state"][0].samples
    assert state.labels["state"] == "stopped" and state.labels["stop_reason"] == MANUAL_REASON
    assert c.post("/experiments/nope/stop").status_code == 404


def test_refused_starts_say_why(stack):
    app, _, _ = stack
    c = client(app)
    cases = [
        ({"id": "x", "candidate": "bogus"}, 422, "candidate 'bogus'"),
        ({"id": "x", "candidate": "aa", "fraction": 0.5}, 422, "fraction"),
        ({"candidate": "aa"}, 422, "id"),
        ({"id": "x", "candidate": "aa", "unknown": 1}, 422, "unknown"),
    ]
    for body, status, words in cases:
        r = c.post("/experiments", json=body)
        assert r.status_code == status and words in r.json()["message"], (body, r.status_code, r.text)
    for raw in (b"{not json", b"[1, 2]", b"x" * 70_000):
        r = c.post("/experiments", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["message"], r.text
    assert c.post("/experiments", json={"id": "one", "candidate": "aa"}).status_code == 201
    r = c.post("/experiments", json={"id": "two", "candidate": "aa"})
    assert r.status_code == 409 and "'one' is running" in r.json()["message"]
    r = c.post("/experiments", json={"id": "one", "candidate": "aa"})
    assert r.status_code == 409 and "exists already" in r.json()["message"]


@pytest.mark.parametrize("peer, base, headers, words", [
    (("10.1.2.3", 5000), "http://127.0.0.1", {}, "loopback only; this request came from 10.1.2.3"),
    (LOOPBACK, "http://metrics.example.com", {}, "needs a loopback Host"),
    (LOOPBACK, "http://127.0.0.1", {"origin": "http://evil.example"}, "from a page at 'http://evil.example'"),
    (LOOPBACK, "http://127.0.0.1", {"origin": "null"}, "from a page at 'null'"),
])
def test_control_is_loopback_only_even_when_any_host_is_served(stack, peer, base, headers, words):
    app, _, registry = stack
    c = client(app, peer, base)
    assert c.get("/experiments").status_code == 200  # reading is as open as /routing
    for path, body in (("/experiments", {"id": "x", "candidate": "aa"}), ("/experiments/x/stop", None),
                       ("/experiments/x/ack", None)):
        r = c.post(path, json=body, headers=headers)
        assert r.status_code == 403 and words in r.json()["message"], r.text
    assert registry.all == {}  # nothing was started


def test_loopback_refusal_cases():
    ok = [("127.0.0.1", "127.0.0.1:9475", None), ("::1", "[::1]:9475", None), ("127.0.0.5", "localhost", None),
          ("127.0.0.1", "localhost:1", "http://localhost:9475"), ("127.0.0.1", "127.0.0.1", "http://[::1]:80")]
    for args in ok:
        assert loopback_refusal(*args) is None, args
    bad = [(None, "127.0.0.1", None), ("testclient", "127.0.0.1", None), ("127.0.0.1", None, None),
           ("127.0.0.1", "127.0.0.1.evil.example", None), ("127.0.0.1", "127.0.0.1:9475", "https://a.example")]
    for args in bad:
        assert loopback_refusal(*args) is not None, args


def test_a_non_loopback_host_is_refused_by_the_services_own_host_check(stack):
    """Bound to loopback (the default), the Host check answers before the control's own check does."""
    _, dispatcher, _ = stack
    app = create_app(ServiceSettings(models=[MODEL]), dispatcher=dispatcher)
    r = client(app, base="http://attacker.example").post("/experiments/x/stop")
    assert r.status_code == 400 and "Invalid host header" in r.text


def test_without_a_demo_or_a_directory_a_start_is_refused_not_left_idle():
    dispatcher = Dispatcher(platform=detect(), policy=Policy())
    control = build_control(ServiceSettings(), dispatcher)
    c = client(create_app(ServiceSettings(), dispatcher=dispatcher, experiments=control))
    assert c.get("/experiments").json() == {"experiments": []}
    r = c.post("/experiments", json={"id": "x", "candidate": "aa"})
    assert r.status_code == 409 and "no process would run" in r.json()["message"]


def test_a_failing_core_costs_the_series_and_the_section_never_the_endpoints(stack, caplog):
    app, _, _ = stack

    class Broken:
        fail = True

        def experiments(self):
            if self.fail:
                raise RuntimeError("boom")
            return []

    broken = app.state.routescope.experiments = Broken()
    c = client(app)
    for _ in range(3):
        assert c.get("/metrics").status_code == 200 and "routescope_experiment_state" in c.get("/metrics").text
    assert c.get("/routing").json()["experiments"] == []
    r = c.get("/experiments")
    assert r.status_code == 500 and "boom" not in r.text  # the house's 500: class name only
    assert [m for m in caplog.messages if m.startswith("experiments read failed")] == [
        "experiments read failed: RuntimeError: boom (logged again only once it recovers)"]  # once, not per scrape
    broken.fail = False
    c.get("/metrics")
    assert "experiments read recovered" in caplog.messages


def test_openapi_documents_the_control_and_other_methods_are_405(stack):
    app, _, _ = stack
    c = client(app)
    spec = c.get("/openapi.json").json()
    assert set(spec["paths"]["/experiments"]) == {"get", "post"}
    assert set(spec["paths"]["/experiments/{experiment_id}/stop"]) == {"post"}
    assert set(spec["paths"]["/experiments/{experiment_id}/ack"]) == {"post"}
    assert {"ExperimentsOut", "ExperimentOut", "ExperimentCell", "Saving", "ControlError", "Prediction",
            "Acknowledged"} <= spec["components"]["schemas"].keys()
    for method in ("PUT", "DELETE", "PATCH"):
        assert c.request(method, "/experiments").status_code == 405
    assert c.get("/experiments/x/stop").status_code == 405


def test_a_kill_switch_stop_is_exported_with_its_reason(stack):
    """The core's own stop with a kill-switch reason (what its flush does on harm) reaches the state series, which
    RoutescopeExperimentStopped selects (dashboards/tests.yml evaluates the rule itself)."""
    app, dispatcher, registry = stack
    c = client(app)
    assert c.post("/experiments", json={"id": "g", "candidate": "aa", "fraction": 0.1}).status_code == 201
    registry.all["g"].stop("harm")
    registry.flush()
    assert dispatcher.arms is None
    (e,) = c.get("/experiments").json()["experiments"]
    assert (e["state"], e["stop_reason"]) == ("stopped", "harm")
    (state,) = [f for f in text_string_to_metric_families(c.get("/metrics").text)
                if f.name == "routescope_experiment_state"][0].samples
    assert state.labels["state"] == "stopped" and state.labels["stop_reason"] == "harm" and state.value == 1
    r = c.post("/experiments/g/stop")  # a person's stop afterwards changes nothing: the kill switch's reason stays
    assert r.status_code == 200 and r.json()["stop_reason"] == "harm"


def test_each_cells_prediction_carries_advises_band_everywhere_it_is_read():
    """A latency table that prices the test's shape, timed flat with a p20-p80 spread per kernel: GET /experiments,
    /routing's section and the report CLI's grid show the predicted B/A with exactly advise's band from it."""
    from experiments.covariate import Predictor
    from service.experiment_report import grids
    from tests.experiments.test_covariate import _flat_table

    dispatcher = Dispatcher(platform=detect(), policy=Policy())
    table = _flat_table((9.0, 10.0, 11.0), (4.0, 5.0, 6.0), topk=8, layout="64+0")
    registry = core.Registry(dispatcher.platform, dispatcher.policy, torch_mod=torch, predictor=Predictor([table]))
    registry.attach(dispatcher)
    app = create_app(ServiceSettings(allowed_hosts=["*"], models=[MODEL]), dispatcher=dispatcher,
                     experiments=CoreControl(core, registry, registry=registry))
    try:
        c = client(app)
        r = c.post("/experiments", json={"id": "s", "candidate": "split_below_256", "fraction": 0.1})
        assert r.status_code == 201, r.text
        gen = torch.Generator().manual_seed(1)
        for i in range(40):
            call(dispatcher, (16, 100)[i % 2], gen)
        registry.flush()
        (e,) = c.get("/experiments").json()["experiments"]
        (r,) = c.get("/routing").json()["experiments"]
        assert e["cells"] and [x["prediction"] for x in r["cells"]] == [x["prediction"] for x in e["cells"]]
        for cell in e["cells"]:
            p = cell["prediction"]
            assert (p["ratio"], p["ratio_low"], p["ratio_high"]) == pytest.approx((0.5, 4 / 11, 6 / 9), rel=1e-9)
            assert p["reason"] is None and p["tables"] == ["flat"]
        (g,) = grids(e)
        assert {v["predicted"] for v in g["cells"].values()} == {"0.50 [0.36, 0.67]"}
    finally:
        registry.close()
