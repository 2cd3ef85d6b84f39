"""/routing's JSON, built once per telemetry flush and shared: eight pollers and the advice gauges cost one build.

Building the document (a flush, the snapshot, the view, its validation against ``RoutingOut``, JSON)
takes milliseconds of the interpreter; serving bytes already built takes almost none. So a build
is kept while what it depends on, short of the clock, is unchanged: telemetry's last background
flush (every ``flush_interval_s``) and the demo's state. A document is therefore at most one flush
interval old, as a scrape is, and a change of the demo's state shows at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from .routing import RoutingOut


@dataclass(frozen=True)
class Built:
    """One build: the document (read it, never change it) and its JSON as /routing answers it."""

    key: Hashable
    at: float  # the clock's reading when the build started
    doc: dict[str, Any]
    body: bytes


def generation(state: Any) -> Hashable | None:
    """What a /routing document depends on, short of the clock; None (never matches) before a background flush."""
    try:
        flushed = state.telemetry.last_background_flush
        demo = state.demo.state if state.demo is not None else None
    except Exception:  # noqa: BLE001 - a key that cannot be read means: build anew
        return None
    return None if flushed is None else (flushed, demo)


class RoutingCache:
    """The last build, reused while ``key()`` returns what it returned before that build and the build is younger
    than ``max_age_s``; one builder at a time, and those who waited for it share its result."""

    def __init__(self, build: Callable[[], dict[str, Any]], key: Callable[[], Hashable | None], *,
                 max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._build, self._key, self._max_age, self._clock = build, key, max_age_s, clock
        self._adapter = TypeAdapter(RoutingOut)
        self._lock = threading.Lock()
        self._last: Built | None = None
        self.builds = 0

    def current(self) -> Built | None:
        """The last build if it still holds, else None: no lock, no build, cheap enough for the event loop."""
        last = self._last
        if last is None or self._clock() - last.at >= self._max_age:
            return None
        key = self._key()
        return last if key is not None and key == last.key else None

    def get(self) -> Built:
        """The last build if it holds, else a new one; raises what the build raises (the endpoint answers 500)."""
        with self._lock:
            last = self.current()
            if last is not None:
                return last
            key, at = self._key(), self._clock()  # read first: a flush during the build makes it stale
            doc = self._build()
            body = self._adapter.dump_json(self._adapter.validate_python(doc), by_alias=True)
            self._last = Built(key, at, doc, body)
            self.builds += 1
            return self._last
