"""Liveness never waits for a scrape: /healthz and /readyz answer within 50 ms p99 while 32 scrapers (16 text, 16
protobuf) hammer /metrics of `routescope serve` over an 8-process directory (about 1.1 MB of text a scrape).

The scrapers run in their own process, so this process's probes meet no client-side GIL; each probe opens a fresh
connection, as a kubelet's does."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from dispatcher import Dispatcher, Policy, what_if
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.load_writer import wide_mix
from telemetry.bench.workload import make_calls, noop_registry

from ..service.live import Served

ROOT = Path(__file__).resolve().parents[2]
STORM_S = 8.0

STORM = textwrap.dedent("""
    import sys, threading, time
    from service.load import METRICS_PROTOBUF, METRICS_TEXT, run_clients
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    load = run_clients("127.0.0.1", port, [(METRICS_TEXT,)] * 16 + [(METRICS_PROTOBUF,)] * 16, seconds=seconds)
    print(len(load.latencies["/metrics text"]), len(load.latencies["/metrics protobuf"]), len(load.failures),
          flush=True)
""")


def eight_processes(path: Path) -> None:
    """Eight processes' files, each written by a real Telemetry after the load bench writers' calls."""
    for rank in range(8):
        tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), multiproc_dir=str(path), rank=str(rank),
                                        flush_on_exit=False, log_first_decode_in_prefill=False),
                        platform=what_if("gfx942"), policy=Policy())
        d = tel.instrument(Dispatcher(platform=what_if("gfx942"), policy=Policy(), registry=noop_registry()))
        for args, kw in make_calls(1500, mix=wide_mix()):
            d(*args, **kw)
        tel.flush()
        tel.close()


def probe(port: int, path: str) -> float | None:
    """Seconds for a fresh connection's GET to answer 200; None if it failed."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        reply.read()
        return time.perf_counter() - start if reply.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def p99(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_healthz_and_readyz_answer_within_50_ms_under_a_scrape_storm(tmp_path):
    mp = tmp_path / "mp"
    mp.mkdir()
    eight_processes(mp)
    served = Served("--multiproc-dir", str(mp), log=tmp_path / "serve.log").wait_ready()
    try:
        size = len(served.get("/metrics").content)
        assert size > 900_000, size  # the directory is the audit's size
        storm = subprocess.Popen([sys.executable, "-c", STORM, str(served.port), str(STORM_S)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(1.0)  # the storm is on
        times: dict[str, list[float]] = {"/healthz": [], "/readyz": []}
        failed = 0
        until = time.monotonic() + STORM_S - 2.0
        while time.monotonic() < until:
            for path, xs in times.items():
                took = probe(served.port, path)
                if took is None:
                    failed += 1
                else:
                    xs.append(took)
                time.sleep(0.01)
        text, protobuf, storm_failed = (int(x) for x in storm.communicate(timeout=60)[0].split())
    finally:
        served.stop()
    print(f"\nstorm: {text} text and {protobuf} protobuf scrapes; probes p99 "
          + ", ".join(f"{p} {p99(xs) * 1e3:.1f} ms ({len(xs)})" for p, xs in times.items()))
    assert text >= 16 and protobuf >= 16 and storm_failed == 0  # the scrapes did happen, and all answered
    assert failed == 0
    for path, xs in times.items():
        assert len(xs) >= 100 and p99(xs) <= 0.050, (path, p99(xs), len(xs))
