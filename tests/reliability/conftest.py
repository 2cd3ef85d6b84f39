"""Shared helpers: a real Dispatcher + Telemetry on a multiprocess directory, and readers of that directory."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from telemetry import Telemetry
from telemetry.native import counts_from_native
from telemetry.bench.kill_worker import make_call, make_tel, real_dispatcher
from telemetry.multiproc.directory import FILE_RE
from telemetry.multiproc.reader import multiprocess_registry

from ..telemetry.conftest import scrape, series

ROOT = Path(__file__).resolve().parents[2]

call = make_call()


def calls_in(path: str | Path, **match: str) -> float:
    """routescope_calls_total summed over every process's files, read by routescope's collector."""
    return sum(series(scrape(multiprocess_registry(str(path))), "routescope_calls_total", **match).values())


def calls_by_prometheus_client(path: str | Path) -> float:
    """The same sum as vLLM's /metrics reads it: prometheus_client's own MultiProcessCollector over every *.db."""
    reg = CollectorRegistry()
    MultiProcessCollector(reg, path=str(path))
    return sum(series(scrape(reg), "routescope_calls_total").values())


def latency_in(path: str | Path, **match: str) -> tuple[int, int]:
    """(classic, native) count of routescope_call_duration_seconds over every process's files, routescope's reader.

    The classic count comes from the ``*.db`` files, the native one from the ``*.ndb`` files (its buckets, zero
    bucket and count agree, or this fails): the same samples, so the two are equal whenever both files hold the
    same flush."""
    classic = native = 0
    for fam in multiprocess_registry(str(path)).collect():
        if fam.name != "routescope_call_duration_seconds":
            continue
        for s in fam.samples:
            if any(s.labels.get(k) != v for k, v in match.items()):
                continue
            if s.native_histogram is not None:
                counts = counts_from_native(s.native_histogram)
                assert counts.zero + sum(counts.buckets.values()) == counts.count, counts
                native += counts.count
            elif s.name == fam.name + "_count":
                classic += int(s.value)
    return classic, native


def contradicting_natives(path: str | Path) -> list[tuple]:
    """Latency series whose served native part differs from their classic count (none may: a series that lost
    native data is served classic-only, telemetry.multiproc.families)."""
    classic: dict[tuple, float] = {}
    native: dict[tuple, float] = {}
    for fam in multiprocess_registry(str(path)).collect():
        if fam.name != "routescope_call_duration_seconds":
            continue
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.native_histogram is not None:
                counts = counts_from_native(s.native_histogram)
                native[key] = counts.count if counts.zero + sum(counts.buckets.values()) == counts.count else -1
            elif s.name == fam.name + "_count":
                classic[key] = s.value
    return [(k, classic.get(k), v) for k, v in native.items() if classic.get(k) != v]


def errors(tel: Telemetry) -> dict[str, float]:
    return {dict(k)["stage"]: v for k, v in series(scrape(tel.registry), "routescope_telemetry_errors_total").items()}


def db_files(path: str | Path) -> list[str]:
    return sorted(f for f in os.listdir(path) if FILE_RE.match(f))
