"""OTLP export is wired through the standard OTEL_* variables: a loopback receiver gets routescope's metrics."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import ServiceSettings
from tests.service.conftest import wait_demo

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.metric_exporter")


@pytest.fixture
def receiver():
    got: list[tuple[str, str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.append((self.path, self.headers.get("Content-Type", ""), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], got
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_otel_endpoint_turns_on_otlp_export(monkeypatch, receiver):
    port, got = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")
    app = create_app(ServiceSettings(demo=True, demo_limit=60, demo_duty=1.0, flush_interval_s=0.2))
    assert app.state.routescope.telemetry.config.otlp is True
    with TestClient(app, base_url="http://127.0.0.1") as c:
        wait_demo(c)
        assert c.get("/metrics").status_code == 200
    # leaving the client ran the lifespan's shutdown: telemetry closed, the OTLP reader flushed
    metrics = [(p, ct, b) for p, ct, b in got if p == "/v1/metrics"]
    assert metrics, [p for p, _, _ in got]
    assert all(ct == "application/x-protobuf" for _, ct, _ in metrics)
    body = b"".join(b for _, _, b in metrics)
    assert b"routescope_calls" in body and b"DeepSeek-V4.1-Flash" in body


def test_without_otel_variables_nothing_is_exported(client):
    assert client.app.state.routescope.telemetry.config.otlp is False
