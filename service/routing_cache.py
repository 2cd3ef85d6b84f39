"""/routing's JSON, built once per telemetry flush and shared: eight pollers cost one build, and wait for none.

Building the document (a flush, the snapshot, the view with its advice, validation against
``RoutingOut``, JSON) takes milliseconds of the interpreter, tens when the advice is recomputed;
serving bytes already built takes almost none. So a build is kept while what it depends on, short
of the clock, is unchanged: telemetry's last background flush (every ``flush_interval_s``) and the
demo's state. After the next flush it is still served while a thread makes its successor, so a
document is at most two flush intervals old, and a change of the demo's state shows at once.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import TypeAdapter

from .routing import RoutingOut


class Key(NamedTuple):
    """What a build depends on, short of the clock: a new ``flush`` makes it old; new ``facts`` make it wrong."""

    flush: float
    facts: Hashable


@dataclass(frozen=True)
class Built:
    """One build: the document (read it, never change it) and its JSON as /routing answers it."""

    key: Key | None
    at: float  # the clock's reading when the build started
    doc: dict[str, Any]
    body: bytes


def generation(state: Any) -> Key | None:
    """Telemetry's last background flush and the demo's state; None (matches nothing) before a background flush."""
    try:
        flushed = state.telemetry.last_background_flush
        demo = state.demo.state if state.demo is not None else None
    except Exception:  # noqa: BLE001 - a key that cannot be read means: build anew
        return None
    return None if flushed is None else Key(flushed, demo)


class RoutingCache:
    """The last build, kept while ``key()`` returns what it returned before that build and the build is younger
    than ``max_age_s``; one builder at a time, and those who waited for it share its result.

    When only the flush moved (same facts) and the build is younger than twice ``max_age_s``, ``kept`` still
    serves it while a thread makes the next one, so no caller waits for a build (the advice in it can take
    tens of ms); a caller waits only when the facts changed, or nothing recent enough is kept.
    """

    def __init__(self, build: Callable[[], dict[str, Any]], key: Callable[[], Key | None], *,
                 max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._build, self._key, self._max_age, self._clock = build, key, max_age_s, clock
        self._adapter = TypeAdapter(RoutingOut)
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()  # held by the one background build under way
        # one long-lived worker: starting a thread waits for it to run, which under load stalls the caller
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="routescope-routing-build")
        self._last: Built | None = None
        self.builds = 0

    def current(self) -> Built | None:
        """The last build if it still holds, else None: no lock, no build, cheap enough for the event loop."""
        last = self._last
        if last is None or self._clock() - last.at >= self._max_age:
            return None
        key = self._key()
        return last if key is not None and key == last.key else None

    def kept(self) -> Built | None:
        """``current()``, or the last build while a background build replaces it (same facts, under twice
        ``max_age_s`` old); None when the caller must build (``get``)."""
        last = self._last
        if last is None or last.key is None:
            return None
        age, key = self._clock() - last.at, self._key()
        if key is None or key.facts != last.key.facts or age >= 2 * self._max_age:
            return None
        if key != last.key or age >= self._max_age:
            self._refresh()
        return last

    def _refresh(self) -> None:
        if not self._refreshing.acquire(blocking=False):
            return  # one is under way

        def run() -> None:
            try:
                self.get()
            except Exception:  # noqa: BLE001 - the next caller who must build meets it, and answers 500
                pass
            finally:
                self._refreshing.release()

        try:
            self._worker.submit(run)
        except RuntimeError:  # the interpreter is shutting down: no more builds in the background
            self._refreshing.release()

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
