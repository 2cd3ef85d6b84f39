"""`GET /experiments`, `POST /experiments` (start), `POST /experiments/{id}/stop` and `.../ack`: experiments over HTTP.

The endpoints only translate: the experiment itself (assignment, statistics, stops) is the
experiments package's, reached through one ``Control``. Reading is open like `/routing`; the
POSTs change what the dispatcher launches or whether an alert fires, so they answer only a loopback client
that names a loopback Host (and, from a browser, a loopback Origin): a page elsewhere cannot start, stop
or acknowledge one.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any
from urllib.parse import urlsplit

from anyio import to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from .experiment_control import MANUAL_REASON, Control, ControlFailed
from .experiment_models import ControlError, ExperimentOut, ExperimentsOut
from .middleware import LOOPBACK_HOSTS

log = logging.getLogger("routescope.service")
MAX_CONFIG_BYTES = 64 * 1024

router = APIRouter(tags=["experiments"])


def _is_loopback_ip(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hostname(value: str) -> str | None:
    try:
        return urlsplit(value if "//" in value else f"//{value}").hostname
    except ValueError:
        return None


def _loopback_name(name: str | None) -> bool:
    return name is not None and (name in ("localhost", *(h.strip("[]") for h in LOOPBACK_HOSTS)) or _is_loopback_ip(name))


def loopback_refusal(client: str | None, host: str | None, origin: str | None) -> str | None:
    """Why a control request is refused (None: it is not): pure, so each case is tested alone."""
    if not _is_loopback_ip(client):
        return f"experiment control is loopback only; this request came from {client or 'an unknown address'}"
    if not _loopback_name(_hostname(host or "")):
        return f"experiment control needs a loopback Host (127.0.0.1, localhost, [::1]); got {host!r}"
    if origin is not None and not _loopback_name(_hostname(origin)):
        return f"experiment control refuses a request from a page at {origin!r}"
    return None


def loopback_only(request: Request) -> None:
    """A dependency of the POSTs: 403 unless ``loopback_refusal`` lets the request through."""
    refusal = loopback_refusal(request.client.host if request.client else None, request.headers.get("host"),
                               request.headers.get("origin"))
    if refusal is not None:
        raise ControlFailed(403, refusal)


def _control(request: Request) -> Control:
    control = request.app.state.routescope.experiments
    if control is None:
        raise ControlFailed(503, "experiments are not available in this service (the experiments package is missing)")
    return control


async def control_failed_handler(request: Request, exc: Exception) -> JSONResponse:
    """``ControlFailed`` as its status and ``{"message": ...}``."""
    assert isinstance(exc, ControlFailed)
    return JSONResponse(status_code=exc.status, content={"message": exc.message})


_REFUSED = {s: {"model": ControlError, "description": d} for s, d in (
    (403, "not a loopback client, Host or Origin"), (404, "no experiment has this id"),
    (409, "another experiment is running (start), or this one is not stopped (ack)"),
    (422, "the config is refused; `message` says why"),
    (503, "experiments are not available in this service"))}


@router.get("/experiments", response_model=ExperimentsOut, responses={503: _REFUSED[503]})
async def list_experiments(request: Request) -> dict[str, Any]:
    """Every experiment with its cells (both arms' counts, B/A of mean kernel time, its anytime-valid band)."""
    control = _control(request)
    return {"experiments": await to_thread.run_sync(control.experiments)}


@router.post("/experiments", status_code=201, response_model=ExperimentOut, dependencies=[Depends(loopback_only)],
             responses=_REFUSED)
async def start_experiment(request: Request) -> dict[str, Any]:
    """Start an experiment; the body is its config (JSON), as `routescope experiment start` sends it. Loopback only."""
    control = _control(request)
    raw = await request.body()
    if len(raw) > MAX_CONFIG_BYTES:
        raise ControlFailed(422, f"the config is {len(raw)} bytes; at most {MAX_CONFIG_BYTES}")
    try:
        config = json.loads(raw or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ControlFailed(422, f"the body must be the experiment's config as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ControlFailed(422, "the body must be a JSON object: the experiment's config (candidate, fraction, ...)")
    started = await to_thread.run_sync(control.start, config)
    log.info("experiment %s started over HTTP: candidate %s, fraction %s", started.get("id"), started.get("candidate"),
             started.get("fraction"))
    return started


@router.post("/experiments/{experiment_id}/stop", response_model=ExperimentOut, dependencies=[Depends(loopback_only)],
             responses=_REFUSED)
async def stop_experiment(request: Request, experiment_id: str) -> dict[str, Any]:
    """Stop a running experiment (every call goes back to arm A); stop_reason becomes `user`. Loopback only."""
    control = _control(request)
    stopped = await to_thread.run_sync(control.stop, experiment_id, MANUAL_REASON)
    log.info("experiment %s stopped over HTTP", experiment_id)
    return stopped


@router.post("/experiments/{experiment_id}/ack", response_model=ExperimentOut, dependencies=[Depends(loopback_only)],
             responses=_REFUSED)
async def acknowledge_experiment(request: Request, experiment_id: str) -> dict[str, Any]:
    """Acknowledge a stopped experiment's stop: `acknowledged` is set and RoutescopeExperimentStopped resolves; the
    experiment stays stopped and readable. 409 when it is not stopped. Loopback only."""
    control = _control(request)
    acked = await to_thread.run_sync(control.acknowledge, experiment_id, MANUAL_REASON)
    log.info("experiment %s: its stop (%s) acknowledged over HTTP", experiment_id, acked.get("stop_reason"))
    return acked
