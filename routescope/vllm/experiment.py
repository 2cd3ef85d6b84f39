"""Where a vLLM process finds its experiment: the multiprocess directory every process of the server shares.

``routescope experiment start --multiproc-dir DIR`` (or ``POST /experiments`` on ``routescope serve
--multiproc-dir DIR``) writes one config into ``DIR/experiments/``. Each vLLM process (front end, engine
core, workers) runs an ``experiments.control.Registry`` bound to the same directory (the one telemetry
writes: ``ROUTESCOPE_TELEMETRY_MULTIPROC_DIR``, else ``PROMETHEUS_MULTIPROC_DIR``), which picks the config
up at its next flush, so every process and rank runs the same experiment, and honours the stop file any
of them (or the user) writes. ``ROUTESCOPE_VLLM_EXPERIMENTS=0`` keeps the plugin to observing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("vllm.routescope")

SWITCH_ENV = "ROUTESCOPE_VLLM_EXPERIMENTS"
_OFF = frozenset({"0", "false", "no", "off"})


def experiments_dir(env: Mapping[str, str]) -> str | None:
    """The directory telemetry writes (its own variable first), or None."""
    for name in ("ROUTESCOPE_TELEMETRY_MULTIPROC_DIR", "PROMETHEUS_MULTIPROC_DIR"):
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def flush_interval(env: Mapping[str, str]) -> float:
    """Telemetry's flush interval: the experiment's statistics and stops run as often."""
    try:
        value = float(env.get("ROUTESCOPE_TELEMETRY_FLUSH_INTERVAL_S", "").strip() or 1.0)
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0


def registry_factory(*, env: Mapping[str, str], torch_mod: Any = None,
                     gate_launcher: Any = None) -> Callable[..., Any] | None:
    """``make(platform=, policy=, batch_invariant=)`` building a process's Registry; None when none can run (logged).

    ``torch_mod`` and ``gate_launcher``: tests only (the CUDA double and the stand-in for the gate's wait kernel)."""
    if env.get(SWITCH_ENV, "").strip().lower() in _OFF:
        log.info("routescope: %s is off: the plugin observes and routes nothing", SWITCH_ENV)
        return None
    directory = experiments_dir(env)
    if directory is None:
        log.info("routescope: no multiprocess directory (ROUTESCOPE_TELEMETRY_MULTIPROC_DIR or "
                 "PROMETHEUS_MULTIPROC_DIR), so no experiment can reach every process: the plugin only observes")
        return None

    def make(*, platform: Any, policy: Any, batch_invariant: bool) -> Any:
        import torch

        from experiments.control import Registry
        from experiments.covariate import predictor_for

        return Registry(platform, policy, torch_mod=torch if torch_mod is None else torch_mod,
                        predictor=predictor_for(platform), directory=directory, batch_invariant=batch_invariant,
                        gate_launcher=gate_launcher)

    return make
