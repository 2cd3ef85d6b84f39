"""The page's advice panel in real headless chromium, from a /routing built by the service's own view.

The /routing is routing_view over a real Telemetry snapshot plus a `traffic` fixture (the
aggregate telemetry is getting); a stand-in HTTP server serves it beside the page's static files.
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


def routing(arch: str) -> dict:
    tel = Telemetry(TelemetryConfig(models=(DSV, GLM)), platform=what_if(arch), policy=Policy())
    try:
        snap = tel.snapshot()
    finally:
        tel.close()
    snap["traffic"] = demo_entries(steps=1500, scaled=False)
    return routing_view(snap, demo=None, settings=ServiceSettings(), started_ts=time.time() - 3600)


def test_the_panel_shows_each_model_with_its_band(tmp_path):
    with RoutingStandIn(routing("sm90")) as server:
        dom = dump_dom(server.url + "/", tmp_path / "profile")
    (section,) = dom.find("section", id="advice")
    assert "hidden" not in section
    assert {a["data-advice-model"] for a in dom.find("table", **{"class": "advice-table"})} == {DSV, GLM}
    source = dom.text["advice-source"]
    assert "h200-sweep-cupti (NVIDIA H200, 2026-12-01, measured here)" in source and "never a measurement" in source
    assert "Band: lowest to highest" in source
    assert dom.find("tr", **{"class": "best"}), "the best gate is marked"
    assert {a["data-policy"] for a in dom.find("tr") if "data-policy" in a} >= {"active", "decodes_split_k"}
    (cost,) = dom.find("p", data_dip_cost=GLM)
    assert float(cost["data-mid"]) > 0
    text = dom.text["advice-models"]
    assert "decode rows that reached a prefill kernel cost" in text and "/h" in text


def test_without_a_table_the_panel_says_so(tmp_path):
    with RoutingStandIn(routing("cpu")) as server:
        dom = dump_dom(server.url + "/", tmp_path / "profile")
    (src,) = dom.find("p", id="advice-source")
    assert src["data-status"] == "no_table"
    assert "No figure: no latency table covers cpu" in dom.text["advice-source"]
    assert not dom.find("table", **{"class": "advice-table"})
