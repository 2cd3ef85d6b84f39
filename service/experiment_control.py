"""How the service reaches the experiments package: one ``Control`` per app, built by a factory, errors as HTTP statuses.

The HTTP endpoints, `/routing`, the experiment series and `serve --demo --experiment` all go through
it; nothing here imports FastAPI, so `routescope serve`'s command line can catch ``ControlFailed``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("routescope.service")
MANUAL_REASON = "user"  # the stop_reason of a stop asked for by a person (CLI or HTTP); the alert ignores it


class ControlFailed(Exception):
    """A refused request: ``status`` (403, 404 unknown id, 409 conflict, 422 bad config, 503) and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class Control(Protocol):
    """What the service asks of the experiments package; every method may raise ``ControlFailed``."""

    def start(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Start an experiment from its config; the new experiment, in the contract's form."""

    def stop(self, experiment_id: str, reason: str) -> dict[str, Any]:
        """Stop a running experiment; the stopped experiment."""

    def acknowledge(self, experiment_id: str, by: str) -> dict[str, Any]:
        """Record that a person has read a stopped experiment's stop (its alert resolves); the experiment."""

    def experiments(self) -> list[dict[str, Any]]:
        """Every experiment, merged across processes, in the `GET /experiments` contract."""

    def open(self, flush_interval_s: float) -> None:
        """Begin flushing this process's experiments (statistics and stops, off the call path)."""

    def close(self) -> None:
        """Flush once more and detach from the dispatcher."""


def experiments_of(control: Control | None) -> list[dict[str, Any]]:
    """The experiments list for /routing and /metrics: empty (never raising) when there is none or it fails; a
    failure is logged when it starts (each scrape and page poll would repeat it), and once more when it ends."""
    if control is None:
        return []
    try:
        items = list(control.experiments())
    except Exception as exc:  # noqa: BLE001 - /routing and /metrics always answer
        if not getattr(control, "read_failing", False):
            log.warning("experiments read failed: %s: %s (logged again only once it recovers)",
                        exc.__class__.__name__, exc)
            _mark(control, True)
        return []
    if getattr(control, "read_failing", False):
        log.warning("experiments read recovered")
        _mark(control, False)
    return items


def _mark(control: Any, failing: bool) -> None:
    try:
        control.read_failing = failing
    except AttributeError:  # a control that takes no attribute: it logs every failure
        pass


def _api() -> Any:
    """The experiments package, or None where it is not installed (the service then answers 503)."""
    try:
        import experiments
    except ModuleNotFoundError as exc:
        if exc.name and "experiments".startswith(exc.name):
            return None
        raise
    return experiments


def _validation_lines(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
                     for e in errors())


class CoreControl:
    """``Control`` on the experiments package's API, for one target: this process's registry, or a directory.

    ``registry`` (when this process routes calls: the demo) is attached to the dispatcher and flushed by
    ``open``; ``target`` is what start, stop and read go to (the directory when there is one, so every
    process there runs the experiment and the list merges them all). ``idle`` refuses a start that no
    process would run, with the words to say so.
    """

    def __init__(self, api: Any, target: Any, *, registry: Any = None, idle: str | None = None) -> None:
        self.api, self.target, self.registry, self.idle = api, target, registry, idle
        self.owned: str | None = None  # the id `serve --experiment` started: it ends with this service

    def config(self, config: Mapping[str, Any]) -> Any:
        """The package's config model for ``config``; 422 with its own words when refused."""
        try:
            return self.api.ExperimentConfig.model_validate(dict(config))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ControlFailed(422, f"experiment config refused: {_validation_lines(exc)}") from None

    def start(self, config: Mapping[str, Any]) -> dict[str, Any]:
        model = self.config(config)
        if self.idle is not None:
            raise ControlFailed(409, self.idle)
        if isinstance(self.target, Path):
            refused = refusal_on_its_arch(model)
            if refused is not None:
                raise ControlFailed(422, refused)
        try:
            return self.api.start(self.target, model)
        except self.api.ExperimentError as exc:
            refused = isinstance(exc.__cause__, self.api.StartRefused)
            raise ControlFailed(422 if refused else 409, str(exc)) from None

    def stop(self, experiment_id: str, reason: str) -> dict[str, Any]:
        try:
            return self.api.stop(self.target, experiment_id, reason)
        except self.api.ExperimentError as exc:
            raise ControlFailed(404, str(exc)) from None

    def acknowledge(self, experiment_id: str, by: str) -> dict[str, Any]:
        if self.target is None:
            raise ControlFailed(404, f"no experiment {experiment_id!r}: this service has none")
        try:
            return self.api.acknowledge(self.target, experiment_id, by)
        except self.api.ExperimentError as exc:
            raise ControlFailed(409 if isinstance(exc, self.api.NotStopped) else 404, str(exc)) from None

    def experiments(self) -> list[dict[str, Any]]:
        return [] if self.target is None else self.api.experiments(self.target)

    def open(self, flush_interval_s: float) -> None:
        if self.registry is not None:
            self.registry.start_flusher(flush_interval_s)

    def close(self) -> None:
        """Stop the experiment this service started in a directory (the other processes there run it too), then
        flush the registry once more; an in-process experiment ends with the process."""
        try:
            if self.owned is not None and isinstance(self.target, Path):
                self.api.stop(self.target, self.owned, MANUAL_REASON)
        finally:
            if self.registry is not None:
                self.registry.close()


def refusal_on_its_arch(config: Any) -> str | None:
    """Why a gate candidate would be refused on the arch it names (decode rows onto a prefill kernel), judged before
    its config is written into a directory, where each process would otherwise refuse it alone, in its own log."""
    from dispatcher.platform import what_if
    from dispatcher.policy import DecisionCache, Policy
    from experiments.candidates import ArmRouter, StartRefused, refuse_decode_on_prefill

    arch = config.candidate.partition("_")[0]
    if arch not in ("gfx942", "gfx950"):
        return None
    platform, policy = what_if(arch), Policy()
    try:
        refuse_decode_on_prefill(ArmRouter(config, platform, policy), DecisionCache(platform, policy))
    except StartRefused as exc:
        return f"{exc} (judged on a what-if {arch} with AITER and the default gates)"
    return None


def validate_config(config: Mapping[str, Any]) -> str | None:
    """Why the experiments package refuses ``config`` (None: it accepts it, or is not installed here to judge)."""
    api = _api()
    if api is None:
        return None
    try:
        CoreControl(api, None).config(config)
    except ControlFailed as exc:
        return exc.message
    return None


def directory_control(directory: str | os.PathLike) -> Control | None:
    """The control of a multiprocess directory's experiments (what `routescope experiment --multiproc-dir` drives)."""
    api = _api()
    return None if api is None else CoreControl(api, Path(directory))


def build_control(settings: Any, dispatcher: Any, *, environ: Mapping[str, str] | None = None) -> Control | None:
    """The app's control: with the demo, a registry attached to its dispatcher; the directory's experiments where
    there is one (every process there runs them); None without the experiments package."""
    api = _api()
    if api is None:
        return None
    environ = os.environ if environ is None else environ
    directory = Path(settings.multiproc_dir) if settings.multiproc_dir else None
    registry = None
    if settings.demo:
        import torch

        registry = api.Registry(dispatcher.platform, dispatcher.policy, torch_mod=torch,
                                predictor=api.predictor_for(dispatcher.platform), directory=directory,
                                batch_invariant=environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0"))
        registry.attach(dispatcher)
    if directory is not None:
        return CoreControl(api, directory, registry=registry)
    if registry is not None:
        return CoreControl(api, registry, registry=registry)
    return CoreControl(api, None, idle="this service routes no calls of its own (no --demo) and has no "
                       "--multiproc-dir, so no process would run an experiment started here")


def start_demo_experiment(settings: Any, control: Control | None) -> dict[str, Any] | None:
    """`serve --demo --experiment NAME`: start NAME (its id the name, or NAME-2, ... where a directory has it)."""
    if settings.experiment is None:
        return None
    if control is None:
        raise ControlFailed(503, "--experiment needs the experiments package, which is not installed here")
    taken = {e.get("id") for e in control.experiments()}
    name = settings.experiment.strip()
    experiment_id = next(i for i in (name, *(f"{name}-{n}" for n in range(2, 10_000))) if i not in taken)
    config: dict[str, Any] = {"id": experiment_id, "candidate": name}
    if settings.experiment_fraction is not None:
        config["fraction"] = settings.experiment_fraction
    try:
        started = control.start(config)
    except ControlFailed as exc:
        hint = (f" (routescope experiment status --multiproc-dir {settings.multiproc_dir} lists them; stop one with "
                "routescope experiment stop ID)") if exc.status == 409 and settings.multiproc_dir else ""
        raise ControlFailed(exc.status, f"--experiment {name}: {exc.message}{hint}") from None
    if isinstance(control, CoreControl):
        control.owned = started["id"]
        if control.registry is not None and isinstance(control.target, Path):
            # the demo's own registry picks the directory's config up now, so the demo's first call runs it (its
            # flush thread would find it one flush interval later, after a short demo's calls had all gone by)
            control.registry.flush()
    return started
