"""The per-rank /metrics server (routescope/vllm/rank_server.py): loopback by default, a request head within the
head timeout, a connection cap that idle sockets cannot lock a scraper out of, accept errors counted and logged
once a minute. Real sockets, a real prometheus_client registry; vLLM plays no part."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from routescope.vllm import export, rank_server

from ..sockets import closed_by_server, sample


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("routescope_calls", "calls", registry=reg).inc(3)
    return reg


def scrape(port: int, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()




def test_the_default_address_is_loopback(registry, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = []
    monkeypatch.setattr(rank_server, "start", lambda p, **kw: started.append((p, kw["addr"])) or _Stub())
    export._servers.clear()
    from dispatcher import Policy, what_if

    tel = export.make_telemetry(platform=what_if("cpu"), policy=Policy(), model=None, rank="2",
                                env={export.PORT_BASE_ENV: str(port)})
    tel.close()
    export._servers.clear()
    assert started == [(port + 2, "127.0.0.1")]


class _Stub:
    def shutdown(self) -> None:
        pass

    def server_close(self) -> None:
        pass


def test_slow_and_silent_heads_are_closed_after_the_head_timeout(registry):
    server = rank_server.start(0, registry=registry, head_timeout_s=1.5)
    port = server.server_address[1]
    try:
        slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(10)]
        silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
        start = time.monotonic()
        for s in slow:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
        for i in range(3):  # a header line every 0.3 s: the head never ends in time
            time.sleep(0.3)
            for s in slow:
                s.sendall(f"X-Slow-{i}: 1\r\n".encode())
        assert all(closed_by_server(s, 3.0) for s in slow + silent)
        assert 1.0 < time.monotonic() - start < 4.5
        for s in slow + silent:
            s.close()
        text = scrape(port)
        assert "routescope_calls_total 3.0" in text
        assert sample(text, 'routescope_http_connections_closed_total{reason="head_timeout"}') >= 15
    finally:
        server.shutdown()
        server.server_close()


def test_idle_sockets_past_the_cap_cannot_lock_a_scraper_out(registry):
    server = rank_server.start(0, registry=registry, head_timeout_s=30.0, max_connections=8)
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
    try:
        time.sleep(0.3)
        answered = 0
        for _ in range(10):
            try:
                answered += "routescope_calls_total 3.0" in scrape(port, timeout=2.0)
            except OSError:
                pass
        assert answered >= 9
        text = scrape(port)
        assert sample(text, 'routescope_http_connections_closed_total{reason="over_capacity"}') >= 40 - 8
        assert sum(not closed_by_server(s, 0.01) for s in idle) <= 8  # the rest were closed to make room
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()


ACCEPTOR = textwrap.dedent("""
    import logging, sys, time
    from prometheus_client import CollectorRegistry
    from routescope.vllm import rank_server
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    server = rank_server.start(0, registry=CollectorRegistry())
    print(server.server_address[1], flush=True)
    held = []
    try:
        while True:  # every descriptor taken: the next accept fails with EMFILE
            held.append(open("/dev/null"))
    except OSError:
        pass
    print("full", flush=True)
    time.sleep(2.5)
    for f in held:
        f.close()
    print(int(server.accept_errors._value.get()), flush=True)
""")


def test_accept_errors_are_counted_logged_once_and_do_not_spin():
    """A real out-of-descriptors listener: about one failed accept every half second (prometheus_client's own
    server would spin), each counted, one log line."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", ACCEPTOR], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    clients = []
    try:
        port = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "full"
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        out, err = proc.communicate(timeout=60)
    finally:
        for c in clients:
            c.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    failures = int(out.strip())
    assert 2 <= failures <= 10, (failures, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "could not accept a connection" in lines[0], err
