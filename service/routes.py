"""The endpoints: each reads the app's ServiceState and returns a typed model; none changes state."""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from dispatcher.explain import explain

from .demo.runner import READY as DEMO_READY
from .page import page_for
from .models import ExplainQuery, ExplainResponse, HealthOut, ReadyCheck, ReadyOut, ValidationErrorOut
from .routing import RoutingOut

router = APIRouter()
_BAD_PARAMS = {422: {"model": ValidationErrorOut, "description": "a query parameter is malformed; `message` names it"}}
_POLICY_FIELDS = ("gfx942_min_rows", "gfx950_min_rows")


def _state(request: Request):
    return request.app.state.routescope


def static_dir() -> str:
    """The page's files, shipped as package data (no CDN: these machines have no internet)."""
    return str(resources.files("service") / "static")


@router.get("/", include_in_schema=False)
async def page(request: Request) -> HTMLResponse:
    """The page for people: one self-contained file carrying the current /routing document, then polling it."""
    cache = _state(request).routing
    try:
        built = cache.kept() or await to_thread.run_sync(cache.get)
        body = built.body
    except Exception:  # noqa: BLE001 - the page still loads; its script fetches /routing and says what fails
        body = None
    html = await to_thread.run_sync(page_for, Path(static_dir()), body)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


@router.get("/healthz", response_model=HealthOut, tags=["health"])
async def healthz() -> HealthOut:
    """Liveness: the process answers HTTP. Answered on the event loop, never behind a scrape's worker thread."""
    return HealthOut()


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}}, tags=["health"])
async def readyz(request: Request) -> ReadyOut | JSONResponse:
    """Readiness: started, telemetry flushing, and the demo running when it was asked for.

    Answered on the event loop from what the last background flush left (no flush, no read of other processes'
    files, no lock a scrape holds), so it never waits behind a scrape."""
    st = _state(request)
    checks = [ReadyCheck(name="startup", ok=st.started, detail="lifespan started" if st.started else "starting")]
    try:
        last = st.telemetry.last_background_flush
        lag = time.time() - last if last else None
        limit = max(10.0, 5 * st.settings.flush_interval_s)
        grace = time.time() - st.started_ts < limit
        ok = (lag is None and grace) or (lag is not None and lag <= limit)
        detail = f"last flush {lag:.1f} s ago" if lag is not None else "no flush yet"
        checks.append(ReadyCheck(name="telemetry", ok=ok, detail=detail))
    except Exception as exc:  # noqa: BLE001 - readiness reports, never raises
        checks.append(ReadyCheck(name="telemetry", ok=False, detail=f"reading its last flush failed: {exc.__class__.__name__}"))
    if st.telemetry.config.multiproc_dir:
        checks.append(_directory_check(st.telemetry))
    if st.settings.demo:
        state = st.demo.state if st.demo is not None else None
        checks.append(ReadyCheck(name="demo", ok=state in DEMO_READY, detail=str(state or "absent")))
    out = ReadyOut(ready=all(c.ok for c in checks), checks=checks)
    if not out.ready:
        return JSONResponse(status_code=503, content=out.model_dump())
    return out


def _directory_check(telemetry) -> ReadyCheck:
    """The multiprocess directory: readable by this service, and writable by its telemetry."""
    try:
        problems = [p for p in telemetry.health_problems(check=True) if p.get("blocking")]
    except Exception as exc:  # noqa: BLE001
        return ReadyCheck(name="multiprocess", ok=False, detail=f"health failed: {exc.__class__.__name__}")
    if problems:
        return ReadyCheck(name="multiprocess", ok=False, detail="; ".join(
            f"cannot {'write' if p['stage'] == 'write' else p['stage']} {p['path']}: {p['problem']}" for p in problems))
    return ReadyCheck(name="multiprocess", ok=True, detail=f"{telemetry.config.multiproc_dir} readable and writable")


@router.get(
    "/metrics",
    response_class=Response,
    tags=["metrics"],
    responses={
        200: {
            "description": "Prometheus text format 0.0.4, or OpenMetrics 1.0 when the Accept header asks for it "
                           "(classic histograms); OpenMetrics 2.0 text or Prometheus' delimited protobuf when asked "
                           "for (native histograms too)",
            "content": {"text/plain": {"schema": {"type": "string"}}, "application/openmetrics-text": {"schema": {"type": "string"}},
                        "application/vnd.google.protobuf": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def metrics(request: Request, accept: Annotated[str | None, Header()] = None) -> Response:
    """Telemetry's series (every process's, in multiprocess mode) and this service's HTTP metrics.

    Telemetry's part is the last complete encoding (built in the background, at most two flush intervals
    old: service/metrics.py); only the HTTP metrics are encoded per request, one render at a time, since a
    render holds the GIL and concurrent ones only slow each other and the event loop.
    """
    st = _state(request)
    chain = st.metrics
    arrived = chain.clock()
    head = chain.head(accept, arrived, wait=False)  # the kept encoding, on the event loop: no thread hop
    if head is None and chain.keeps:  # nothing young enough kept: wait for the build, outside the render limit
        head = await to_thread.run_sync(chain.head, accept, arrived)
    body, content_type = await to_thread.run_sync(chain.render, accept, head, limiter=st.metrics_renders)
    return Response(content=body, media_type=content_type)


@router.get("/routing", response_model=RoutingOut, tags=["routing"])
async def routing(request: Request) -> Response:
    """What was routed where: counts, decode-in-prefill, latency quantiles, recent decisions, demo.

    Built at most once per telemetry flush (and demo state) and shared by every caller: the
    document is at most two flush intervals old, and `service.ts` says when it was built.
    """
    cache = _state(request).routing
    built = cache.kept() or await to_thread.run_sync(cache.get)  # a kept build is served from the event loop
    return Response(built.body, media_type="application/json")


@router.get("/routing/explain", response_model=ExplainResponse, responses=_BAD_PARAMS, tags=["routing"])
def routing_explain(request: Request, req: Annotated[ExplainQuery, Query()]) -> dict:
    """The routing decision for a what-if call: the same JSON as `routescope explain --json`.

    Thresholds not given default to this server's active policy, as the CLI's default to
    ROUTESCOPE_GFX942_MIN_ROWS / ROUTESCOPE_GFX950_MIN_ROWS. Every number is bounded (422
    past it), and an arch outside the known ones needs `allow_unknown_arch=true` (the CLI's
    `--allow-unknown-arch`).
    """
    policy = _state(request).dispatcher.policy
    unset = {f: getattr(policy, f) for f in _POLICY_FIELDS if f not in req.model_fields_set}
    if unset:
        req = req.model_copy(update=unset)
    return explain(req)
