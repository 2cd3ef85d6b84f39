"""uvicorn's h11 protocol for `routescope serve`: a request it cannot parse costs a 400, a count, a line at most.

uvicorn answers a request it cannot parse (a bad head, a bad chunk size line) with its own 400 and
closes the connection. When the head was good the app is already answering that request, and its
reply meets an h11 connection that has sent its last response: uvicorn then logged two tracebacks,
about 90 lines, for every such request. ``quiet_h11`` treats the app's reply as going nowhere, as
uvicorn does when a client hangs up, and counts the request. ``ClientErrorLogFilter`` lets uvicorn's
one-line warnings about a client's mistakes through at most once per interval, and the next line
it lets through says how many it held back, so no client can fill a disk with them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LOG_EVERY_S = 60.0
# uvicorn's warnings that a client can cause at will (message prefix -> kind); one kind, one line per interval.
CLIENT_ERRORS: Mapping[str, str] = {
    "Invalid HTTP request received": "malformed",
    "Unsupported upgrade request": "upgrade",
    "No supported WebSocket library detected": "upgrade",  # logged right after the line above
}


def quiet_h11(on_malformed: Callable[[], None] = lambda: None) -> type[H11Protocol]:
    """uvicorn's ``H11Protocol`` whose 400 for an unparsable request also ends the app's answer to it, quietly.

    ``on_malformed`` runs once per such request (a counter's ``inc``); if it raises, the 400 still goes out.
    """

    class QuietH11Protocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            try:
                on_malformed()
            except Exception:  # noqa: BLE001 - counting never stands between a client and its 400
                pass
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True  # the app's reply to this request has nowhere to go: drop it
                cycle.message_event.set()  # a receive() waiting for more body gets http.disconnect
            try:
                super().send_400_response(msg)
            except h11.LocalProtocolError:  # the app had already started its reply: close, no second one
                self.transport.close()

    return QuietH11Protocol


class ClientErrorLogFilter(logging.Filter):
    """Passes each kind of client-caused warning (``CLIENT_ERRORS``) at most once per ``interval_s``; others untouched.

    The next line of a kind after a quiet spell ends with how many of that kind were held back.
    """

    def __init__(self, interval_s: float = LOG_EVERY_S, kinds: Mapping[str, str] = CLIENT_ERRORS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval, self._kinds, self._clock = interval_s, dict(kinds), clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def _kind(self, message: object) -> str | None:
        if isinstance(message, str):
            for prefix, kind in self._kinds.items():
                if message.startswith(prefix):
                    return kind
        return None

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self._kind(record.msg)
        if kind is None:
            return True
        now = self._clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it since the last such line were not logged)"
        return True
