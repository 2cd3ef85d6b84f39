"""A live `routescope serve` on an ephemeral loopback port: banner, endpoints, promtool, flags, clean stop."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from tests.service.live import Served, routescope_exe

pytestmark = pytest.mark.slow
PROMTOOL = shutil.which("promtool")


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    s = Served("--demo", log=tmp_path_factory.mktemp("live") / "serve.log").wait_ready()
    yield s
    s.stopped_cleanly()


def test_banner_lists_the_urls_and_the_scale(demo_server):
    text = demo_server.text()
    for path in ("/", "/routing", "/metrics", "/docs"):
        assert f"{demo_server.base}{path}\n" in text
    assert "per-row work scaled down 1/4096" in text and "GLM decode bug off" in text


def test_live_routing_within_seconds(demo_server):
    body = demo_server.wait_for(lambda b: sum(r["calls"] for r in b["counts"]) > 0, 30, "demo calls in /routing")
    assert body["demo"]["state"] == "running" and body["demo"]["glm_bug"] is False
    assert demo_server.get("/").status_code == 200 and demo_server.get("/healthz").json() == {"status": "ok"}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")
def test_metrics_pass_promtool(demo_server):
    demo_server.wait_for(lambda b: b["latency"], 30, "timed calls")
    r = demo_server.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out = subprocess.run([PROMTOOL, "check", "metrics"], input=r.content, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert samples(r.text, "routescope_calls_total") and samples(r.text, "routescope_call_duration_seconds_bucket")
    assert samples(r.text, "routescope_http_requests_total")


def test_metrics_openmetrics_parses_strictly(demo_server):
    """promtool reads only the text format; OpenMetrics is checked by prometheus_client's strict parser."""
    r = demo_server.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    names = {f.name for f in parse_openmetrics(r.text)}
    assert {"routescope_calls", "routescope_call_duration_seconds", "routescope_http_requests"} <= names


def test_flags_reach_labels_policy_and_multiprocess_files(tmp_path):
    from tests.telemetry.test_multiprocess import finish, spawn, wait_ready

    mp = tmp_path / "mp"
    mp.mkdir()
    worker = spawn(mp, "5", 600)  # another rank's process (as a vLLM worker would be) writing to the same directory
    try:
        wait_ready(worker)
        s = Served(
            "--demo", "--demo-glm-bug", "--rank", "3", "--model", "custom-model", "--gfx942-min-rows", "1024",
            "--gfx950-min-rows", "2048", "--guard", "observe", "--multiproc-dir", str(mp), "--log-level", "warning",
            log=tmp_path / "serve.log",
        ).wait_ready()
        try:
            body = s.wait_for(lambda b: any(r["model"] == "GLM-5.3-Flash" and r["calls"] for r in b["decode_in_prefill"]["counts"]),
                              60, "decode-in-prefill from the GLM bug")
            assert body["service"]["rank"] == "3" and body["policy"]["gfx942_min_rows"] == 1024
            assert body["service"]["models"] == ["custom-model", "DeepSeek-V4.1-Flash", "GLM-5.3-Flash"]
            assert "1024-2047" in body["rows_buckets"] and "2048-4095" in body["rows_buckets"]
            text = s.get("/metrics").text
            dip = samples(text, "routescope_decode_in_prefill_calls_total")
            dip3 = [x for x in dip if x.labels["rank"] == "3"]  # the demo's; rank 5 is the worker's
            assert dip3 and {x.labels["model"] for x in dip3} == {"GLM-5.3-Flash"} and {x.labels["rank"] for x in dip} == {"3", "5"}
            gates = {(x.labels["gate"], x.labels["policy"]): x.value for x in samples(text, "routescope_gate_threshold_rows")}
            assert gates[("gfx942_min_rows", "active")] == 1024 and gates[("gfx950_min_rows", "active")] == 2048
            assert any(p.name.endswith(".db") for p in mp.iterdir())  # multiprocess files written
            # /routing shows every process's series: the worker's calls (its models) beside the demo's
            assert body["scope"] == {"series": "every process", "decisions": "this process", "health": "this process"}
            worker_models = {"glm", "dsv4", "unknown"}  # the demo's are the service's models
            assert sum(r["calls"] for r in body["counts"] if r["model"] in worker_models) == 600
            assert sum(x.value for x in samples(text, "routescope_calls_total") if x.labels["rank"] == "5") == 600
            assert "Uvicorn running" not in s.text()  # --log-level warning quiets uvicorn's info lines
        finally:
            s.stopped_cleanly(signal.SIGINT, info_logged=False)
    finally:
        finish(worker)


def test_busy_port_and_bad_flags_exit_2_with_a_message(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run(routescope_exe() + ["serve", "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "already in use" in r.stderr
    r = subprocess.run(routescope_exe() + ["serve", "--multiproc-dir", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = subprocess.run(routescope_exe() + ["serve", "--port", "70000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--port" in r.stderr
    r = subprocess.run(routescope_exe() + ["serve", "--guard", "nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
