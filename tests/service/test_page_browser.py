"""The page in real headless Debian chromium: it renders the routing matrix from a running demo."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.service.live import Served

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]


class Dom(HTMLParser):
    """Just enough of the rendered DOM: every element's attributes, and the text inside a few ids."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, str] = {}
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        if tag not in ("meta", "link", "br", "img", "input"):
            self._open.append(a.get("id"))

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for i in self._open:
            if i:
                self.text[i] = self.text.get(i, "") + data

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def dump_dom(url: str, profile, budget_ms: int = 6000) -> Dom:
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    dom = Dom()
    dom.feed(out.stdout)
    return dom


@pytest.mark.skipif(CHROMIUM is None, reason="chromium (Debian package) is not installed")
def test_page_renders_the_matrix_from_a_running_demo(tmp_path):
    s = Served("--demo", "--demo-glm-bug", "--experiment", "aa", "--experiment-fraction", "0.1",
               log=tmp_path / "serve.log").wait_ready()
    try:
        s.wait_for(
            lambda b: b["decode_in_prefill"]["calls"] > 0 and len({r["model"] for r in b["counts"]}) == 2 and b["latency"]
            and len(b["history"]["rates"]) >= 2 and sum(c["calls_b"] for c in b["experiments"][0]["cells"]) > 0,
            90, "calls of both models, GLM decode-in-prefill, two rates and arm B calls of the A/A experiment",
        )
        page = s.get("/").text
        dom = dump_dom(s.base + "/", tmp_path / "profile")
    finally:
        s.stopped_cleanly()
    first_paint(page, tmp_path)
    tables = {a["data-model"] for a in dom.find("table", **{"class": "matrix"})}
    assert tables == {"DeepSeek-V4.1-Flash", "GLM-5.3-Flash"}
    cells = [a for a in dom.find("td") if "data-kernel" in a and int(a.get("data-calls") or 0) > 0]
    assert cells and {c["data-kernel"] for c in cells} == {"intree.ragged_prefill"}
    assert any("background: rgba(37, 99, 235" in c.get("style", "") for c in cells)  # shaded by share
    assert [c for c in cells if c.get("class") == "dip"]  # decode-in-prefill cells outlined in red
    assert dom.find("span", **{"class": "badge bad", "data-dip-model": "GLM-5.3-Flash"})
    assert not dom.find("span", **{"class": "badge bad", "data-dip-model": "DeepSeek-V4.1-Flash"})
    assert dom.find("div", **{"class": "card bad", "id": "card-dip"})
    assert dom.find("div", id="status", **{"class": "status live"})
    demo_note = dom.text.get("demo-note", "")
    assert "scaled down" in demo_note and "1/4096" in demo_note and "GLM decode bug ON" in demo_note
    whatif = dom.text.get("whatif-note", "")
    assert "what-if gfx942 with AITER enabled" in whatif and "gfx942_512 (active); gfx942_1024; no_row_gate" in whatif
    assert "never launches" in whatif and "nothing ran on gfx942" in whatif and "this machine is cpu" in whatif
    assert "intree.ragged_prefill" in dom.text.get("decisions", "")
    # the what-if rows: telemetry's would-route, decided on a what-if gfx942, one row per policy per model
    rows = dom.find("tr", **{"class": "whatif"})
    assert {a["data-policy"] for a in rows} == {"gfx942_512", "gfx942_1024", "no_row_gate"}
    assert "counterfactuals on a what-if gfx942 + AITER" in dom.text.get("models", "")
    assert dom.find("span", **{"class": "wk aiter"})  # some calls would have gone to AITER
    # the experiments part (service/static/experiments.js) on /routing's list: the A/A control's tables and charts
    (sec,) = dom.find("section", id="experiments")
    assert "hidden" not in sec
    (box,) = dom.find("div", **{"class": "exp", "data-experiment": "aa"})
    assert box["data-state"] == "running"
    assert {a["data-model"] for a in dom.find("table", **{"class": "exp-measured"})} == {"DeepSeek-V4.1-Flash",
                                                                                        "GLM-5.3-Flash"}
    assert len(dom.find("table", **{"class": "exp-predicted"})) == len(dom.find("table", **{"class": "exp-measured"}))
    measured = [a for a in dom.find("td") if "data-rows" in a and a.get("title", "").startswith("intree")]
    assert measured and {a["data-topk"] for a in measured} == {"32"}  # the CPU demo's scaled top-k
    charted = [a for a in measured if "data-ratio" in a]  # a chart per cell with a ratio, a count of the others
    assert len(dom.find("svg", **{"class": "exp-chart"})) == len(charted)
    waiting = sum(int(a["data-cells"]) for a in dom.find("p", **{"class": "note waiting"}))
    assert waiting == len(measured) - len(charted)


