"""HTTP hardening: bounded numbers, known arches, 414 over a real socket, trusted Host names, HEAD, /docs offline."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.models import MAX_ROWS, MAX_TOPK
from service.settings import ServiceSettings
from tests.service.live import Served

LOOPBACK = "http://127.0.0.1"


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(ServiceSettings(flush_interval_s=0.2)), base_url=LOOPBACK) as c:
        yield c


@pytest.mark.parametrize(("query", "param"), [
    ("rows=0", "rows"), (f"rows={MAX_ROWS + 1}", "rows"), (f"rows={10**30}", "rows"), ("rows=-5", "rows"),
    (f"gfx942_min_rows={10**20}", "gfx942_min_rows"), ("rows=8&gfx942_min_rows=-1", "gfx942_min_rows"),
    (f"rows=8&gfx950_min_rows={MAX_ROWS + 1}", "gfx950_min_rows"), (f"rows=8&topk={MAX_TOPK + 1}", "topk"),
    ("rows=8&topk=0", "topk"), ("rows=8&heads=1025", "heads"), ("rows=8&spec_tokens=65", "spec_tokens"),
    ("query_lens=1,0", "query_lens"), (f"query_lens={MAX_ROWS + 1}", "query_lens"),
    (f"query_lens={MAX_ROWS},1", "query_lens"), ("rows=8&arch=gfx9999", "arch"),
])
def test_out_of_bounds_is_422_naming_the_parameter(client, query, param):
    r = client.get(f"/routing/explain?{query}")
    assert r.status_code == 422, r.text
    assert param in [p.strip() for item in r.json()["detail"] for p in (item["parameter"] or "").split(",")], r.json()


@pytest.mark.parametrize("query", [f"rows={MAX_ROWS}", f"rows=8&gfx942_min_rows={MAX_ROWS}", f"rows=8&topk={MAX_TOPK}",
                                   "rows=8&gfx942_min_rows=0", "rows=1", "query_lens=1,1,8000"])
def test_at_the_bounds_is_200(client, query):
    assert client.get(f"/routing/explain?{query}").status_code == 200


def test_unknown_arch_only_when_asked(client):
    r = client.get("/routing/explain?rows=2048&arch=gfx9999&allow_unknown_arch=true")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["platform"]["arch"] == "gfx9999" and body["platform"]["what_if"]
    assert body["request"]["allow_unknown_arch"] is True  # as `routescope explain --allow-unknown-arch --json` says
    assert client.get("/routing/explain?rows=2048&arch=GFX942").status_code == 200  # known, any case


@pytest.mark.parametrize(("allowed", "host", "status"), [
    (None, "127.0.0.1:9475", 200), (None, "localhost", 200), (None, "[::1]:9475", 200),
    (None, "evil.example", 400), (None, "127.0.0.1.nip.io", 400),
    (["metrics.example.com"], "metrics.example.com:9475", 200), (["metrics.example.com"], "127.0.0.1", 400),
    (["*"], "anything.example", 200),
])
def test_host_header_checked(allowed, host, status):
    with TestClient(create_app(ServiceSettings(allowed_hosts=allowed)), base_url=LOOPBACK) as c:
        assert c.get("/healthz", headers={"host": host}).status_code == status


def test_any_host_when_bound_off_loopback():
    with TestClient(create_app(ServiceSettings(host="0.0.0.0")), base_url=LOOPBACK) as c:
        assert c.get("/healthz", headers={"host": "node7.cluster:9475"}).status_code == 200


@pytest.mark.parametrize("path", ["/", "/healthz", "/readyz", "/metrics", "/routing", "/routing/explain?rows=8",
                                  "/openapi.json", "/docs", "/static/swagger-ui/swagger-ui.css", "/nope"])
def test_head_wherever_get(client, path):
    get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert client.post(path).status_code in (404, 405)


def test_docs_assets_come_from_this_server(client):
    html = client.get("/docs").text
    assert "/static/swagger-ui/swagger-ui-bundle.js" in html and "/static/swagger-ui/swagger-ui.css" in html
    assert "cdn" not in html.lower() and "https://" not in html
    js = client.get("/static/swagger-ui/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 500_000
    assert client.get("/redoc").status_code == 404  # its page would load from a CDN: not served


def test_without_the_swagger_bundle_only_docs_is_unavailable(monkeypatch, caplog):
    """An image that left swagger-ui-bundle-v2 out still serves /routing and /metrics; /docs says what is missing."""
    import service.app

    monkeypatch.setattr(service.app, "swagger_ui_dir", lambda: None)
    with caplog.at_level("WARNING", logger="routescope.service"):
        app = create_app(ServiceSettings(flush_interval_s=0.2))
    assert "swagger-ui-bundle-v2 is not installed" in caplog.text
    with TestClient(app, base_url=LOOPBACK) as c:
        docs = c.get("/docs")
        assert docs.status_code == 503 and "pip install swagger-ui-bundle-v2" in docs.text
        assert c.get("/static/swagger-ui/swagger-ui.css").status_code == 404
        for path in ("/routing", "/metrics", "/openapi.json", "/"):
            assert c.get(path).status_code == 200, path


def _raw_get(port: int, target: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


@pytest.mark.slow
def test_live_server_414_and_offline_docs(tmp_path):
    s = Served(log=tmp_path / "serve.log").wait_ready()
    try:
        status, body = _raw_get(s.port, "/routing/explain?rows=8&pad=" + "a" * 650_000)  # 650 kB: no reset, a 414
        assert status == 414 and b"URI too long" in body
        assert _raw_get(s.port, "/routing/explain?rows=8&pad=" + "a" * 9_000)[0] == 414
        assert _raw_get(s.port, "/routing/explain?rows=8&heads=" + "1" * 7_000)[0] == 422  # under the limit: validated
        assert _raw_get(s.port, "/healthz")[0] == 200  # the server is still fine
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium:  # this machine has no internet: Swagger UI renders only if its files come from the server
            out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                                  "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
                                  "--virtual-time-budget=8000", "--dump-dom", f"{s.base}/docs"],
                                 capture_output=True, text=True, timeout=120)
            assert "opblock" in out.stdout and "/routing/explain" in out.stdout, out.stdout[-2000:]
    finally:
        s.stopped_cleanly()
