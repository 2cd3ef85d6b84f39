"""End to end: `routescope serve --demo --demo-glm-bug` (a real server on a free loopback port) to `advise --json`.

On this CPU no table covers the platform, so the demo opts into the H200 table (a what-if, said
so). GLM's decode rows reach the prefill kernel: their cost must be positive, and sending pure
decodes to split-K must save time. DeepSeek's decodes use the decode entry: no such cost.
"""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from advise.report import AdviceOut
from routescope.cli import build_app
from tests.service.live import Served

pytestmark = pytest.mark.slow
GLM, DSV = "GLM-5.3-Flash", "DeepSeek-V4.1-Flash"
DIP_GLM = f'routescope_advice_decode_in_prefill_seconds_per_hour{{estimate="mid",model="{GLM}"}}'


def _ready(body: dict) -> bool:
    traffic = body.get("traffic") or []
    glm_decodes = sum(e["calls"] for e in traffic if e["model"] == GLM and e["call_class"] == "pure_decode")
    return glm_decodes >= 5 and any(e["model"] == DSV for e in traffic)


def _metrics_with(s: Served, series: str, timeout: float) -> str:
    """/metrics once it shows ``series``: the advice gauges may lag /routing by up to two cache periods (2 s)."""
    deadline = time.monotonic() + timeout
    while True:
        text = s.get("/metrics").text
        if series in text or time.monotonic() > deadline:
            return text
        time.sleep(0.3)


def test_serve_demo_with_the_glm_bug_to_advise_json(tmp_path):
    s = Served("--demo", "--demo-glm-bug", log=tmp_path / "serve.log").wait_ready()
    try:
        page = s.wait_for(_ready, 90, "GLM pure decodes and DeepSeek calls in /routing's traffic")
        res = CliRunner().invoke(build_app(), ["advise", "--url", s.base, "--json"])  # the CLI in this process
        metrics = _metrics_with(s, DIP_GLM, 10.0)
    finally:
        s.stopped_cleanly()
    assert res.exit_code == 0, res.output
    out = AdviceOut.model_validate(json.loads(res.output))
    assert out.status == "ok" and out.target.what_if and out.target.platform_arch == "cpu"
    assert out.tables[0].name == "h200-sweep-cupti" and "demo on cpu" in out.target.note
    models = {m.model: m for m in out.models}
    glm = models[GLM]
    assert glm.decode_in_prefill.calls > 0 and glm.decode_in_prefill.cost.mid > 0
    guard = next(c for c in glm.candidates if c.name == "decodes_split_k")
    assert guard.moved_calls > 0 and guard.saving.mid > 0 and guard.saving.low > 0
    assert models[DSV].decode_in_prefill.calls == 0
    assert page["advice"]["status"] == "ok"  # the page's /routing carries the same advice
    assert DIP_GLM in metrics