def first_paint(page: str, tmp_path) -> None:
    """The page as served, alone: one file (nothing else fetched), with the data in its first paint.

    It is opened from disk after the server has stopped, for less virtual time than the page waits before its
    first poll, so whatever it shows came inside the file."""
    refs = set(re.findall(r'\b(?:src|href)="([^"]*)"', page))
    assert refs <= {"/routing", "/metrics", "/docs"}, refs  # links only: no script, style or image to fetch
    assert "<style>" in page and "routescopeCharts" in page and 'id="routing-initial"' in page
    bare = Dom()
    bare.feed(page)  # the HTML before any script ran
    calls = bare.text.get("card-calls", "")
    assert re.match(r"\d", calls) and not calls.startswith("0"), calls
    saved = tmp_path / "page.html"
    saved.write_text(page)
    dom = dump_dom(saved.as_uri(), tmp_path / "profile-file", budget_ms=1000)
    assert {a["data-model"] for a in dom.find("table", **{"class": "matrix"})} == {"DeepSeek-V4.1-Flash", "GLM-5.3-Flash"}
    assert [a for a in dom.find("td") if a.get("class") == "dip"]
    assert dom.text.get("status", "").startswith("as of ")
    (rates,) = dom.find("svg", **{"class": "rates-svg"})
    assert int(rates["data-intervals"]) >= 2
    assert {a["data-series"] for a in dom.find("polyline")} >= {"calls", "dip"}
    hists = dom.find("svg", **{"class": "hist"})
    assert hists and {h["data-series"].split("|")[0] for h in hists} == {"DeepSeek-V4.1-Flash", "GLM-5.3-Flash"}
    for h in hists:  # every timed call is in its picture: the zero bucket plus the bars
        assert h["data-counted"] == h["data-samples"] and int(h["data-bars"]) >= 1, h
    order = [t for t, a in dom.elements if a.get("id") in ("models", "charts", "advice", "notes")]
    assert order and dom.elements.index(next(e for e in dom.elements if e[1].get("id") == "models")) < \
        dom.elements.index(next(e for e in dom.elements if e[1].get("id") == "advice"))  # the matrices lead


@pytest.mark.skipif(CHROMIUM is None, reason="chromium (Debian package) is not installed")
def test_the_experiments_part_is_called_with_routings_list(tmp_path):
    """An experiments.js (a stand-in for 57b's, same contract) gets the section and /routing's experiments list."""
    from dispatcher import Policy, what_if
    from service.page import page_html, static_files
    from service.routing import routing_view
    from service.settings import ServiceSettings
    from telemetry import Telemetry, TelemetryConfig

    template, styles, scripts = static_files(Path(__file__).resolve().parents[2] / "service" / "static")
    stand_in = ("experiments.js", "window.routescopeExperiments = { render(box, list, history) { "
                "box.setAttribute('data-rendered', String(list.length)); box.textContent = list.map((e) => e.id).join(','); } };")
    with Telemetry(TelemetryConfig(models=("glm",)), platform=what_if("gfx942"), policy=Policy()) as tel:
        doc = routing_view(tel.snapshot(), demo=None, settings=ServiceSettings(), started_ts=0.0, advice=lambda d: None)
    doc["experiments"] = [{"id": "exp-a"}, {"id": "exp-b"}]
    body = json.dumps(doc).encode()
    saved = tmp_path / "page.html"
    saved.write_text(page_html(template, styles, [s for s in scripts if s[0] != "experiments.js"] + [stand_in], body, doc))
    dom = dump_dom(saved.as_uri(), tmp_path / "profile", budget_ms=500)
    (sec,) = dom.find("section", id="experiments")
    assert "hidden" not in sec and sec["data-rendered"] == "2" and dom.text["experiments"] == "exp-a,exp-b"
    del doc["experiments"]  # no list in /routing: the section stays hidden
    saved.write_text(page_html(template, styles, scripts + [stand_in], json.dumps(doc).encode(), doc))
    (sec,) = dump_dom(saved.as_uri(), tmp_path / "profile2", budget_ms=500).find("section", id="experiments")
    assert "hidden" in sec


@pytest.mark.skipif(CHROMIUM is None, reason="chromium (Debian package) is not installed")
def test_page_without_the_demo_says_so(tmp_path):
    s = Served("--model", "glm-5.3-flash", log=tmp_path / "serve.log").wait_ready()
    try:
        dom = dump_dom(s.base + "/", tmp_path / "profile")
    finally:
        s.stopped_cleanly()
    assert dom.find("div", id="status", **{"class": "status live"})
    assert {a["data-model"] for a in dom.find("table", **{"class": "matrix"})} == {"glm-5.3-flash"}
    assert "no calls yet" in dom.text.get("models", "")
    assert dom.find("p", id="demo-note", hidden="")  # no demo, no demo note
    whatif = dom.text.get("whatif-note", "")  # telemetry's own counterfactuals, decided on this platform
    assert "counterfactuals decided on cpu" in whatif and "never launches" in whatif
