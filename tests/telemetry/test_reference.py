"""The hot path against a plain reference: the same random calls through telemetry's probe and through
tests/telemetry/reference_probe.py must give every series the same value (sampling, slot tables, the rare path,
first calls, guard reroutes and refusals, failing launches, unknown models and rows past the table included)."""

from __future__ import annotations

import random

import pytest

from dispatcher import Dispatcher, GuardMode, Policy, what_if
from dispatcher.kernels import KernelImpl, KernelRegistry
from dispatcher.types import Kernel
from telemetry import TelemetryConfig
from telemetry.config import counterfactual_policy

from .conftest import args_for, noop_registry
from .reference_probe import ReferenceProbe

SERIES = ("calls", "rows", "decisions", "dip_calls", "dip_rows", "would_route", "refused", "rerouted",
          "kernel_errors", "traffic_calls", "traffic_rows", "decode_path_calls", "decode_path_rows")
ROWS = (1, 2, 3, 7, 16, 255, 256, 511, 512, 600, 1023, 1024, 4096, 20000, 70000)
MODELS = ("glm", "dsv4", "qwen", None)


def _calls(rng: random.Random, n: int) -> list[tuple[int, dict]]:
    out = []
    for _ in range(n):
        rows = rng.choice(ROWS)
        kind = rng.random()
        if kind < 0.3:
            meta = {"num_decodes": rows, "num_decode_tokens": rows, "num_prefills": 0}
        elif kind < 0.6:
            d = rng.randint(0, rows - 1) if rows > 1 else 0
            meta = {"num_decodes": d, "num_decode_tokens": d, "num_prefills": 1}
        elif kind < 0.8:
            meta = {}
        else:
            meta = {"query_lens": [1] * (rows - 1) + [1] if rows < 64 else [rows]}
        out.append((rows, {**meta, "model": rng.choice(MODELS)}))
    return out


def _registry(fail: dict, rng: random.Random) -> KernelRegistry:
    """noop kernels; the prefill announces "gluon" and hands one call in five to "triton", as the Hopper launch does."""
    reg = noop_registry(fail)

    def gluon_or_triton(args) -> str | None:
        return "triton" if rng.random() < 0.2 else None

    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "gluon", gluon_or_triton), prefer=True)
    return reg


@pytest.mark.parametrize("guard", [GuardMode.OBSERVE, GuardMode.REROUTE, GuardMode.RAISE])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_series_matches_the_reference(make_tel, guard, seed):
    rng = random.Random(seed)
    policy = Policy(guard=guard)
    platform = what_if("gfx942")
    cfg = TelemetryConfig(models=("glm", "dsv4"), sample_first=3, sample_every=5, timing="host")
    tel = make_tel(cfg, platform=platform, policy=policy)
    fail = {Kernel.AITER_PA_PREFILL_SPARSE: KeyError("pa")} if seed else {}
    real = tel.instrument(Dispatcher(platform=platform, policy=policy, registry=_registry(fail, random.Random(seed))))
    ref = ReferenceProbe(models=("glm", "dsv4"), arch=platform.arch, policy=policy,
                         counterfactuals=tuple(counterfactual_policy(c, policy) for c in cfg.counterfactuals),
                         counterfactual_platform=platform)
    mirror = Dispatcher(platform=platform, policy=policy, registry=_registry(fail, random.Random(seed)), probe=ref)
    for rows, kw in _calls(rng, 3000):
        for d in (real, mirror):
            try:
                d(*args_for(rows), **kw)
            except (KeyError, RuntimeError):
                pass
        if rng.random() < 0.05:
            model = rng.choice(MODELS)
            tel.record_decode_path(rows, model)
            ref.record_decode_path(rows, model)
    totals = tel.flush()
    assert real.probe_failures == 0
    assert sum(totals.telemetry_errors.values()) == 0
    for name in SERIES:
        got = {k: v for k, v in getattr(totals, name).items() if v}
        assert got == ref.series.get(name, {}), name
    assert sum(totals.calls.values()) > 1000
