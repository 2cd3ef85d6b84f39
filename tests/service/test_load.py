"""Bounded loopback load: 8 clients on /metrics and /routing for 20 s while the demo runs (`routescope bench serve`).

Prints latency figures (not asserted against wall-clock bounds: a shared 2-core machine is
too noisy for that) and checks that nothing is lost: every request answers 200, and after
the demo's last call the demo's own counters equal telemetry's, in /routing and in /metrics.
The clients are the benchmark's own (``service.bench.run_load``), so this test keeps it working.
"""

from __future__ import annotations

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from routescope.cli import build_app

from service.bench import Load, quantile, render, run_load, summary
from tests.service.live import Served

pytestmark = pytest.mark.slow
CALLS = 450  # demo calls (prefill + decode entry) before it stops by itself: about 20 s at duty 0.5 on 2 cores
CLIENTS = 8  # concurrent scrapers, half on /metrics, half on /routing
LOAD_S = 20.0


def total(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _metrics_after(s: Served, calls: int, timeout: float = 10.0) -> str:
    """/metrics once it holds ``calls`` prefill calls: its kept encoding may be up to two flush intervals old."""
    deadline = time.monotonic() + timeout
    while True:
        text = s.get("/metrics").text
        if total(text, "routescope_calls_total") >= calls or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_concurrent_scrapes_while_the_demo_runs_lose_nothing(tmp_path):
    s = Served("--demo", log=tmp_path / "serve.log",
               env={"ROUTESCOPE_DEMO_LIMIT": str(CALLS), "ROUTESCOPE_DEMO_DUTY": "0.5"}).wait_ready()
    try:
        load = run_load(s.base, clients=CLIENTS, seconds=LOAD_S)
        during = s.get("/routing").json()["demo"]
        cli = CliRunner().invoke(build_app(), ["bench", "serve", "--url", s.base, "--seconds", "1", "--clients", "2",
                                               "--path", "/routing", "--json"])
        final = s.wait_for(lambda b: b["demo"]["state"] != "running", 120, "the demo's last call")
        metrics = _metrics_after(s, final["demo"]["prefill_calls"])
    finally:
        s.stopped_cleanly()

    print("\nload (2-core CPU): " + "\n".join(render(load, CLIENTS, during)))
    assert cli.exit_code == 0, cli.output
    figures = json.loads(cli.output)
    assert figures["clients"] == 2 and [p["path"] for p in figures["paths"]] == ["/routing"]
    assert figures["paths"][0]["requests"] > 0 and figures["failures"] == []
    assert not load.failures, load.failures[:5]
    assert all(len(xs) >= 10 for xs in load.latencies.values())
    demo = final["demo"]
    assert demo["state"] == "finished" and demo["errors"] == 0, demo
    assert demo["prefill_calls"] + demo["decode_path_calls"] == CALLS
    assert sum(r["calls"] for r in final["counts"]) == demo["prefill_calls"]
    assert sum(r["rows"] for r in final["counts"]) == demo["prefill_rows"]
    assert sum(r["calls"] for r in final["decode_path"]) == demo["decode_path_calls"]
    assert total(metrics, "routescope_calls_total") == demo["prefill_calls"]
    assert total(metrics, "routescope_decode_path_calls_total") == demo["decode_path_calls"]
    assert total(metrics, "routescope_telemetry_dropped_total") == 0
    assert total(metrics, "routescope_telemetry_errors_total") == 0


def test_the_figures_are_nearest_rank_quantiles():
    xs = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert quantile(xs, 0.5) == 0.050 and quantile(xs, 0.99) == 0.099 and quantile([0.3], 0.99) == 0.3
    assert quantile(xs, 1.0) == 0.1 and quantile(xs, 0.0) == 0.001 and quantile(xs, 0.995) == 0.1
    with pytest.raises(ValueError):
        quantile([], 0.5)
    load = Load(seconds=2.0, latencies={"/routing": xs, "/metrics": []}, failures=["/metrics: HTTP 503"])
    rows = {r["path"]: r for r in summary(load)}
    assert rows["/routing"]["p99_ms"] == pytest.approx(99) and rows["/routing"]["per_s"] == 50
    assert rows["/metrics"] == {"path": "/metrics", "requests": 0}
    lines = render(load, 8, {"state": "running", "prefill_calls": 3, "decode_path_calls": 4})
    assert lines[0] == "8 clients for 2.0 s; demo running, 3 prefill-entry and 4 decode-entry calls so far"
    assert "p50    50.0 ms" in lines[1] and lines[-1] == "  1 failed, first: /metrics: HTTP 503"
