"""Bounded connections for `routescope serve`: a request head must come in time, and open sockets stay under a cap.

uvicorn 0.55 closes a connection only through its keep-alive timer, which starts after a response and stops at the
first byte of the next request: a socket that sends nothing, or a head one line at a time, is held forever, and
enough of them exhaust the process's file descriptors (asyncio then logs "socket.accept() out of system resource"
with a traceback at every retry). Its own settings do not bound this: ``limit_concurrency`` answers 503 to requests
past the limit but still accepts and holds every socket that sends none; ``timeout_keep_alive`` never runs before a
first response; ``h11_max_incomplete_event_size`` bounds a head's bytes, not its time. So here, on uvicorn's h11
protocol:

- a connection waiting for a request head (just opened, or after a response) is closed ``head_timeout_s`` later
  (within ``SWEEP_S``) unless a whole head has arrived (counted: ``head_timeout``);
- at most ``cap`` connections are open, below the file limit (``connection_cap``; the soft limit is raised to the
  hard one first, ``raise_nofile``); one more closes the connection that has waited longest for a head (counted:
  ``over_capacity``), so idle sockets cannot lock out a probe that sends its request at once; with none waiting,
  the new one is closed at once;
- accept errors (``accept_errors``) are counted and logged one line a minute, without a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("routescope.service")

DEFAULT_HEAD_TIMEOUT_S = 5.0  # uvicorn's keep-alive default: a scraper or a browser sends its head in milliseconds
DEFAULT_MAX_CONNECTIONS = 1000
FD_RESERVE = 64  # descriptors kept for everything but client sockets (directory files, logs, the listener)
LOG_EVERY_S = 60.0
SWEEP_S = 0.25  # how often waiting connections are checked against the head timeout (its precision)
_ACCEPT_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def raise_nofile() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to its hard one (each connection holds one descriptor); (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the kernel caps lower
            log.warning("routescope: could not raise the open-file limit from %d to %s (%s)", soft, hard, exc)
    return soft, hard


def connection_cap(max_connections: int, soft_limit: int, reserve: int = FD_RESERVE) -> int:
    """Open connections allowed: ``max_connections``, but at most the soft file limit less ``reserve`` (and >= 1)."""
    if soft_limit == resource.RLIM_INFINITY or soft_limit < 0:
        return max_connections
    return max(1, min(max_connections, soft_limit - reserve))


class _Every:
    """One log line per ``interval_s`` at most; the next says how many it held back."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self._interval, self._clock = interval_s, clock
        self._last: float | None = None
        self.held = 0

    def due(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            self.held += 1
            return False
        self._last = now
        return True

    def take_held(self) -> int:
        held, self.held = self.held, 0
        return held


class ConnectionBounds:
    """The head timeout, the cap and their counts, shared by every connection of one server (event-loop thread)."""

    def __init__(self, registry: CollectorRegistry, *, head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, soft_limit: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if soft_limit is None else soft_limit
        self.head_timeout_s = head_timeout_s
        self.cap = connection_cap(max_connections, soft)
        self.open = 0
        self.waiting: OrderedDict[Any, float] = OrderedDict()  # waiting for a head since (clock), oldest first
        self._clock = clock
        self._sweeping = False
        self.closed = Counter("routescope_http_connections_closed", "Connections the server closed itself: a request "
                              "head not in within the head timeout, or one connection past the cap.",
                              ["reason"], registry=registry)
        for reason in ("head_timeout", "over_capacity"):
            self.closed.labels(reason)
        self.accept_errors = Counter("routescope_http_accept_errors", "New connections the server could not accept "
                                     "(out of file descriptors or memory).", registry=registry)
        Gauge("routescope_http_connections", "Client connections open now.", registry=registry).set_function(
            lambda: self.open)
        Gauge("routescope_http_connection_limit", "Open client connections allowed (below the file limit).",
              registry=registry).set(self.cap)
        self._logs = {k: _Every(LOG_EVERY_S, clock) for k in ("head_timeout", "over_capacity", "accept")}

    def _close(self, protocol: Any, reason: str) -> None:
        self.stop_waiting(protocol)
        self.closed.labels(reason).inc()
        transport = protocol.transport
        if transport is not None and not transport.is_closing():
            transport.close()
        self._note(reason, "closed a connection: " + ("no request head within %.1f s" % self.head_timeout_s
                                                       if reason == "head_timeout" else
                                                       f"{self.cap} connections open (the cap)"))

    def _note(self, kind: str, what: str) -> None:
        every = self._logs[kind]
        if every.due():
            held = every.take_held()
            more = f" ({held} more since the last such line)" if held else ""
            log.warning("routescope serve: %s%s; counted in routescope_http_%s_total, logged once a minute",
                        what, more, "accept_errors" if kind == "accept" else "connections_closed")

    def opened(self, protocol: Any) -> bool:
        """A new connection: room is made by closing the one waiting longest for a head; False if it was closed."""
        self.open += 1
        if self.open > self.cap:
            victim = next(iter(self.waiting), None)
            if victim is None:
                self._close(protocol, "over_capacity")
                return False
            self._close(victim, "over_capacity")
        return True

    def lost(self, protocol: Any) -> None:
        self.stop_waiting(protocol)
        self.open -= 1

    def wait_for_head(self, protocol: Any, loop: asyncio.AbstractEventLoop) -> None:
        """The connection waits for a request head from now on (opened, or its last response sent)."""
        if protocol not in self.waiting:
            self.waiting[protocol] = self._clock()
            if not self._sweeping:
                self._sweeping = True
                loop.call_later(SWEEP_S, self._sweep, loop)

    def stop_waiting(self, protocol: Any) -> None:
        self.waiting.pop(protocol, None)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections waiting for a head longer than the timeout (oldest first: stop at the first
        younger one); one timer for them all, not one per request."""
        limit = self._clock() - self.head_timeout_s
        while self.waiting:
            protocol, since = next(iter(self.waiting.items()))
            if since > limit:
                break
            self._close(protocol, "head_timeout")
        if self.waiting:
            loop.call_later(SWEEP_S, self._sweep, loop)
        else:
            self._sweeping = False

    def accept_error_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler: accept failures counted and logged once a minute; others as before."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRNOS and "socket" in context:
            self.accept_errors.inc()
            self._note("accept", f"could not accept a connection ({exc.strerror or exc}); "
                                 "asyncio retries in 1 s")
            return
        loop.default_exception_handler(context)


def bounded_h11(base: type[H11Protocol], bounds: ConnectionBounds) -> type[H11Protocol]:
    """``base`` (uvicorn's h11 protocol or a subclass) under ``bounds``: the head timeout and the connection cap."""

    class BoundedH11Protocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if bounds.opened(self):
                self._track()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._track()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._track()

        def connection_lost(self, exc: Exception | None) -> None:
            bounds.lost(self)
            super().connection_lost(exc)

        def _track(self) -> None:
            """Waiting for a head: no request yet, or the last one answered (a pipelined next one starts a cycle)."""
            if self.transport.is_closing():
                bounds.stop_waiting(self)
            elif self.cycle is None or self.cycle.response_complete:
                bounds.wait_for_head(self, self.loop)
            else:
                bounds.stop_waiting(self)

    return BoundedH11Protocol


class BoundedServer(uvicorn.Server):
    """uvicorn's server whose event loop counts accept errors and logs them once a minute (no traceback)."""

    def __init__(self, config: uvicorn.Config, bounds: ConnectionBounds) -> None:
        super().__init__(config)
        self._bounds = bounds

    async def startup(self, sockets: list | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(self._bounds.accept_error_handler)
        await super().startup(sockets)
