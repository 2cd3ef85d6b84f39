"""Start, stop and read experiments on a target: an in-process ``Registry`` or a multiprocess directory.

A directory holds ``experiments/<id>.config.json`` (one config for every process there), one
``<id>.<process>.state.json`` per process (written at its flush), ``<id>.stop.json`` once anyone stops it and
``<id>.ack.json`` once a person acknowledges the stop (the alert then resolves); every
process's ``Registry`` bound to the directory picks a new config up, honours the stop file, and writes the stop file
itself when its own kill switch fires, so one process's stop stops them all.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from dispatcher.platform import Platform
from dispatcher.policy import Policy

from .candidates import StartRefused
from .config import ExperimentConfig
from .covariate import Predictor
from .report import merge, view
from .runtime import Experiment, State

log = logging.getLogger("routescope.experiments")
SUBDIR = "experiments"


class ExperimentError(ValueError):
    """A control request that cannot be done: unknown id, one already running, a refused start."""


class NotStopped(ExperimentError):
    """An acknowledgement for an experiment with no stop to acknowledge (it runs, or finished by its limits)."""


def _dir(target: str | os.PathLike) -> Path:
    return Path(target) / SUBDIR


def _write_json(path: Path, doc: Any) -> None:
    """Whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Registry:
    """This process's experiments; attached dispatchers route through the running one. Built by hand, no globals.

    ``directory``: a multiprocess directory whose experiments this process runs (``flush`` picks them up).
    ``batch_invariant``: vLLM's batch-invariant mode is on (every call keeps its kernel; the caller reads
    ``VLLM_BATCH_INVARIANT``).
    ``gate_launcher``: tests only, a stand-in for the stream gate's Triton wait kernel (which needs a GPU).
    """

    def __init__(self, platform: Platform, policy: Policy, *, torch_mod: Any = None,
                 predictor: Predictor | None = None, directory: str | os.PathLike | None = None,
                 batch_invariant: bool = False, gate_launcher: Any = None) -> None:
        self.platform, self.policy = platform, policy
        self.torch = torch_mod
        self.gate_launcher = gate_launcher
        self.predictor = predictor
        self.directory = Path(directory) if directory is not None else None
        self.batch_invariant = batch_invariant
        self.dispatchers: list[Any] = []
        self.all: dict[str, Experiment] = {}
        self.current: Experiment | None = None
        self.process = f"{os.getpid()}-{int(time.time() * 1000)}"
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop_flusher = threading.Event()
        self.flush_errors = 0
        self._stop_published: set[str] = set()  # experiments whose stop file this process has seen to
        self._final_written: set[str] = set()  # experiments whose final state file this process has written
        self.acks: dict[str, dict] = {}  # experiment id -> {at, by}: a person has read its stop

    def attach(self, dispatcher: Any) -> None:
        """Route ``dispatcher``'s calls through the running experiment (now and whenever one starts)."""
        with self._lock:
            self.dispatchers.append(dispatcher)
            dispatcher.set_arms(self.current if self.current is not None and self.current.running else None)

    def _set_arms(self, experiment: Experiment | None) -> None:
        for d in self.dispatchers:
            d.set_arms(experiment)

    def start(self, config: ExperimentConfig, *, started_at: float | None = None) -> Experiment:
        with self._lock:
            if config.id in self.all:
                raise ExperimentError(f"experiment {config.id!r} exists already; use another id")
            if self.current is not None and self.current.running:
                raise ExperimentError(f"experiment {self.current.config.id!r} is running; stop it before starting "
                                      f"{config.id!r}")
            try:
                experiment = Experiment(config, self.platform, self.policy, torch_mod=self.torch,
                                        predictor=self.predictor, batch_invariant=self.batch_invariant,
                                        started_at=started_at, gate_launcher=self.gate_launcher)
            except StartRefused as exc:
                raise ExperimentError(str(exc)) from exc
            self.all[config.id] = experiment
            self.current = experiment
            self._set_arms(experiment)
            log.info("experiment %s started: %s at fraction %s", config.id, config.candidate, config.fraction)
            return experiment

    def stop(self, experiment_id: str, reason: str = "user") -> Experiment:
        with self._lock:
            experiment = self.all.get(experiment_id)
            if experiment is None:
                raise ExperimentError(f"no experiment {experiment_id!r}")
            experiment.stop(reason)
            if experiment is self.current:
                self._set_arms(None)
            return experiment

    def acknowledge(self, experiment_id: str, by: str = "user") -> Experiment:
        """Record that a person has read a stopped experiment's stop; the first acknowledgement stays."""
        with self._lock:
            experiment = self.all.get(experiment_id)
            if experiment is None:
                raise ExperimentError(f"no experiment {experiment_id!r}")
            _check_ackable(experiment_id, experiment.state_name)
            self.acks.setdefault(experiment_id, {"at": time.time(), "by": by})
            return experiment

    def flush(self) -> None:
        """Statistics and stops for every experiment; the directory's configs, stop files and state files."""
        with self._lock:
            if self.directory is not None:
                self._pick_up()
            for experiment in list(self.all.values()):
                experiment.flush()
                if experiment is self.current and not experiment.running:
                    self._set_arms(None)
                if self.directory is not None:
                    self._publish(experiment)

    def _publish(self, experiment: Experiment) -> None:
        """This process's state file, until its final state is written; the stop file once it has stopped, whether
        the stop came in a flush or on the call path (B raised, a numerics mismatch on CPU), so every process stops."""
        folder = _dir(self.directory)  # type: ignore[arg-type]
        experiment_id = experiment.config.id
        if experiment.state_name == State.STOPPED and experiment_id not in self._stop_published:
            stop_path = folder / f"{experiment_id}.stop.json"
            if not stop_path.exists():
                _write_json(stop_path, {"reason": experiment.stop_reason, "by": self.process, "at": time.time()})
            self._stop_published.add(experiment_id)
        if experiment_id not in self._final_written:
            _write_json(folder / f"{experiment_id}.{self.process}.state.json", experiment.state())
            if experiment.state_name != State.RUNNING:
                self._final_written.add(experiment_id)

    def _pick_up(self) -> None:
        folder = _dir(self.directory)  # type: ignore[arg-type]
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*.config.json")):
            doc = _read_json(path)
            if doc is None:
                continue
            experiment_id = path.name.removesuffix(".config.json")
            stop = _read_json(folder / f"{experiment_id}.stop.json")
            have = self.all.get(experiment_id)
            if have is None and stop is None:
                try:
                    config = ExperimentConfig.model_validate(doc["config"])
                    self.start(config, started_at=doc.get("started_at"))
                except (ExperimentError, ValueError, KeyError) as exc:
                    log.warning("experiment %s not run in this process: %s", experiment_id, exc)
                    self.flush_errors += 1
            elif have is not None and stop is not None and have.state_name == State.RUNNING:
                have.stop(stop.get("reason") or "user")
                if have is self.current:
                    self._set_arms(None)

    def views(self) -> list[dict]:
        with self._lock:
            return [_with_ack(view(merge([e.state()])), self.acks.get(i)) for i, e in self.all.items()]

    def start_flusher(self, interval_s: float = 1.0) -> None:
        """Flush every ``interval_s`` on a daemon thread (``close`` stops it)."""
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop_flusher.wait(interval_s):
                try:
                    self.flush()
                except Exception:  # noqa: BLE001 - the flusher never dies; counted
                    self.flush_errors += 1
                    log.exception("experiment flush failed")

        self._thread = threading.Thread(target=loop, name="routescope-experiments", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the flusher (a last flush first) and detach from every dispatcher."""
        self._stop_flusher.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            self.flush()
        finally:
            self._set_arms(None)


Target = Registry | str | os.PathLike


def start(target: Target, config: ExperimentConfig) -> dict:
    """Start ``config`` on the target; the experiment's view. Refused (ExperimentError) with a message saying why."""
    if isinstance(target, Registry):
        target.start(config)
        return _one(target.views(), config.id)
    folder = _dir(target)
    config_path = folder / f"{config.id}.config.json"
    if config_path.exists():
        raise ExperimentError(f"experiment {config.id!r} exists already in {folder}; use another id")
    for item in experiments(target):
        if item["state"] == "running":
            raise ExperimentError(f"experiment {item['id']!r} is running in {folder}; stop it before starting "
                                  f"{config.id!r}")
    _write_json(config_path, {"config": config.model_dump(mode="json"), "started_at": time.time()})
    return _one(experiments(target), config.id)


def stop(target: Target, experiment_id: str, reason: str = "user") -> dict:
    """Stop an experiment (idempotent: a stopped or finished one stays as it is); its view."""
    if isinstance(target, Registry):
        target.stop(experiment_id, reason)
        return _one(target.views(), experiment_id)
    folder = _dir(target)
    if not (folder / f"{experiment_id}.config.json").exists():
        raise ExperimentError(f"no experiment {experiment_id!r} in {folder}")
    if not (folder / f"{experiment_id}.stop.json").exists():
        _write_json(folder / f"{experiment_id}.stop.json", {"reason": reason, "by": "control", "at": time.time()})
    return _one(experiments(target), experiment_id)


def acknowledge(target: Target, experiment_id: str, by: str = "user") -> dict:
    """A person has read a stopped experiment's stop: the view's ``acknowledged`` ({at, by}) is set, and the stop
    alert resolves; the experiment stays stopped and readable. Idempotent (the first acknowledgement stays);
    ExperimentError for an unknown id or one that is not stopped (running, or finished by its limits)."""
    if isinstance(target, Registry):
        target.acknowledge(experiment_id, by)
        return _one(target.views(), experiment_id)
    folder = _dir(target)
    item = _one(experiments(target), experiment_id) if (folder / f"{experiment_id}.config.json").exists() else None
    if item is None:
        raise ExperimentError(f"no experiment {experiment_id!r} in {folder}")
    _check_ackable(experiment_id, item["state"])
    if not (folder / f"{experiment_id}.ack.json").exists():
        _write_json(folder / f"{experiment_id}.ack.json", {"at": time.time(), "by": by})
    return _one(experiments(target), experiment_id)


def _check_ackable(experiment_id: str, state: str) -> None:
    if state != State.STOPPED:
        raise NotStopped(f"experiment {experiment_id!r} is {state}: only a stopped experiment's stop is "
                         "acknowledged")


def _with_ack(item: dict, ack: dict | None) -> dict:
    item["acknowledged"] = None if ack is None or item["state"] != State.STOPPED else {"at": ack.get("at"),
                                                                                       "by": ack.get("by")}
    return item


def experiments(target: Target) -> list[dict]:
    """Every experiment on the target, merged across processes and ranks: the ``GET /experiments`` items."""
    if isinstance(target, Registry):
        return target.views()
    folder = _dir(target)
    out = []
    for path in sorted(folder.glob("*.config.json")) if folder.is_dir() else ():
        doc = _read_json(path)
        if doc is None:
            continue
        experiment_id = path.name.removesuffix(".config.json")
        states = [s for s in (_read_json(p) for p in sorted(folder.glob(f"{experiment_id}.*.state.json")))
                  if s is not None]
        stop_doc = _read_json(folder / f"{experiment_id}.stop.json")
        if not states:
            states = [{"config": doc["config"], "state": "running", "stop_reason": None, "end_reason": None,
                       "started_at": doc.get("started_at", 0.0), "ended_at": None, "cells": [], "never_moved": {},
                       "history": []}]
        merged = merge(states)
        merged["processes"] = len(states) if states[0].get("cells") is not None and "clock_dropped" in states[0] \
            else 0
        if stop_doc is not None and merged["state"] == "running":
            merged["state"], merged["stop_reason"] = "stopped", stop_doc.get("reason") or "user"
            merged["ended_at"] = stop_doc.get("at")
        out.append(_with_ack(view(merged), _read_json(folder / f"{experiment_id}.ack.json")))
    return out


def _one(items: list[dict], experiment_id: str) -> dict:
    for item in items:
        if item["id"] == experiment_id:
            return item
    raise ExperimentError(f"no experiment {experiment_id!r}")
