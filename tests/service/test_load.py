"""Bounded loopback load: concurrent scrapes of /metrics and /routing while the demo runs.

Prints latency figures (not asserted against wall-clock bounds: a shared 2-core machine is
too noisy for that) and checks that nothing is lost: every request answers 200, and after
the demo's last call the demo's own counters equal telemetry's, in /routing and in /metrics.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.service.live import Served

pytestmark = pytest.mark.slow
CALLS = 300  # demo calls (prefill + decode entry) before it stops by itself
CLIENTS = 8  # concurrent scrapers, half on /metrics, half on /routing
MAX_LOAD_S = 45.0


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def total(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_concurrent_scrapes_while_the_demo_runs_lose_nothing(tmp_path):
    s = Served("--demo", log=tmp_path / "serve.log",
               env={"ROUTESCOPE_DEMO_LIMIT": str(CALLS), "ROUTESCOPE_DEMO_DUTY": "0.5"}).wait_ready()
    lat: dict[str, list[float]] = {"/metrics": [], "/routing": []}
    failures: list[str] = []
    stop = threading.Event()

    def scrape(path: str) -> None:
        with httpx.Client(base_url=s.base, timeout=30) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = c.get(path)
                    if r.status_code != 200:
                        failures.append(f"{path}: {r.status_code}")
                except httpx.HTTPError as exc:
                    failures.append(f"{path}: {exc!r}")
                    continue
                lat[path].append(time.perf_counter() - t0)

    try:
        threads = [threading.Thread(target=scrape, args=(("/metrics", "/routing")[i % 2],)) for i in range(CLIENTS)]
        t_start = time.monotonic()
        for t in threads:
            t.start()
        with httpx.Client(base_url=s.base, timeout=30) as c:
            while time.monotonic() - t_start < MAX_LOAD_S:
                demo = c.get("/routing").json()["demo"]
                if demo["state"] != "running":
                    break
                time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(60)
        load_s = time.monotonic() - t_start
        final = s.wait_for(lambda b: b["demo"]["state"] != "running", 120, "the demo's last call")
        metrics = s.get("/metrics").text
    finally:
        s.stopped_cleanly()

    demo = final["demo"]
    print(f"\nload: {CLIENTS} clients for {load_s:.1f} s while the demo made {demo['prefill_calls']} prefill-entry "
          f"and {demo['decode_path_calls']} decode-entry calls ({demo['prefill_rows']} rows, 2-core CPU)")
    for path, xs in lat.items():
        print(f"  {path:9s} {len(xs):5d} requests  p50 {statistics.median(xs) * 1e3:7.1f} ms  "
              f"p99 {quantile(xs, 0.99) * 1e3:7.1f} ms  max {max(xs) * 1e3:7.1f} ms  {len(xs) / load_s:6.1f} req/s")
    assert not failures, failures[:5]
    assert all(len(xs) >= 10 for xs in lat.values())
    assert demo["state"] == "finished" and demo["errors"] == 0, demo
    assert demo["prefill_calls"] + demo["decode_path_calls"] == CALLS
    assert sum(r["calls"] for r in final["counts"]) == demo["prefill_calls"]
    assert sum(r["rows"] for r in final["counts"]) == demo["prefill_rows"]
    assert sum(r["calls"] for r in final["decode_path"]) == demo["decode_path_calls"]
    assert total(metrics, "routescope_calls_total") == demo["prefill_calls"]
    assert total(metrics, "routescope_decode_path_calls_total") == demo["decode_path_calls"]
    assert total(metrics, "routescope_telemetry_dropped_total") == 0
    assert total(metrics, "routescope_telemetry_errors_total") == 0
