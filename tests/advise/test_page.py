"""The page's advice panel in real headless chromium, from a /routing built by the service's own view.

The /routing is routing_view over a real Telemetry snapshot whose `traffic` (telemetry's own
aggregate, empty here: no calls ran) is replaced by the demo's calls aggregated the way telemetry
aggregates them (fixtures.demo_entries), so the panel has a known traffic without running the demo
for minutes; a small HTTP server serves that document beside the page's static files. The page
over a live `serve --demo` is tests/service/test_page_browser.py.
"""

from __future__ import annotations

import time

import pytest

from dispatcher import Policy, what_if
from service.routing import routing_view
from service.settings import ServiceSettings
from telemetry import Telemetry, TelemetryConfig
from tests.service.test_page_browser import CHROMIUM, dump_dom

from .fixtures import demo_entries
from .standin import RoutingStandIn

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="chromium (Debian package) is not installed")]
GLM, DSV = "GLM-5.3-Flash", "DeepSeek-V4.1-Flash"


def routing(arch: str, *, demo: dict | None = None) -> dict:
    tel = Telemetry(TelemetryConfig(models=(DSV, GLM)), platform=what_if(arch), policy=Policy())
    try:
        snap = tel.snapshot()
    finally:
        tel.close()
    snap["traffic"] = demo_entries(steps=1500, scaled=demo is not None)  # a demo runs scaled-down shapes on a CPU
    return routing_view(snap, demo=demo, settings=ServiceSettings(), started_ts=time.time() - 3600)


def demo_info() -> dict:
    """/routing's `demo` as a CPU `serve --demo --demo-glm-bug` has it: the demo runner's own, not started."""
    from dispatcher import Dispatcher
    from service.demo.runner import DemoRunner

    return DemoRunner(Dispatcher(policy=Policy()), glm_bug=True, device="cpu").info()


def test_the_panel_shows_each_model_with_its_band(tmp_path):
    with RoutingStandIn(routing("sm90")) as server:
        dom = dump_dom(server.url + "/", tmp_path / "profile")
    (section,) = dom.find("section", id="advice")
    assert "hidden" not in section
    assert {a["data-advice-model"] for a in dom.find("table", **{"class": "advice-table"})} == {DSV, GLM}
    source = dom.text["advice-source"]
    assert "h200-sweep-cupti (NVIDIA H200, 2026-12-04, kv pools 8 MiB, 256 MiB, 4 GiB, measured here)" in source
    assert "never a measurement" in source
    assert "Band: lowest to highest" in source
    assert dom.find("tr", **{"class": "best"}), "the best gate is marked"
    assert {a["data-policy"] for a in dom.find("tr") if "data-policy" in a} >= {"active", "decodes_split_k"}
    (cost,) = dom.find("p", data_dip_cost=GLM)
    assert float(cost["data-mid"]) > 0
    text = dom.text["advice-models"]
    assert "decode rows that reached a prefill kernel cost" in text and "/h" in text
    assert "share of prefill-entry kernel time" in text and "of the predicted prefill-entry kernel time" in text
    (src,) = dom.find("p", id="advice-source")
    assert src["data-what-if"] == "false" and "what-if" not in source  # sm90 traffic priced with the H200's table


def test_a_demo_priced_as_if_on_an_h200_says_so_on_the_page(tmp_path):
    doc = routing("cpu", demo=demo_info())
    assert doc["advice"]["target"]["what_if"] and doc["advice"]["target"]["note"].startswith("demo on cpu")
    with RoutingStandIn(doc) as server:
        dom = dump_dom(server.url + "/", tmp_path / "profile")
    (section,) = dom.find("section", id="advice")
    (src,) = dom.find("p", id="advice-source")
    assert "hidden" not in section and "hidden" not in src and src["data-what-if"] == "true"
    source = " ".join(dom.text["advice-source"].split())
    assert ("Demo on cpu: priced as if on an NVIDIA H200 (h200-sweep-cupti (NVIDIA H200, 2026-12-04, "
            "kv pools 8 MiB, 256 MiB, 4 GiB, measured here)), "
            "a what-if; nothing ran on an NVIDIA H200.") in source
    assert "priced at the real models' shapes" in source  # the scaled-down demo's calls, at GLM's and DeepSeek's
    assert {a["data-advice-model"] for a in dom.find("table", **{"class": "advice-table"})} == {DSV, GLM}


def test_without_a_table_the_panel_says_so(tmp_path):
    with RoutingStandIn(routing("cpu")) as server:
        dom = dump_dom(server.url + "/", tmp_path / "profile")
    (src,) = dom.find("p", id="advice-source")
    assert src["data-status"] == "no_table"
    assert "No figure: no latency table covers cpu" in dom.text["advice-source"]
    assert not dom.find("table", **{"class": "advice-table"})
