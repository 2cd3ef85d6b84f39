"""The page in real headless Debian chromium: it renders the routing matrix from a running demo."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

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


def dump_dom(url: str, profile) -> Dom:
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=6000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    dom = Dom()
    dom.feed(out.stdout)
    return dom


@pytest.mark.skipif(CHROMIUM is None, reason="chromium (Debian package) is not installed")
def test_page_renders_the_matrix_from_a_running_demo(tmp_path):
    s = Served("--demo", "--demo-glm-bug", log=tmp_path / "serve.log").wait_ready()
    try:
        s.wait_for(
            lambda b: b["decode_in_prefill"]["calls"] > 0 and len({r["model"] for r in b["counts"]}) == 2 and b["latency"],
            90, "calls of both models and GLM decode-in-prefill",
        )
        dom = dump_dom(s.base + "/", tmp_path / "profile")
    finally:
        s.stopped_cleanly()
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
