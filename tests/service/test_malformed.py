"""Requests uvicorn cannot parse: each gets its 400 and a count; the log gets one line per kind and minute, not tracebacks.

The live test drives a real `routescope serve` with its real logging over raw sockets. The filter's
interval is tested alone with an injected clock, since a minute is too long to wait for.
"""

from __future__ import annotations

import logging
import socket

import pytest

from service.protocol import ClientErrorLogFilter
from tests.service.live import Served

BURST = 40  # malformed requests sent back to back


def _exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a fresh connection and read until the server closes it (bounded by the socket timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


def _malformed(i: int) -> bytes:
    """A bad chunk size under a good head on any path (the reported case), or a head that is not HTTP."""
    if i % 4 == 3:
        return b"zz\r\n\r\n"
    path = ("/routing", "/metrics", "/no/such/path")[i % 3]
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            + b"zz\r\n")


def _lines(s: Served) -> list[str]:
    return s.text().splitlines()


@pytest.mark.slow
def test_a_burst_of_malformed_requests_gets_400s_and_one_log_line(tmp_path):
    s = Served(log=tmp_path / "serve.log").wait_ready()
    try:
        before = len(_lines(s))
        for i in range(BURST):
            reply = _exchange(s.port, _malformed(i))
            assert _status(reply) == 400, reply[:200]
            assert len(_lines(s)) - before <= i + 1  # never more than one line per request so far
        upgrade = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\n\r\n"
        for _ in range(5):  # a client-caused warning of another kind: served, and rate-limited on its own
            assert _status(_exchange(s.port, upgrade)) == 200
        assert s.get("/healthz").status_code == 200  # a well-formed request is served after the burst
        metrics = s.get("/metrics").text
        grown = _lines(s)[before:]
    finally:
        s.stopped_cleanly()
    assert "routescope_http_malformed_requests_total 40.0" in metrics
    assert grown == ["WARNING:  Invalid HTTP request received.", "WARNING:  Unsupported upgrade request."], grown
    assert "Traceback" not in s.text() and "unhandled error" not in s.text()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged():
    """A real logger with the filter on it, writing formatted lines to a list; the clock moves when told."""
    clock, lines = _Clock(), []
    logger = logging.getLogger(f"test.client_errors.{id(lines)}")
    logger.propagate = False
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    logger.addFilter(ClientErrorLogFilter(60.0, clock=clock))
    yield logger, clock, lines
    logger.removeHandler(handler)


def test_one_line_per_kind_and_interval_then_a_count_of_the_rest(logged):
    logger, clock, lines = logged
    for _ in range(100):
        logger.warning("Invalid HTTP request received.")
    assert lines == ["Invalid HTTP request received."]
    clock.now += 59.9
    logger.warning("Invalid HTTP request received.")
    assert len(lines) == 1
    clock.now += 0.1
    logger.warning("Invalid HTTP request received.")
    assert lines[1] == "Invalid HTTP request received. (100 more like it since the last such line were not logged)"
    clock.now += 60
    logger.warning("Invalid HTTP request received.")
    assert lines[2] == "Invalid HTTP request received."  # nothing held back since: no count


def test_kinds_are_limited_apart_and_other_lines_pass(logged):
    logger, clock, lines = logged
    logger.warning("Unsupported upgrade request.")
    logger.warning("No supported WebSocket library detected. Please use ...")  # same request, same kind: held
    logger.warning("Invalid HTTP request received.")
    for i in range(3):
        logger.error("Exception in ASGI application %d", i)  # not a client's doing: never held
    assert lines == ["Unsupported upgrade request.", "Invalid HTTP request received.",
                     "Exception in ASGI application 0", "Exception in ASGI application 1",
                     "Exception in ASGI application 2"]
