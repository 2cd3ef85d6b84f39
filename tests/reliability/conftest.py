"""Shared helpers: a real Dispatcher + Telemetry on a multiprocess directory, and readers of that directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from dispatcher import Dispatcher, what_if
from dispatcher.kernels import default_registry
from dispatcher.policy import Policy
from telemetry import Telemetry, TelemetryConfig
from telemetry.multiproc import FILE_RE, multiprocess_registry

from ..telemetry.conftest import scrape, series

ROOT = Path(__file__).resolve().parents[2]

_G = torch.Generator().manual_seed(3)
Q, KV = torch.randn(3, 2, 64, generator=_G), torch.randn(20, 1, 64, generator=_G)
IDX = torch.randint(-1, 20, (3, 8), generator=_G, dtype=torch.int32)


def real_dispatcher() -> Dispatcher:
    """The real dispatcher and torch kernels (CPU), as a what-if cpu platform."""
    return Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=default_registry(triton=False))


def make_tel(path: str | None, **cfg) -> Telemetry:
    cfg.setdefault("models", ("glm",))
    return Telemetry(TelemetryConfig(multiproc_dir=path, **cfg), platform=what_if("cpu"), policy=Policy())


def call(d: Dispatcher, model: str = "glm") -> None:
    """One real 3-row call; its output is checked against the plain kernel elsewhere (tests/telemetry)."""
    out = torch.empty(3, 2, 48)
    d(Q, KV, IDX, None, 0.3, 64, 48, 16, None, out, model=model, query_lens=[1, 2])


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


def exposition(path: str | Path) -> bytes:
    return generate_latest(multiprocess_registry(str(path)))


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
