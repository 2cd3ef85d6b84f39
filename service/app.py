"""``create_app``: the FastAPI app, built from settings by a factory; nothing is created at import."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry, Counter
from prometheus_fastapi_instrumentator import Instrumentator

from advise.service import AdviceCollector, CachedAdvice
from dispatcher import Dispatcher, Platform, Policy, detect, probe_aiter
from routescope import __version__
from telemetry import Telemetry, TelemetryConfig
from telemetry.config import DEFAULT_COUNTERFACTUALS

from .connections import ConnectionBounds
from .demo.runner import DemoRunner
from .errors import unexpected_handler, validation_handler
from .experiment_metrics import ExperimentCollector
from .experiment_control import Control, ControlFailed, build_control, experiments_of, start_demo_experiment
from .experiments import control_failed_handler
from .experiments import router as experiments_router
from .history import RateHistory
from .docs import docs_router, swagger_ui_dir
from .metrics import ChainedCollector
from .middleware import HeadAsGet, TrustedHostMiddleware, UrlTooLong, default_hosts
from .models import ExplainQuery
from .routes import router, static_dir
from .routing import routing_of
from .routing_cache import RoutingCache, generation
from .settings import ServiceSettings

log = logging.getLogger("routescope.service")


@dataclass
class ServiceState:
    """Everything the endpoints read; built once per app, never mutated by a request."""

    settings: ServiceSettings
    dispatcher: Dispatcher
    telemetry: Telemetry
    demo: DemoRunner | None
    http_registry: CollectorRegistry
    metrics: ChainedCollector  # telemetry's registry (all processes' files in multiprocess mode), then HTTP's
    malformed_requests: Counter  # requests uvicorn could not parse and answered 400 itself (service/protocol.py)
    routing: RoutingCache  # /routing's JSON, built at most once per flush
    connections: ConnectionBounds  # the HTTP server's head timeout and connection cap (service/connections.py)
    metrics_renders: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))  # /metrics
    started_ts: float = field(default_factory=time.time)
    started: bool = False  # the lifespan has run its startup half
    advice: CachedAdvice = field(default_factory=CachedAdvice)  # /routing's advice section, shared by the gauges
    experiments: Control | None = None  # GET/POST /experiments, /routing's experiments, the experiment series
    history: RateHistory = field(default_factory=RateHistory)  # flush-to-flush rates for the page's chart


def demo_counterfactuals(settings: ServiceSettings, platform: Platform, policy: Policy) -> dict[str, Any]:
    """Telemetry defaults for the demo off gfx942/gfx950, where every counterfactual would answer in-tree:
    decide them on a what-if gfx942 (the active gate, gfx942_1024, no_row_gate). ROUTESCOPE_TELEMETRY_* still win."""
    if not settings.demo or platform.is_gfx942 or platform.is_gfx950:
        return {}
    gates = dict.fromkeys((f"gfx942_{policy.gfx942_min_rows}", *DEFAULT_COUNTERFACTUALS))
    return {"counterfactual_arch": "gfx942", "counterfactuals": tuple(gates)}


def build_telemetry(settings: ServiceSettings, dispatcher: Dispatcher) -> Telemetry:
    """Telemetry for this dispatcher: models, rank and multiprocess dir from settings; OTEL_* from the environment."""
    config = TelemetryConfig.from_env(
        defaults=demo_counterfactuals(settings, dispatcher.platform, dispatcher.policy),
        models=tuple(settings.model_set()),
        rank=str(settings.rank),
        multiproc_dir=settings.multiproc_dir,
        flush_interval_s=settings.flush_interval_s,
        decisions_maxlen=max(settings.decisions, 1),
        histogram_mode=settings.histogram_mode,
    )
    tel = Telemetry(config, platform=dispatcher.platform, policy=dispatcher.policy)
    tel.instrument(dispatcher)
    return tel


def build_demo(settings: ServiceSettings, dispatcher: Dispatcher, telemetry: Telemetry) -> DemoRunner:
    """The embedded workload; decode-entry calls go to telemetry, which also counts the prefill-entry ones."""

    def decode_path(model: str, rows: int) -> None:
        telemetry.record_decode_path(rows, model)

    return DemoRunner(
        dispatcher,
        seed=settings.demo_seed,
        glm_bug=settings.demo_glm_bug,
        duty=settings.demo_duty,
        full_scale=True if settings.demo_full_scale else None,
        on_decode_path=decode_path,
        limit=settings.demo_limit,
        warm_up=settings.demo_warm_up,
    )


def create_app(
    settings: ServiceSettings | None = None,
    *,
    dispatcher: Dispatcher | None = None,
    telemetry: Telemetry | None = None,
    demo: DemoRunner | None = None,
    experiments: Control | None = None,
) -> FastAPI:
    """Build the app; the lifespan starts telemetry's flush thread and the demo, and stops both.

    With ``settings.experiment`` the demo's dispatcher runs that experiment from the start; a config the
    experiments package refuses raises ``ControlFailed`` here, before anything is served.
    """
    settings = settings if settings is not None else ServiceSettings()
    if dispatcher is None:
        platform = detect().with_aiter_status(probe_aiter())
        dispatcher = Dispatcher(platform=platform, policy=settings.policy())
    if telemetry is None:
        telemetry = build_telemetry(settings, dispatcher)
    if demo is None and settings.demo:
        demo = build_demo(settings, dispatcher, telemetry)
    if experiments is None:
        experiments = build_control(settings, dispatcher)
    if demo is not None:
        start_demo_experiment(settings, experiments)
    http_registry = CollectorRegistry(auto_describe=True)
    state = ServiceState(
        settings=settings,
        dispatcher=dispatcher,
        telemetry=telemetry,
        demo=demo,
        http_registry=http_registry,
        metrics=ChainedCollector((telemetry.collect_registry, lambda: http_registry), on_error=telemetry.count_error,
                                 generation=lambda: telemetry.last_background_flush,
                                 max_age_s=2 * settings.flush_interval_s,
                                 histogram_mode=telemetry.config.histogram_mode),
        malformed_requests=Counter("routescope_http_malformed_requests", "Requests the HTTP server could not parse "
                                   "(head or chunked body) and answered 400 before the app.", registry=http_registry),
        connections=ConnectionBounds(http_registry, head_timeout_s=settings.head_timeout_s,
                                     max_connections=settings.max_connections),
        # the lambdas read ``state`` when called, after this assignment
        routing=RoutingCache(lambda: routing_of(state), lambda: generation(state), max_age_s=settings.flush_interval_s),
        experiments=experiments,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        telemetry.start(flush_interval_s=settings.flush_interval_s)
        if experiments is not None:
            experiments.open(settings.flush_interval_s)
        if demo is not None:
            demo.start()
        state.started = True
        try:
            yield
        finally:
            if demo is not None and not demo.stop(timeout=15.0):
                log.warning("demo thread did not stop within 15 s")
            if experiments is not None:
                try:
                    experiments.close()  # a last flush: the experiment's statistics and state file
                except Exception:  # noqa: BLE001 - the shutdown goes on to flush telemetry
                    log.exception("experiments did not close cleanly")
            state.metrics.close()  # the /metrics build worker ends once idle
            telemetry.close()  # stops the flush thread, flushes once more, releases multiprocess files
            if demo is not None:
                c = demo.counts
                log.info("routescope: demo stopped after %d prefill-entry and %d decode-entry calls; telemetry flushed and closed",
                         c.prefill_calls, c.decode_path_calls)
            else:
                log.info("routescope: telemetry flushed and closed")

    app = FastAPI(
        title="routescope",
        version=__version__,
        summary="How sparse MLA prefill calls are routed to attention kernels.",
        lifespan=lifespan,
        docs_url=None,  # served below from the package's Swagger UI files: no CDN, so /docs works offline
        redoc_url=None,
    )
    app.state.routescope = state
    app.include_router(router)
    app.include_router(experiments_router)
    app.include_router(docs_router)
    swagger = swagger_ui_dir()
    app.state.swagger_ui = swagger is not None
    if swagger is not None:
        app.mount("/static/swagger-ui", StaticFiles(directory=swagger), name="swagger-ui")
    else:
        log.warning("routescope: swagger-ui-bundle-v2 is not installed, so /docs answers 503; every other "
                    "endpoint is served")
    app.mount("/static", StaticFiles(directory=static_dir()), name="static")
    app.add_exception_handler(RequestValidationError, validation_handler(ExplainQuery.model_fields))
    app.add_exception_handler(ControlFailed, control_failed_handler)
    app.add_exception_handler(Exception, unexpected_handler)
    Instrumentator(registry=http_registry, should_group_status_codes=False, excluded_handlers=["/static/.*"]).instrument(
        app, metric_namespace="routescope"
    )
    # the gauges read /routing's document (built at most once a flush, in the background): advice at most two flush
    # intervals old, and no scrape waits for the scan, nor pays for a second document
    http_registry.register(AdviceCollector(lambda: (state.routing.kept() or state.routing.get()).doc["advice"]))
    http_registry.register(ExperimentCollector(lambda: experiments_of(state.experiments)))  # docs/metrics.md
    app.add_middleware(HeadAsGet)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=default_hosts(settings.host, settings.allowed_hosts))
    app.add_middleware(UrlTooLong)  # outermost: before any other work
    return app
