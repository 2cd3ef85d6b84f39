"""The experiment through the real Dispatcher and real torch kernels on CPU: the kill switch, outputs the caller
gets, the calls never moved, the start-time refusal, limits, and the arm label in telemetry."""

from __future__ import annotations

import logging

import pytest
import torch

from dispatcher import Dispatcher, GuardMode, Policy, what_if
from dispatcher.kernels import KernelImpl, KernelRegistry, default_registry
from dispatcher.kernels.torch_ref import ragged_prefill
from dispatcher.kernels.torch_splitk import sparse_decode
from dispatcher.types import Kernel
from experiments import ExperimentConfig, ExperimentError, Registry, experiments, start
from experiments.report import budget_seconds

from .helpers import call_args, cpu_dispatcher


def _registry_with_b(launch) -> KernelRegistry:
    """A real prefill (A) and a planted double of the split-K kernel (B)."""
    reg = KernelRegistry()
    reg.register(KernelImpl(Kernel.INTREE_RAGGED_PREFILL, "torch", ragged_prefill))
    reg.register(KernelImpl(Kernel.INTREE_SPARSE_DECODE, "double", launch))
    return reg


def _slow_b(args):
    """The prefill kernel run three times: exactly A's work, three times over (a 3x slower arm B)."""
    for _ in range(3):
        ragged_prefill(args)


def _reference(rows, seed):
    args = call_args(rows, seed)
    ragged_prefill(args_for_kernel(args))
    return args[-1]


def args_for_kernel(args):
    from dispatcher.kernels.common import KernelArgs, SparseIndex

    q, kv, idx, tl, scale, _, _, _, sink, out = args
    return KernelArgs(q, kv, SparseIndex(idx, tl), scale, sink, out)


def _run(d, reg, calls, *, rows=(8, 40), flush_every=50, outputs=None):
    for i in range(calls):
        r, seed = rows[i % len(rows)], i % 5
        args = call_args(r, seed)
        d(*args, model="m")
        if outputs is not None:
            outputs.append((r, seed, args[-1].clone()))
        if i % flush_every == 0:
            reg.flush()
            if reg.current is not None and not reg.current.running:
                break
    reg.flush()


def _start(d, **kw):
    reg = Registry(d.platform, d.policy)
    reg.attach(d)
    config = {"id": "t", "candidate": "split_below_64", "fraction": 0.1} | kw
    start(reg, ExperimentConfig(**config))
    return reg


def test_planted_slow_arm_stops_on_harm_before_the_budget_is_spent(caplog):
    d = Dispatcher(platform=what_if("cpu"), registry=_registry_with_b(_slow_b))
    reg = _start(d, min_samples=20)
    with caplog.at_level(logging.WARNING, logger="routescope.experiments"):
        _run(d, reg, 6000)
    (view,) = experiments(reg)
    assert view["state"] == "stopped" and view["stop_reason"] == "harm"
    assert d.arms is None  # B takes no more calls
    budget = budget_seconds(reg.current.config, view["budget"]["eligible_s"], view["elapsed_s"])
    assert 0 < view["budget"]["extra_s"] < budget
    assert any(c["ratio_low"] and c["ratio_low"] > 1.05 for c in view["cells"])
    assert [r.getMessage() for r in caplog.records].count("experiment t stopped: harm") == 1  # logged once


def test_budget_stops_a_mildly_slower_arm_when_the_window_is_short():
    def slower(args):
        ragged_prefill(args)
        ragged_prefill(args)

    d = Dispatcher(platform=what_if("cpu"), registry=_registry_with_b(slower))
    reg = _start(d, harm_bound=1.0, window_s=0.001)  # harm only past 2x: the budget is what stops it
    _run(d, reg, 4000)
    (view,) = experiments(reg)
    assert view["state"] == "stopped" and view["stop_reason"] == "budget"


def test_planted_wrong_arm_stops_and_every_output_the_caller_got_is_a_bit_for_bit():
    def wrong(args):
        sparse_decode(args)
        args.output.mul_(1.5)

    d = Dispatcher(platform=what_if("cpu"), registry=_registry_with_b(wrong))
    reg = _start(d)
    outputs = []
    _run(d, reg, 3000, outputs=outputs)
    (view,) = experiments(reg)
    assert view["state"] == "stopped" and view["stop_reason"] == "numerics"
    assert sum(c["numerics"]["mismatched"] for c in view["cells"]) >= 1
    for rows, seed, got in outputs:
        assert torch.equal(got, _reference(rows, seed))


