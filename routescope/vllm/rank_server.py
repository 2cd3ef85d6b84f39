"""A rank's /metrics server: a WSGI app that negotiates as the service does, on a thread-per-connection server, with bounds.

prometheus_client's ``start_http_server`` reads a request head with no time limit, starts a thread for every
connection it accepts, and ignores accept errors (its loop then spins on a listener it cannot accept from). Inside
a vLLM worker that is a socket anyone who can reach the port may hold forever. Here:

- the request head must arrive within ``head_timeout_s`` of the connection (the socket's timeout is the time left
  before each head line), then each read or write of the answer within ``io_timeout_s``; past it the connection is
  closed and counted (``head_timeout``);
- at most ``max_connections`` are open (and at most the open-file limit less 64); one more closes the connection
  that has waited longest for its head, or itself when none waits (``over_capacity``);
- accept errors are counted, logged one line a minute, and the listener rests half a second before the next try.

The counts are ``routescope_http_connections_closed_total{reason}`` and ``routescope_http_accept_errors_total``, served
beside the rank's own series.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

log = logging.getLogger("vllm.routescope")

DEFAULT_ADDR = "127.0.0.1"
HEAD_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 64  # scrapers, not browsers: one Prometheus needs one
FD_RESERVE = 64
LOG_EVERY_S = 60.0
ACCEPT_PAUSE_S = 0.5
_ACCEPT_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class _Both:
    """The rank's registry, then the server's own counters, as one collector."""

    def __init__(self, *collectors: Collector) -> None:
        self._collectors = collectors

    def collect(self) -> Iterator[Any]:
        for c in self._collectors:
            yield from c.collect()


class _HeadReader:
    """The request's rfile while its head is read: each line within what is left of the head's time."""

    def __init__(self, rfile: Any, sock: socket.socket, head_s: float, io_s: float) -> None:
        self._rfile, self._sock, self._io_s = rfile, sock, io_s
        self._end: float | None = time.monotonic() + head_s

    def readline(self, limit: int = -1) -> bytes:
        if self._end is None:
            return self._rfile.readline(limit)
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError("no request head within the head timeout")
        self._sock.settimeout(left)
        line = self._rfile.readline(limit)
        if line in (b"\r\n", b"\n", b""):  # the head is over (or the peer left): the answer's reads and writes
            self._end = None
            self._sock.settimeout(self._io_s)
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rfile, name)


class BoundedMetricsServer(ThreadingWSGIServer):
    """prometheus_client's threading WSGI server with the head timeout, the connection cap and accept-error counts."""

    request_queue_size = 128  # socketserver's 5 drops a burst's SYNs: its clients wait a second to retry
    head_timeout_s = HEAD_TIMEOUT_S
    io_timeout_s = IO_TIMEOUT_S
    max_connections = MAX_CONNECTIONS
    registry: CollectorRegistry

    def server_activate(self) -> None:
        super().server_activate()
        self._lock = threading.Lock()
        self._open = 0
        self._waiting: OrderedDict[socket.socket, None] = OrderedDict()  # accepted, head not yet in; oldest first
        self._last_log: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self.closed = Counter("routescope_http_connections_closed", "Connections this rank's /metrics server closed "
                              "itself: no request head within the head timeout, or one past the cap.", ["reason"],
                              registry=self.registry)
        for reason in ("head_timeout", "over_capacity"):
            self.closed.labels(reason)
        self.accept_errors = Counter("routescope_http_accept_errors", "New connections this rank's /metrics server "
                                     "could not accept (out of file descriptors or memory).", registry=self.registry)

    def note(self, kind: str, what: str) -> None:
        """One line a minute per kind; the next says how many were held back."""
        now = time.monotonic()
        with self._lock:
            last = self._last_log.get(kind)
            if last is not None and now - last < LOG_EVERY_S:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._last_log[kind] = now
            held = self._held.pop(kind, 0)
        more = f" ({held} more since the last such line)" if held else ""
        log.warning("routescope: /metrics server on port %s %s%s; counted, logged once a minute",
                    self.server_address[1], what, more)

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _ACCEPT_ERRNOS:
                self.accept_errors.inc()
                self.note("accept", f"could not accept a connection ({exc.strerror or exc})")
                time.sleep(ACCEPT_PAUSE_S)  # the listener stays readable: without a rest this loop spins
            raise

    def cap(self) -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or soft < 0:
            return self.max_connections
        return max(1, min(self.max_connections, soft - FD_RESERVE))

    def process_request(self, request: Any, client_address: Any) -> None:
        """Past the cap, room is made by closing the connection waiting longest for its head, else this one."""
        cap = self.cap()
        with self._lock:
            self._open += 1  # close_request takes it back, whichever way the connection ends
            victim = None
            if self._open > cap:
                victim = next(iter(self._waiting), None)
                if victim is not None:
                    del self._waiting[victim]
            refused = self._open > cap and victim is None
            if not refused:
                self._waiting[request] = None
        if refused or victim is not None:
            self.closed.labels("over_capacity").inc()
            self.note("over_capacity", f"closed a connection: {cap} open (the cap)")
        if refused:
            self.shutdown_request(request)
            return
        if victim is not None:
            try:
                victim.shutdown(socket.SHUT_RDWR)  # its thread's read ends; that thread closes it
            except OSError:
                pass
        super().process_request(request, client_address)

    def head_in(self, request: Any) -> None:
        with self._lock:
            self._waiting.pop(request, None)

    def close_request(self, request: Any) -> None:
        with self._lock:
            self._waiting.pop(request, None)
            self._open -= 1
        super().close_request(request)


class _Handler(WSGIRequestHandler):
    """wsgiref's handler, silent, its head read within the server's head timeout."""

    server: BoundedMetricsServer

    def setup(self) -> None:
        super().setup()
        self.rfile = _HeadReader(self.rfile, self.connection, self.server.head_timeout_s, self.server.io_timeout_s)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.head_in(self.connection)
        return ok

    def handle(self) -> None:
        try:
            super().handle()
        except TimeoutError:
            self.server.closed.labels("head_timeout").inc()
            self.server.note("head_timeout", "closed a connection: no request head in time, or a stalled answer")
        except (ConnectionError, OSError):
            pass  # the client left, or the connection was closed to make room

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        """Log nothing per request."""


def start(port: int, *, addr: str = DEFAULT_ADDR, registry: Collector, head_timeout_s: float = HEAD_TIMEOUT_S,
          max_connections: int = MAX_CONNECTIONS, histogram_mode: str = "both") -> BoundedMetricsServer:
    """Serve ``registry`` on ``addr:port`` from a daemon thread, negotiated as ``routescope serve`` does (protobuf with
    native histograms, the histogram mode: telemetry.exposition.wsgi); OSError (a taken port) passes."""
    from telemetry.exposition.wsgi import metrics_app

    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    own = CollectorRegistry()

    class Server(BoundedMetricsServer):
        address_family = family

    Server.head_timeout_s, Server.max_connections, Server.registry = head_timeout_s, max_connections, own
    app = metrics_app(_Both(registry, own), mode=histogram_mode)
    httpd = make_server(addr, port, app, Server, handler_class=_Handler)
    threading.Thread(target=httpd.serve_forever, name=f"routescope-metrics-{port}", daemon=True).start()
    return httpd
