"""Small servers for tests that need a chosen document or series, not a running demo.

``RoutingStandIn`` serves a /routing document (fixture JSON, or routing_view's output) and the page
carrying it: the CLI and chromium read a known traffic without a demo running for minutes.
``TrafficExporter`` exports the traffic counters as a routescope from before
``routescope_traffic_decode_rows_total`` did (calls and rows per entry, decode rows per kernel x
model only), so the Prometheus route's estimate of mixed batches' decode rows stays tested; the
exact route, real telemetry behind real `serve --demo` processes, is tests/dashboards/test_e2e_demo.py.
The CLI, the HTTP clients and Prometheus talking to them are the real ones.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from advise.traffic import TRAFFIC_LABELS
from service.page import page_for

STATIC = Path(__file__).resolve().parents[2] / "service" / "static"


class RoutingStandIn:
    """Serves ``doc`` at /routing (and the page's static files at / and /static/), on a loopback port."""

    def __init__(self, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?")[0]
                if path == "/routing":
                    self._send(200, "application/json", body)
                elif path == "/":  # the page as the service assembles it: inlined files, this document in it
                    self._send(200, "text/html", page_for(STATIC, body).encode())
                elif path.startswith("/static/") and (STATIC / path[8:]).is_file():
                    kind = "text/css" if path.endswith(".css") else "text/javascript"
                    self._send(200, kind, (STATIC / path[8:]).read_bytes())
                else:
                    self._send(404, "text/plain", b"not found")

            def _send(self, code: int, kind: str, data: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RoutingStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class TrafficExporter:
    """Counts the same calls again and again: routescope_traffic_calls/rows and the series advise reads beside
    them, without the traffic decode-rows counter (an older exporter's series)."""

    def __init__(self, entries: list[dict[str, Any]], *, rank: str = "0", arch: str = "sm90") -> None:
        r = self.registry = CollectorRegistry()
        labels = list(TRAFFIC_LABELS) + ["rank"]
        self.calls = Counter("routescope_traffic_calls", "calls", labels, registry=r)
        self.rows = Counter("routescope_traffic_rows", "rows", labels, registry=r)
        self.dip_rows = Counter("routescope_decode_in_prefill_rows", "dip rows", ["kernel", "model", "call_class", "rank"],
                                registry=r)
        gate = Gauge("routescope_gate_threshold_rows", "thresholds", ["gate", "policy"], registry=r)
        gate.labels("gfx942_min_rows", "active").set(512)
        gate.labels("gfx950_min_rows", "active").set(1024)
        Gauge("routescope_build_info", "build", ["version", "arch", "vendor", "aiter", "timing"],
              registry=r).labels("0.1.0", arch, "cuda", "false", "gpu").set(1)
        self.entries, self.rank = entries, rank
        self._server = None

    def step(self, times: int = 1) -> None:
        for e in self.entries:
            key = ["" if e.get(k) is None else str(e[k]) for k in TRAFFIC_LABELS] + [self.rank]
            self.calls.labels(*key).inc(e["calls"] * times)
            self.rows.labels(*key).inc(e["rows"] * times)
            if e["call_class"] in ("mixed", "pure_decode"):
                self.dip_rows.labels(e["kernel"], e["model"], e["call_class"], self.rank).inc(e["decode_rows"] * times)

    def start(self, port: int) -> TrafficExporter:
        self.step()
        self._server, _ = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        self.port = port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