def test_b_that_raises_lets_the_call_succeed_and_stops_the_experiment():
    def broken(args):
        raise RuntimeError("B broke")

    d = Dispatcher(platform=what_if("cpu"), registry=_registry_with_b(broken))
    reg = _start(d, numerics_every=1_000_000)
    outputs = []
    _run(d, reg, 400, outputs=outputs)
    (view,) = experiments(reg)
    assert view["state"] == "stopped"
    assert view["stop_reason"] == "b_raised" and view["b_failures"] >= 1
    assert "B broke" in view["last_error"]
    for rows, seed, got in outputs:
        assert torch.equal(got, _reference(rows, seed))


def test_never_moved_reasons_are_counted():
    d = Dispatcher(platform=what_if("cpu"), policy=Policy(guard=GuardMode.RAISE),
                   registry=default_registry(triton=False))
    reg = _start(d, candidate="split_below_64")
    with pytest.raises(Exception, match="pure-decode"):
        d(*call_args(4), model="m", query_lens=[1, 1, 1, 1])
    (view,) = experiments(reg)
    assert view["never_moved"]["guard_refusal"] == 1

    d2 = cpu_dispatcher()
    reg2 = Registry(d2.platform, d2.policy, batch_invariant=True)
    reg2.attach(d2)
    reg2.start(ExperimentConfig(id="bi", candidate="split_below_64", fraction=0.1))
    for i in range(50):
        d2(*call_args(8, i % 3), model="m")
    reg2.flush()
    (view2,) = experiments(reg2)
    assert view2["never_moved"]["batch_invariant"] == 50 and not view2["cells"]


def test_candidate_unavailable_stays_on_a_and_is_counted():
    # gfx942 what-if with AITER enabled but not importable here: B (pa_prefill_sparse) cannot run
    d = Dispatcher(platform=what_if("gfx942", aiter=True), registry=default_registry(triton=False))
    reg = _start(d, candidate="gfx942_16", fraction=0.1, allow_decode_on_prefill=True)
    for i in range(300):
        args = call_args(40, i % 3, torch.float16)
        assert d(*args, model="m").kernel is Kernel.INTREE_RAGGED_PREFILL
    reg.flush()
    (view,) = experiments(reg)
    assert view["never_moved"]["candidate_unavailable"] >= 250
    assert view["state"] == "running" and view["b_failures"] == 0


def test_decode_rows_onto_a_prefill_kernel_are_refused_at_start():
    d = Dispatcher(platform=what_if("gfx942", aiter=True), registry=default_registry(triton=False))
    reg = Registry(d.platform, d.policy)
    with pytest.raises(ExperimentError, match="decode rows onto a prefill kernel.*allow_decode_on_prefill"):
        start(reg, ExperimentConfig(id="harm", candidate="gfx942_256"))
    start(reg, ExperimentConfig(id="harm2", candidate="split_below_64"))  # moves calls onto split-K: allowed


def test_max_calls_finishes_the_experiment():
    d = cpu_dispatcher()
    reg = _start(d, max_calls=5, harm_bound=1.0, budget=1.0)
    _run(d, reg, 400)
    (view,) = experiments(reg)
    assert view["state"] == "finished" and view["end_reason"] == "max_calls" and view["stop_reason"] is None
    assert sum(c["calls_b"] for c in view["cells"]) == 5


def test_arm_b_calls_carry_the_experiment_label_in_telemetry():
    from prometheus_client.parser import text_string_to_metric_families

    from prometheus_client import generate_latest

    from telemetry import Telemetry, TelemetryConfig
    from telemetry.exposition import classic_only

    tel = Telemetry(TelemetryConfig(models=("m",)), platform=what_if("cpu"), policy=Policy())
    try:
        d = tel.instrument(cpu_dispatcher())
        reg = _start(d, harm_bound=1.0, budget=1.0)
        _run(d, reg, 300, rows=(8,))
        tel.flush()
        text = generate_latest(classic_only(tel.registry)).decode()
        decisions = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "routescope_decisions_total" and s.value:
                    decisions[(s.labels["kernel"], s.labels["reason"])] = s.value
        (cell,) = experiments(reg)[0]["cells"]
        # a numerics sample's output is A's, and telemetry counts it as A's; every other B call is labelled
        assert decisions[("intree.sparse_decode", "experiment_b")] == cell["calls_b"] - cell["numerics"]["checked"] > 0
        assert sum(decisions.values()) == 300
    finally:
        tel.close()


def test_max_seconds_finishes_the_experiment_at_a_flush():
    import time

    d = cpu_dispatcher()
    reg = _start(d, max_seconds=0.05, harm_bound=1.0, budget=1.0)
    d(*call_args(8), model="m")
    time.sleep(0.1)
    reg.flush()
    (view,) = experiments(reg)
    assert view["state"] == "finished" and view["end_reason"] == "max_seconds" and d.arms is None
