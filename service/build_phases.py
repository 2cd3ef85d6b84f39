"""Where one /metrics build of a multiprocess directory spends its CPU: the read and merge, then each format's encoding.

``routescope bench serve --phases N`` runs this beside its writers instead of the clients: N reads of the directory
in this process, as the server's build worker makes them (the reader with its cache kept, each format's encoder with
its kept lines), one every ``pause_s`` so each sees new flushes. The figures are one thread's CPU time
(``time.thread_time``), so other processes on the machine do not inflate them. Prints nothing itself; asserts
nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import Metric

from telemetry.exposition import negotiate
from telemetry.exposition.text import TextEncoder
from telemetry.multiproc.reader import ReaderCache, multiprocess_registry

from .load import PROTOBUF, TEXT

FORMATS = {"text 0.0.4": TEXT, "protobuf": PROTOBUF, "OpenMetrics 2.0": "application/openmetrics-text; version=2.0.0"}


class _Read:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def measure(path: str, reads: int, *, pause_s: float = 1.0, formats: dict[str, str] | None = None,
            sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Per phase (``read and merge``, then each format): CPU ms of every read after the first (which parses every
    file in full), their median and max, and the bytes each format wrote at the last read."""
    if reads < 1:
        raise ValueError("need at least one read")
    formats = FORMATS if formats is None else formats
    registry = multiprocess_registry(path, cache=ReaderCache())
    encoders = {name: negotiate(accept, lines=TextEncoder())[0] for name, accept in formats.items()}
    phases: dict[str, list[float]] = {"read and merge": [], **{name: [] for name in formats}}
    sizes: dict[str, int] = {}
    first: dict[str, float] = {}
    for i in range(reads + 1):
        if i:
            sleep(pause_s)
        took: dict[str, float] = {}
        start = time.thread_time()
        families = _Read(list(registry.collect()))
        took["read and merge"] = time.thread_time() - start
        for name, encoder in encoders.items():
            start = time.thread_time()
            body = encoder(families)
            took[name] = time.thread_time() - start
            sizes[name] = len(body)
        for name, seconds in took.items():
            if i:
                phases[name].append(seconds * 1e3)
            else:
                first[name] = seconds * 1e3
    return {"reads": reads, "phases": {name: {"median_ms": statistics.median(ms), "max_ms": max(ms),
                                              "first_ms": first[name], "bytes": sizes.get(name)}
                                       for name, ms in phases.items()}}


def render(result: dict[str, Any]) -> list[str]:
    """The lines `routescope bench serve --phases` prints."""
    lines = [f"one build's CPU (one thread), median and max of {result['reads']} reads; the first read apart"]
    for name, p in result["phases"].items():
        size = f"  {p['bytes'] / 1e3:8.0f} KB" if p.get("bytes") else ""
        lines.append(f"  {name:16s} median {p['median_ms']:6.1f} ms  max {p['max_ms']:6.1f} ms  "
                     f"first {p['first_ms']:6.1f} ms{size}")
    return lines
