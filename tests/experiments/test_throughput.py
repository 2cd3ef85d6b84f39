"""`bench experiment`'s throughput part on the CPU: interleaved passes through the kernel doubles, a flush in every
A/A pass, per-pair ratios with their spread. Structure and consistency only: the figures are the bench's to print."""

from __future__ import annotations

import torch

from dispatcher import Dispatcher
from dispatcher.kernels import default_registry
from experiments.bench import Operands, stream
from experiments.throughput import ZERO_IMPL, describe, throughput, zero_registry
from workloads.scale import scaled
from workloads.traffic import DEMO_MODELS


def test_passes_interleave_and_every_aa_pass_holds_a_flush():
    cpu = torch.device("cpu")
    specs = stream(120, seed=3, max_rows=64)
    ops = {m.name: Operands(scaled(m, full=False), 64, cpu, torch.float32, i) for i, m in enumerate(DEMO_MODELS)}
    d = Dispatcher(registry=default_registry(triton=False))
    threads = torch.get_num_threads()
    tp = throughput(d, ops, specs, (0.05, 0.1), cpu, repeats=3, flush_s=0.02, min_pass_s=0.1)
    assert torch.get_num_threads() == threads  # the doubles' single thread is given back
    assert d.arms is None  # nothing left attached
    assert ZERO_IMPL in tp["kernels"] and tp["calls_per_pass"] % len(specs) == 0 and tp["repeats"] == 3
    assert set(tp["cost"]) == {"aa@0.05", "aa@0.1"} == set(tp["states"]) and tp["flush_errors"] == 0
    for k, cost in tp["cost"].items():
        lo, hi = tp["cost_p25_p75"][k]
        assert lo <= cost <= hi
        assert tp["flushes_per_pass"][k] >= 1
    text = describe(tp)
    assert "aa@0.05: cost" in text and "aa@0.1: cost" in text and "p25-p75" in text


def test_the_zero_double_passes_numerics():
    """A and B write the same zeros, so an A/A experiment over the doubles is never stopped on numerics."""
    from tests.experiments.helpers import call_args
    from dispatcher import what_if
    from experiments import ExperimentConfig, Registry

    d = Dispatcher(platform=what_if("cpu"), registry=zero_registry())
    reg = Registry(d.platform, d.policy, torch_mod=torch)
    reg.attach(d)
    exp = reg.start(ExperimentConfig(id="z", candidate="aa", fraction=0.1, harm_bound=1.0, budget=1.0))
    for i in range(400):
        d(*call_args(2 + i % 5), model="m")
    reg.flush()
    assert exp.state_name == "running" and exp.b_calls > 10
    assert all(c.verified and c.mismatched == 0 for c in exp.cells.values())
    reg.close()
