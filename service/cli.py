"""`routescope serve`: build the app from flags and ROUTESCOPE_* settings, bind, print the URLs, run uvicorn."""

from __future__ import annotations

import copy
import errno
import socket
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from dispatcher.cli import validation_message
from dispatcher.types import GuardMode
from telemetry.config import HistogramMode

from .connections import BoundedServer, bounded_h11, raise_nofile
from .experiment_control import ControlFailed, experiments_of
from .middleware import MAX_HEAD_BYTES
from .protocol import quiet_h11
from .settings import DEFAULT_PORT, ServiceSettings


class BindError(RuntimeError):
    """The address cannot be bound; the message says what to do."""


def bind(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts, so --port 0 gets a real port we can print, and a busy port fails clearly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only then (else
    # Nagle + delayed ACK add 40 ms to every keep-alive response)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise BindError(f"{host}:{port} is already in use; pick another --port (0: any free port)") from None
        raise BindError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def banner(settings: ServiceSettings, port: int, demo_info: dict | None,
           experiment: dict | None = None) -> list[str]:
    """The lines a new user sees first: where everything is, and what the demo is (and is not)."""
    host = settings.host
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
    base = f"http://{shown}:{port}"
    lines = [
        f"routescope serve: listening on {host}:{port}",
        f"  page     {base}/",
        f"  routing  {base}/routing",
        f"  metrics  {base}/metrics",
        f"  docs     {base}/docs",
    ]
    if host not in ("127.0.0.1", "::1", "localhost"):
        lines.append(f"  note: bound to {host}, not loopback: anyone who can reach this host can read these pages")
    if demo_info is not None:
        models = " and ".join(s["model"] for s in demo_info["shapes"])
        scale = (
            f"per-row work scaled down 1/{demo_info['scale_factor']:.0f} (rows per call are real)"
            if demo_info["scaled"]
            else "full shapes"
        )
        bug = "ON: GLM decode rows go through the prefill entry" if demo_info["glm_bug"] else "off (--demo-glm-bug turns it on)"
        lines.append(f"demo: {models} traffic on {demo_info['device']}; {scale}; GLM decode bug {bug}")
    if experiment is not None:
        lines.append(f"experiment {experiment['id']}: candidate {experiment['candidate']} on "
                     f"{100 * experiment['fraction']:g}% of the calls it routes differently; {base}/experiments, "
                     f"`routescope experiment report --url {base}`")
    lines.append("press Ctrl+C to stop")
    return lines


def serve_command(
    host: Annotated[Optional[str], typer.Option(help="bind address (default 127.0.0.1, loopback)")] = None,
    port: Annotated[Optional[int], typer.Option(help=f"port; 0 picks a free one (default {DEFAULT_PORT})")] = None,
    demo: Annotated[bool, typer.Option("--demo", help="run the embedded demo workload in this process")] = False,
    demo_glm_bug: Annotated[
        bool, typer.Option("--demo-glm-bug", help="demo sends GLM decode rows through the prefill entry (implies --demo)")
    ] = False,
    multiproc_dir: Annotated[
        Optional[Path], typer.Option(help="Prometheus multiprocess directory shared with other ranks")
    ] = None,
    rank: Annotated[Optional[int], typer.Option(help="tensor-parallel rank label (default 0)")] = None,
    model: Annotated[
        Optional[list[str]], typer.Option("--model", help="a served model name (repeat); others are labelled 'other'")
    ] = None,
    gfx942_min_rows: Annotated[Optional[int], typer.Option(help="gfx942 gate in rows (default 512)")] = None,
    gfx950_min_rows: Annotated[Optional[int], typer.Option(help="gfx950 gate in rows (default 1024)")] = None,
    guard: Annotated[Optional[GuardMode], typer.Option(help="decode guard mode (default observe)")] = None,
    log_level: Annotated[Optional[str], typer.Option(help="critical, error, warning, info, debug (default info)")] = None,
    histogram_mode: Annotated[
        Optional[HistogramMode], typer.Option(help="latency histogram forms /metrics serves: both, native (a minimal "
                                              "classic form in text 0.0.4), classic (default: "
                                              "ROUTESCOPE_TELEMETRY_HISTOGRAM_MODE, else both)")
    ] = None,
    allowed_hosts: Annotated[
        Optional[str], typer.Option(help="Host header names accepted, comma-separated ('*': any); default: the "
                                         "loopback names when bound to loopback, else any")
    ] = None,
    head_timeout: Annotated[
        Optional[float], typer.Option(help="seconds a connection may wait for a request head, when new or after a "
                                           "response, before it is closed (default 5)")
    ] = None,
    max_connections: Annotated[
        Optional[int], typer.Option(help="open client connections allowed, at most the open-file limit less 64; "
                                         "one more closes the one waiting longest for a head (default 1000)")
    ] = None,
    experiment: Annotated[
        Optional[str], typer.Option(help="with --demo: run this candidate as an experiment on the demo's traffic "
                                         "(aa, gfx942_N, gfx950_N, split_below_N, decodes_split_k)")
    ] = None,
    experiment_fraction: Annotated[
        Optional[float], typer.Option(help="with --experiment: probability that an eligible call goes to arm B "
                                           "(default 0.01, at most 0.1)")
    ] = None,
) -> None:
    """Serve /metrics, /routing and the page at /; --demo drives the real dispatcher with model-shaped traffic."""
    flags = dict(
        host=host, port=port, multiproc_dir=str(multiproc_dir) if multiproc_dir else None, rank=rank, models=model,
        gfx942_min_rows=gfx942_min_rows, gfx950_min_rows=gfx950_min_rows, guard=guard,
        log_level=log_level.lower() if log_level else None, allowed_hosts=allowed_hosts,
        head_timeout_s=head_timeout, max_connections=max_connections,
        experiment=experiment, experiment_fraction=experiment_fraction,
        histogram_mode=histogram_mode.value if histogram_mode else None,
    )
    if demo or demo_glm_bug:
        flags["demo"] = True
    if demo_glm_bug:
        flags["demo_glm_bug"] = True
    try:
        settings = ServiceSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"routescope serve: {validation_message(exc)}", err=True)
        raise typer.Exit(2) from None
    if settings.multiproc_dir and not Path(settings.multiproc_dir).is_dir():
        typer.echo(f"routescope serve: --multiproc-dir {settings.multiproc_dir} is not a directory", err=True)
        raise typer.Exit(2)
    try:
        run(settings)
    except (BindError, ControlFailed) as exc:
        typer.echo(f"routescope serve: {exc}", err=True)
        raise typer.Exit(2) from None


def log_config(level: str) -> dict:
    """uvicorn's logging setup, plus the routescope.* loggers (demo, telemetry, service) on the same handler;
    uvicorn's warnings that a client can cause at will pass at most once a minute (service/protocol.py)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    numeric = "DEBUG" if level == "trace" else level.upper()
    config["loggers"]["routescope"] = {"handlers": ["default"], "level": numeric, "propagate": False}
    config.setdefault("filters", {})["client_errors"] = {"()": "service.protocol.ClientErrorLogFilter"}
    config["loggers"].setdefault("uvicorn.error", {"level": "INFO"})["filters"] = ["client_errors"]
    return config


def run(settings: ServiceSettings) -> None:
    """Bind, build, print, serve until SIGINT/SIGTERM; the app's lifespan stops the demo and telemetry."""
    import uvicorn

    from .app import create_app

    raise_nofile()  # before the cap is computed from it (create_app)
    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    try:
        app = create_app(settings)
    except BaseException:
        sock.close()  # a refused --experiment: nothing was served
        raise
    state = app.state.routescope
    bounds = state.connections
    running = [e for e in experiments_of(state.experiments) if e.get("state") == "running"]
    for line in banner(settings, port, state.demo.info() if state.demo is not None else None,
                       running[0] if settings.experiment and running else None):
        print(line, flush=True)
    config = uvicorn.Config(
        app,
        log_config=log_config(settings.log_level),
        log_level=settings.log_level,
        access_log=settings.log_level in ("debug", "trace"),
        lifespan="on",
        timeout_graceful_shutdown=5,
        # h11: the request-head limit below is h11's (the app answers 414 past MAX_URL_BYTES); quiet_h11 keeps an
        # unparsable request to its 400 and a count, without the app's late reply raising in h11; bounded_h11 adds
        # the head timeout and the connection cap uvicorn lacks (service/connections.py says where its own fall short)
        http=bounded_h11(quiet_h11(state.malformed_requests.inc), bounds),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_keep_alive=5,
    )
    server = BoundedServer(config, bounds)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        sys.exit(1)
