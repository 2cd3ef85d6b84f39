"""service/static/experiments.js in real headless Debian chromium: the seed's table beside advise's, and the charts.

The page (service/static/index.html, app.js) inlines every service/static/*.js and calls
``window.routescopeExperiments.render`` with /routing's ``experiments``; here a bare page calls it with
contract-shaped documents, so every branch of the drawing is seen without a server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.service.experiment_fixture import SEED_RATIOS, experiments
from tests.service.test_page_browser import CHROMIUM, FLAGS, dump_dom

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="chromium (Debian package) is not installed")]
SCRIPT = Path(__file__).resolve().parents[2] / "service" / "static" / "experiments.js"


def page(tmp_path: Path, body_js: str) -> str:
    html = tmp_path / "experiments.html"
    html.write_text(f"""<!doctype html><html><head><meta charset="utf-8"></head><body>
<section id="experiments"></section><section id="empty"></section><pre id="api"></pre>
<script>{SCRIPT.read_text()}</script>
<script>{body_js}</script></body></html>""")
    return html.as_uri()


def test_the_seed_table_beside_the_prediction_and_a_chart_per_cell(tmp_path):
    docs = experiments()
    history = {"gate512": docs[0].pop("history")}  # given as the third argument, as the page may pass it
    js = f"""const docs = {json.dumps(docs)};
window.routescopeExperiments.render(document.getElementById("experiments"), docs, {json.dumps(history)});
window.routescopeExperiments.render(document.getElementById("empty"), [], undefined);
document.getElementById("api").textContent = Object.keys(window.routescopeExperiments).sort().join(",");"""
    dom = dump_dom(page(tmp_path, js), tmp_path / "profile")
    boxes = {a["data-experiment"]: a for a in dom.find("div", **{"class": "exp"})}
    assert set(boxes) == {"gate512", "aa"} and boxes["aa"]["data-state"] == "stopped"
    measured = [a for a in dom.find("td") if "data-ratio" in a and a.get("title", "").startswith("aiter")]
    got = {(a["data-rows"], int(a["data-topk"])): float(a["data-ratio"]) for a in measured}
    assert got == {(rows, k): r for rows, by_k in SEED_RATIOS.items() for k, r in by_k.items()}
    # B faster where the whole band is under 1, not yet told apart where it straddles 1 (1.04 +- 0.05)
    classes = {(a["data-rows"], a["data-topk"]): a["class"] for a in measured}
    assert classes[("512-1023", "128")] == "better" and classes[("256-511", "128")] == "unclear"
    predicted = [a for a in dom.find("td") if "data-ratio" in a and a.get("title", "").startswith("advise")]
    assert {(a["data-rows"], int(a["data-topk"])): float(a["data-ratio"]) for a in predicted} == {
        (rows, k): round(r * 1.05, 4) for rows, by_k in SEED_RATIOS.items() for k, r in by_k.items()}
    # each predicted cell carries advise's band, and says where it comes from
    p512 = next(a for a in predicted if (a["data-rows"], a["data-topk"]) == ("512-1023", "128"))
    assert (float(p512["data-low"]), float(p512["data-high"])) == (round(0.672 * 0.9, 4), round(0.672 * 1.1, 4))
    assert p512["class"] == "predicted better" and "gfx942-mi325x-published" in p512["title"]
    p256 = next(a for a in predicted if (a["data-rows"], a["data-topk"]) == ("256-511", "128"))
    assert p256["class"] == "predicted unclear" and "1.09 [0.98, 1.20]" in dom.text.get("experiments", "")
    assert dom.find("table", **{"class": "exp-measured", "data-model": "GLM-5.3-Flash"})
    assert dom.find("table", **{"class": "exp-predicted", "data-model": "GLM-5.3-Flash"})
    # one chart per cell: the gate experiment's from its six history points, each with a band and the parity line
    charts = dom.find("svg", **{"class": "exp-chart"})
    gate = [c for c in charts if c["data-cell"].startswith("GLM-5.3-Flash|")]
    assert len(gate) == 9 and {c["data-points"] for c in gate} == {"6"}
    assert len(dom.find("polygon", **{"class": "band"})) >= 9 and len(dom.find("polyline", **{"class": "ratio"})) == 9
    assert dom.find("line", **{"class": "harm"})  # the harm bound the experiment stops at, dashed
    # the A/A control has no history (its current ratio drawn as one point) and one cell not yet timed (no chart)
    aa = [c for c in charts if c["data-cell"].startswith("DeepSeek")]
    assert [c["data-points"] for c in aa] == ["1"] and dom.find("p", **{"class": "note waiting", "data-cells": "1"})
    assert dom.find("span", **{"class": "badge self-stop", "data-state": "stopped"})
    assert "stopped: harm (alerting until: routescope experiment ack aa)" in dom.text.get("experiments", "")
    text = dom.text.get("experiments", "")
    assert "saving over the observed traffic: 420.000 ms" in text and "measured crossover: 512 rows" in text
    assert "crossover: not shown by the bands yet" in text  # the A/A control's
    assert "calls never moved to B: capture 12, candidate_unavailable 3" in text
    assert "No experiment" in dom.text.get("empty", "")
    assert dom.text.get("api") == "band,grids,render,verdict"


def test_an_acknowledged_stop_is_no_longer_shown_as_alerting(tmp_path):
    docs = experiments()
    docs[1]["acknowledged"] = {"at": 1.0e9, "by": "user"}
    js = f"""window.routescopeExperiments.render(document.getElementById("experiments"), {json.dumps(docs)});"""
    dom = dump_dom(page(tmp_path, js), tmp_path / "profile")
    (badge,) = dom.find("span", **{"data-state": "stopped"})
    assert badge["class"] == "badge stopped" and badge["data-acknowledged"] == "1"
    assert "stopped: harm, acknowledged by user" in dom.text.get("experiments", "")
