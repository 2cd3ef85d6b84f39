"""`routescope advise --prometheus URL --range R [--at T]` against a real Prometheus scraping a traffic exporter.

The exporter (tests/advise/standin.py) counts a known traffic at a known pace, as a routescope
without the traffic decode-rows counter did: the counts over a range can be checked against what
was counted, and the mixed batches' decode rows are estimated (said in the notes). Prometheus, its
HTTP API, increase() over the range and the CLI are the real ones. The same route over real
`serve --demo` processes, decode rows exact, is tests/dashboards/test_e2e_demo.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from typer.testing import CliRunner

from advise.report import AdviceOut
from advise.sources import MIXED_ESTIMATE
from routescope.cli import build_app
from tests.promserver import free_port, start_prometheus

from .fixtures import demo_entries
from .standin import TrafficExporter

pytestmark = pytest.mark.slow
STEP_S = 0.1
RANGE_S = 2.0


def test_traffic_over_a_time_range(tmp_path):
    entries = demo_entries(steps=600, scaled=False)
    per_step = {m: sum(e["calls"] for e in entries if e["model"] == m) for m in {e["model"] for e in entries}}
    exporter = TrafficExporter(entries).start(free_port())
    stop = threading.Event()

    def count():
        while not stop.wait(STEP_S):
            exporter.step()

    ticker = threading.Thread(target=count, daemon=True)
    try:
        with start_prometheus(tmp_path, targets={"routescope": [f"127.0.0.1:{exporter.port}"]},
                              scrape_interval="500ms") as prom:
            ticker.start()
            prom.wait_for(lambda: float(prom.query("sum(count_over_time(routescope_traffic_calls_total[3s]))"
                                                   "/ count(routescope_traffic_calls_total)")["result"][0]["value"][1]) >= 5
                          if prom.query("routescope_traffic_calls_total")["result"] else False,
                          timeout=30, what="five scrapes of the traffic counters in the last 3 s")
            busy_end = time.time()
            stop.set()
            ticker.join()
            prom.wait_for(lambda: time.time() > busy_end + RANGE_S + 0.6, timeout=10)
            idle_end = time.time()
            busy = CliRunner().invoke(build_app(), ["advise", "--prometheus", prom.url, "--range", f"{RANGE_S:.0f}s",
                                                    "--at", f"{busy_end:.3f}", "--json"])
            idle = CliRunner().invoke(build_app(), ["advise", "--prometheus", prom.url, "--range", f"{RANGE_S:.0f}s",
                                                    "--at", f"{idle_end:.3f}", "--json"])
    finally:
        stop.set()
        exporter.stop()
    assert busy.exit_code == 0, busy.output
    out = AdviceOut.model_validate(json.loads(busy.output))
    assert out.status == "ok" and out.source.kind == "prometheus" and out.source.span_s == RANGE_S
    assert out.tables[0].name == "h200-sweep-cupti" and not out.target.what_if  # the exporter says sm90
    calls = {m.model: m.calls for m in out.models}
    steps = RANGE_S / STEP_S
    for model, n in per_step.items():  # increase() extrapolates to the range's edges: about, not exactly
        assert 0.4 * steps * n <= calls[model] <= 1.6 * steps * n, (model, calls[model], steps * n)
    glm = next(m for m in out.models if m.model == "GLM-5.3-Flash")
    assert glm.decode_in_prefill.calls > 0 and glm.decode_in_prefill.cost_per_hour.mid > 0
    assert any("increase()" in n for n in out.notes)
    assert MIXED_ESTIMATE in out.notes  # no routescope_traffic_decode_rows_total here: the estimate, said so
    assert idle.exit_code == 0, idle.output
    assert AdviceOut.model_validate(json.loads(idle.output)).status == "no_traffic"  # nothing counted in that range
