"""Calls and decode-in-prefill calls per second over the last minutes, from the totals of each telemetry flush.

/routing's builds read every flush's totals (at most one build per flush); ``RateHistory`` keeps each
flush's pair of running totals, and ``rates`` turns neighbours into per-second rates. Totals that go
down (the multiprocess directory lost a process's files, or telemetry restarted) start a new run: the
drop is never a negative rate.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import NamedTuple

SPAN_S = 600.0  # how far back the page's chart reaches
MAX_POINTS = 720  # a point per flush for 10 minutes at the fastest flush (0.5 s) would be 1200: thinned past this


class Point(NamedTuple):
    """Running totals at one flush."""

    ts: float  # the flush's wall time
    calls: int  # prefill-entry calls so far
    dip_calls: int  # of them, calls with decode rows that a prefill kernel ran


def rates(points: list[Point]) -> list[dict[str, float]]:
    """Per interval between neighbouring points: its end, its length and both rates; nothing across a drop."""
    out = []
    for a, b in zip(points, points[1:]):
        dt = b.ts - a.ts
        if dt <= 0 or b.calls < a.calls or b.dip_calls < a.dip_calls:
            continue
        out.append({"ts": b.ts, "dt_s": dt, "calls_per_s": (b.calls - a.calls) / dt,
                    "decode_in_prefill_per_s": (b.dip_calls - a.dip_calls) / dt})
    return out


class RateHistory:
    """The last ``span_s`` of flush totals; one writer at a time, readers get a copy."""

    def __init__(self, span_s: float = SPAN_S, max_points: int = MAX_POINTS) -> None:
        self.span_s = span_s
        self._points: deque[Point] = deque(maxlen=max_points)
        self._lock = threading.Lock()

    def record(self, ts: float | None, calls: int, dip_calls: int) -> None:
        """Add a flush's totals (once per flush: a repeated ``ts`` is ignored); ``ts`` None (no flush yet) adds none."""
        if ts is None:
            return
        with self._lock:
            if self._points and ts <= self._points[-1].ts:
                return
            self._points.append(Point(ts, calls, dip_calls))
            while self._points and self._points[0].ts < ts - self.span_s:
                self._points.popleft()

    def points(self) -> list[Point]:
        with self._lock:
            return list(self._points)

    def document(self) -> dict:
        """/routing's ``history``: the span, and the rates between the flushes kept."""
        return {"span_s": self.span_s, "rates": rates(self.points())}
