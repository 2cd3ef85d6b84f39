"""Shared helpers: a real Dispatcher + Telemetry on a multiprocess directory, and readers of that directory."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from telemetry import Telemetry
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


def errors(tel: Telemetry) -> dict[str, float]:
    return {dict(k)["stage"]: v for k, v in series(scrape(tel.registry), "routescope_telemetry_errors_total").items()}


def db_files(path: str | Path) -> list[str]:
    return sorted(f for f in os.listdir(path) if FILE_RE.match(f))
