"""`routescope experiment start|status|stop|ack|report`: drive an experiment in a running service or a directory.

`--url` talks to `routescope serve` over its HTTP control (loopback only); `--multiproc-dir` writes
the experiment into a multiprocess directory, where every process (vLLM's ranks, a service) runs the
same one from one config. Bad input exits 2 with one line; a service that cannot be reached or a
refused request exits 1; no traceback either way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .experiment_control import MANUAL_REASON, Control, ControlFailed
from .settings import DEFAULT_PORT

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
_GATE = re.compile(r"^(gfx942|gfx950|split_below)_(.+)$")
_BUCKET = re.compile(r"^\d+(-\d+|\+)?$")

experiment_app = typer.Typer(
    name="experiment", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Measure a candidate policy on live traffic (arm B on a fraction of the calls it would route differently), "
         "with an anytime-valid band and a kill switch: start, status, stop, ack, report.",
)

UrlOpt = Annotated[Optional[str], typer.Option("--url", help=f"a running routescope serve (default {DEFAULT_URL})")]
DirOpt = Annotated[Optional[Path], typer.Option("--multiproc-dir", help="a multiprocess directory: every process "
                                                "writing there runs the experiment (instead of --url)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (the GET /experiments contract)")]


class HttpControl:
    """``Control`` over a running service's `/experiments` endpoints; HTTP refusals become ``ControlFailed``."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        import httpx

        try:
            r = httpx.request(method, self.url + path, json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise ControlFailed(0, f"cannot reach {self.url} ({exc.__class__.__name__}: {exc}); is `routescope "
                                   "serve` running there? (--url)") from None
        try:
            doc = r.json()
        except ValueError:
            doc = None
        if r.status_code >= 400:
            message = doc.get("message") if isinstance(doc, dict) else None
            raise ControlFailed(r.status_code, f"{self.url} answered {r.status_code}: {message or r.text[:200]}")
        if doc is None:
            raise ControlFailed(0, f"{self.url}{path} answered {r.status_code} with no JSON: is it routescope serve?")
        return doc

    def start(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/experiments", config)

    def stop(self, experiment_id: str, reason: str) -> dict[str, Any]:
        from urllib.parse import quote

        return self._call("POST", f"/experiments/{quote(experiment_id, safe='')}/stop")

    def acknowledge(self, experiment_id: str, by: str) -> dict[str, Any]:
        from urllib.parse import quote

        return self._call("POST", f"/experiments/{quote(experiment_id, safe='')}/ack")

    def experiments(self) -> list[dict[str, Any]]:
        doc = self._call("GET", "/experiments")
        if not isinstance(doc, dict) or not isinstance(doc.get("experiments"), list):
            raise ControlFailed(0, f"{self.url}/experiments did not answer the contract ({{\"experiments\": [...]}})")
        return doc["experiments"]


def _fail(command: str, message: str, code: int) -> typer.Exit:
    typer.echo(f"routescope experiment {command}: {message}", err=True)
    return typer.Exit(code)


def _target(command: str, url: str | None, directory: Path | None) -> Control:
    """The control the flags name: --url (default) or --multiproc-dir, never both."""
    if url is not None and directory is not None:
        raise _fail(command, "give --url or --multiproc-dir, not both", 2)
    if directory is None:
        return HttpControl(url or DEFAULT_URL)
    if not directory.is_dir():
        raise _fail(command, f"--multiproc-dir {directory} is not a directory", 2)
    from .experiment_control import directory_control

    control = directory_control(directory)
    if control is None:
        raise _fail(command, "the experiments package is not installed here, so a directory cannot be driven", 1)
    return control


def _run(command: str, action: Callable[[], Any]) -> Any:
    """``action()``; a refusal exits 2 when the input was at fault (404, 422), else 1, with the message."""
    try:
        return action()
    except ControlFailed as exc:
        raise _fail(command, exc.message, 2 if exc.status in (404, 422) else 1) from None


def check_candidate(candidate: str) -> str:
    """A candidate's rows and arch through dispatcher.inputs (one set of bounds for every face); its form is the
    experiments package's to judge."""
    from dispatcher.inputs import InputError, check_arch, check_threshold

    name = candidate.strip().lower()
    m = _GATE.match(name)
    if m:
        try:
            if m[1] != "split_below":
                check_arch(m[1])
            rows = int(m[2]) if m[2].isdigit() else m[2]
            check_threshold(rows, what=f"the rows of {name}")
        except InputError as exc:
            raise typer.BadParameter(str(exc)) from None
    return name


def parse_cell(text: str) -> dict[str, Any]:
    """'MODEL:ROWS_BUCKET' or 'ROWS_BUCKET' (any model) -> an aa cell."""
    model, _, bucket = text.rpartition(":")
    if not _BUCKET.match(bucket):
        raise typer.BadParameter(f"{text!r}: give ROWS_BUCKET or MODEL:ROWS_BUCKET, the bucket as /routing labels it "
                                 "(512-1023, 16384+)")
    return {"model": model or None, "rows_bucket": bucket}


def config_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """The config to send: the flags given (None: the experiments package's default)."""
    return {k: v for k, v in values.items() if v is not None and v != ()}


def check_config(config: Mapping[str, Any]) -> None:
    """Refuse a config before it leaves this process, with the experiments package's own words."""
    from .experiment_control import validate_config

    problem = validate_config(config)
    if problem is not None:
        raise _fail("start", problem, 2)


@experiment_app.command("start")
def start_command(
    candidate: Annotated[str, typer.Argument(help="arm B: aa (A/A control), gfx942_N, gfx950_N, split_below_N, "
                                                  "decodes_split_k", callback=check_candidate)],
    experiment_id: Annotated[Optional[str], typer.Option("--id", help="its name (default: the candidate's)")] = None,
    fraction: Annotated[Optional[float], typer.Option(help="probability an eligible call goes to B (default 0.01, "
                                                           "at most 0.1)")] = None,
    seed: Annotated[Optional[int], typer.Option(help="the assignment's seed (the same everywhere)")] = None,
    harm_bound: Annotated[Optional[float], typer.Option(help="stop when a cell's band shows B slower by more (0.05)")] = None,
    budget: Annotated[Optional[float], typer.Option(help="stop when B's extra kernel time passes this share (0.005)")] = None,
    max_calls: Annotated[Optional[int], typer.Option(help="finish after this many B calls")] = None,
    max_seconds: Annotated[Optional[float], typer.Option(help="finish after this long")] = None,
    numerics_every: Annotated[Optional[int], typer.Option(help="one B call in this many is checked against A (64)")] = None,
    cell: Annotated[Optional[list[str]], typer.Option("--cell", help="aa only: MODEL:ROWS_BUCKET or ROWS_BUCKET "
                                                      "(repeat); default every prefill-kernel call")] = None,
    allow_decode_on_prefill: Annotated[bool, typer.Option(
        "--allow-decode-on-prefill", help="let B send decode rows to a prefill kernel (the seed's 9x harm)")] = False,
    url: UrlOpt = None,
    multiproc_dir: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start an experiment: B on a fraction of the calls the two arms route differently, A on the rest."""
    cells = tuple(parse_cell(c) for c in cell or ())
    config = config_of({
        "id": experiment_id or candidate, "candidate": candidate, "fraction": fraction, "seed": seed,
        "harm_bound": harm_bound, "budget": budget, "max_calls": max_calls, "max_seconds": max_seconds,
        "numerics_every": numerics_every, "cells": [dict(c) for c in cells] or None,
        "allow_decode_on_prefill": allow_decode_on_prefill or None,
    })
    control = _target("start", url, multiproc_dir)
    check_config(config)
    started = _run("start", lambda: control.start(config))
    if as_json:
        typer.echo(json.dumps(started, indent=2))
        return
    where = multiproc_dir or (url or DEFAULT_URL)
    typer.echo(f"experiment {started['id']} started in {where}: candidate {started['candidate']}, fraction "
               f"{started['fraction']}; `routescope experiment status` follows it")


@experiment_app.command("stop")
def stop_command(
    experiment_id: Annotated[str, typer.Argument(help="the experiment's id (routescope experiment status lists them)")],
    url: UrlOpt = None,
    multiproc_dir: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop a running experiment: every call goes back to arm A; its results stay readable."""
    control = _target("stop", url, multiproc_dir)
    stopped = _run("stop", lambda: control.stop(experiment_id, MANUAL_REASON))
    if as_json:
        typer.echo(json.dumps(stopped, indent=2))
        return
    typer.echo(f"experiment {stopped['id']} {stopped['state']} ({stopped.get('stop_reason') or 'no reason given'})")


@experiment_app.command("ack")
def ack_command(
    experiment_id: Annotated[str, typer.Argument(help="the stopped experiment's id (routescope experiment status)")],
    url: UrlOpt = None,
    multiproc_dir: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Acknowledge a stopped experiment's stop, once its report is read: RoutescopeExperimentStopped resolves."""
    control = _target("ack", url, multiproc_dir)
    acked = _run("ack", lambda: control.acknowledge(experiment_id, MANUAL_REASON))
    if as_json:
        typer.echo(json.dumps(acked, indent=2))
        return
    typer.echo(f"experiment {acked['id']} stopped ({acked.get('stop_reason')}): stop acknowledged; its alert "
               "resolves at the next scrape and evaluation")


def _pick(experiments: list[dict[str, Any]], experiment_id: str | None, command: str) -> list[dict[str, Any]]:
    if experiment_id is None:
        return experiments
    chosen = [e for e in experiments if e.get("id") == experiment_id]
    if not chosen:
        known = ", ".join(str(e.get("id")) for e in experiments) or "none"
        raise _fail(command, f"no experiment {experiment_id!r} (known: {known})", 2)
    return chosen


@experiment_app.command("status")
def status_command(
    experiment_id: Annotated[Optional[str], typer.Argument(help="one experiment (default: every one)")] = None,
    url: UrlOpt = None,
    multiproc_dir: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Each experiment's state, its calls on each arm, and how many cells have a band yet."""
    from .experiment_report import status_table

    control = _target("status", url, multiproc_dir)
    experiments = _pick(_run("status", control.experiments), experiment_id, "status")
    if as_json:
        typer.echo(json.dumps({"experiments": experiments}, indent=2))
        return
    status_table(experiments)


@experiment_app.command("report")
def report_command(
    experiment_id: Annotated[Optional[str], typer.Argument(help="one experiment (default: every one)")] = None,
    url: UrlOpt = None,
    multiproc_dir: DirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The measured B/A ratio by rows x top-k with its band, beside advise's prediction; the saving; the crossover."""
    from .experiment_report import report

    control = _target("report", url, multiproc_dir)
    experiments = _pick(_run("report", control.experiments), experiment_id, "report")
    if as_json:
        typer.echo(json.dumps({"experiments": experiments}, indent=2))
        return
    report(experiments)
