"""Telemetry for one vLLM worker, and where its numbers go.

Two ways out, either or both:

* a shared multiprocess directory (``ROUTESCOPE_TELEMETRY_MULTIPROC_DIR``, else
  ``PROMETHEUS_MULTIPROC_DIR``): every worker writes rank-labelled files at each flush;
  ``routescope serve --multiproc-dir DIR`` (or vLLM's own /metrics, when vLLM uses the same
  directory) reads them all;
* a port per rank (``ROUTESCOPE_VLLM_PORT_BASE``): worker of TP rank r serves /metrics on
  ``PORT_BASE + r`` (``ROUTESCOPE_VLLM_ADDR``, default 127.0.0.1: loopback only), bounded as
  ``rank_server`` says (``ROUTESCOPE_VLLM_HEAD_TIMEOUT_S``, ``ROUTESCOPE_VLLM_MAX_CONNECTIONS``).
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Mapping
from typing import Any

from dispatcher.platform import Platform
from dispatcher.policy import Policy

log = logging.getLogger("vllm.routescope")

PORT_BASE_ENV = "ROUTESCOPE_VLLM_PORT_BASE"
_servers: list[Any] = []  # per-rank HTTP servers started here (shut down by shutdown_servers)
ADDR_ENV = "ROUTESCOPE_VLLM_ADDR"
HEAD_TIMEOUT_ENV = "ROUTESCOPE_VLLM_HEAD_TIMEOUT_S"
MAX_CONNECTIONS_ENV = "ROUTESCOPE_VLLM_MAX_CONNECTIONS"


def make_telemetry(*, platform: Platform, policy: Policy, model: str | None, rank: str,
                   env: Mapping[str, str] | None = None, absent_gates: tuple[str, ...] = ()) -> Any:
    """A started Telemetry for this process (flush thread running, closed at exit)."""
    from telemetry import Telemetry, TelemetryConfig

    env = os.environ if env is None else env
    base = TelemetryConfig.from_env(env, rank=rank)
    models = tuple(base.models)
    if model and model not in models and model not in ("other", "unknown"):
        models += (model,)
    cfg = base.with_(models=models, absent_gates=tuple(absent_gates) or base.absent_gates)
    dir_error = _make_dir(cfg.multiproc_dir) if cfg.multiproc_dir else None
    tel = Telemetry(cfg, platform=platform, policy=policy)
    if dir_error is not None:  # fail open: counting goes on in this process, the writer retries at each flush
        tel.count_error("write")
        log.warning("routescope: rank %s cannot create the multiprocess directory %s (%s); counting goes on in "
                    "this process, its files are retried at each flush and each failure counted in "
                    "routescope_telemetry_errors_total{stage=\"write\"}", rank, cfg.multiproc_dir, dir_error)
    port = _port(env, rank)
    if port is not None:
        from . import rank_server

        addr = env.get(ADDR_ENV, "").strip() or rank_server.DEFAULT_ADDR
        try:
            server = rank_server.start(port, addr=addr, registry=tel.registry,
                                       head_timeout_s=_number(env, HEAD_TIMEOUT_ENV, rank_server.HEAD_TIMEOUT_S),
                                       max_connections=int(_number(env, MAX_CONNECTIONS_ENV,
                                                                   rank_server.MAX_CONNECTIONS)),
                                       histogram_mode=cfg.histogram_mode.value)
            _servers.append(server)
            log.info("routescope: rank %s serves /metrics on %s:%d", rank, addr, port)
        except Exception as exc:  # noqa: BLE001 - a taken port loses this exporter, not the worker
            log.warning("routescope: rank %s could not serve /metrics on %s:%d (%s)", rank, addr, port, exc)
    if not cfg.multiproc_dir and port is None:
        log.warning("routescope: no export configured in this worker (set PROMETHEUS_MULTIPROC_DIR or "
                    "ROUTESCOPE_TELEMETRY_MULTIPROC_DIR, or %s); counts stay inside the process", PORT_BASE_ENV)
    tel.start()
    atexit.register(tel.close)
    return tel


def _make_dir(path: str) -> OSError | None:
    """Create the multiprocess directory if needed; the OSError (read-only, permission, a file in the way) or None."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return exc
    return None


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number from ``env``, else ``default`` (a bad value is logged, never fatal)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        log.warning("routescope: %s=%r is not a positive number; using %s", name, raw, default)
        return default
    return value


def _port(env: Mapping[str, str], rank: str) -> int | None:
    raw = env.get(PORT_BASE_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not rank.isdigit():
        log.warning("routescope: %s=%r or rank %r is not a number; no per-rank port", PORT_BASE_ENV, raw, rank)
        return None
    return int(raw) + int(rank)


def shutdown_servers() -> None:
    """Stop the per-rank /metrics servers this process started (tests; a worker's exit does it anyway)."""
    while _servers:
        server = _servers.pop()
        try:
            server.shutdown()
            server.server_close()
        except Exception:  # noqa: BLE001
            pass
