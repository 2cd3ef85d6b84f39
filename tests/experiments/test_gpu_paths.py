"""The experiment's GPU branch on CPU, through the CUDA double of tests/telemetry (a stand-in for a device this
machine lacks; the H200 run of `routescope bench experiment` is the proof on real CUDA): the clock reads a written
device stamp, falls back to the event pair, never synchronises; captured calls are never moved."""

from __future__ import annotations

from dispatcher import CallClass, CallShape, what_if
from dispatcher.policy import DecisionCache, Policy
from dispatcher.types import Batch
from experiments import ExperimentConfig
from experiments.clock import Clock, Ticket
from experiments.runtime import Experiment

from ..telemetry.cuda_double import CudaQ, FakeCuda, FakeTorch, reset


def test_stamp_clock_reads_an_armed_stamp_and_gates_the_kernels_that_write_none():
    from ..telemetry.cuda_double import FakeStream, FakeWait

    reset()
    wait = FakeWait()
    clock = Clock(FakeTorch, gated=False, gate_launcher=wait.launcher)
    stamped, unstamped = Ticket("cell", True, None), Ticket("cell", False, None)
    stamp = clock.begin(stamped, CudaQ(), "s1")
    assert stamp is not None and stamp.index == 0
    assert clock.begin(unstamped, CudaQ(), None) is not None  # each timed call gets its own entry
    table = stamp.table
    table.host[stamp.index] = (1_000, 41_000)  # what the kernels write: start and end, ns
    stamp.armed = True
    clock.end(stamped)
    clock.end(unstamped)  # its kernels wrote no stamp: not timed, and its arm is gated from now on
    assert clock.dropped == 1
    (ticket, seconds), = clock.resolve()
    assert ticket is stamped and abs(seconds - (40_000 + table.frame) * 1e-9) < 1e-15
    assert not any(table.busy)  # both entries given back
    recorded = FakeCuda.recorded
    again = Ticket("cell", True, None)  # the same cell and arm: its kernels stamp, so no event pair
    assert clock.begin(again, CudaQ(), None) is not None
    assert again.pair is None and FakeCuda.recorded == recorded
    gated = Ticket("cell", False, None)  # the arm whose kernels write none: a gated pair, no stamp
    assert clock.begin(gated, CudaQ(), FakeStream()) is None and gated.stamp is None
    clock.resolve()  # builds the gate (the first gated call found none)
    gated = Ticket("cell", False, None)
    assert clock.begin(gated, CudaQ(), FakeStream()) is None and gated.pair is not None
    assert wait.launches  # behind the gate
    reset()


def test_captured_calls_are_never_moved():
    reset()
    platform, policy = what_if("cpu"), Policy()
    exp = Experiment(ExperimentConfig(id="cap", candidate="split_below_64", fraction=0.1), platform, policy,
                     torch_mod=FakeTorch)
    decisions = DecisionCache(platform, policy)
    shape = CallShape(8)
    decision = decisions.decide(shape, CallClass.PREFILL)
    FakeCuda.capturing = True
    arms = [exp.choose(decision, shape, Batch(CallClass.PREFILL), "m", CudaQ()) for _ in range(2000)]
    assert arms == [None] * 2000
    assert exp.never_moved["capture"] == 2000
    assert exp.b_calls == 0
    FakeCuda.capturing = False
    arms = [exp.choose(decision, shape, Batch(CallClass.PREFILL), "m", CudaQ()) for _ in range(2000)]
    assert sum(a is not None and a.is_b for a in arms) > 100  # outside the capture the same calls do move
    reset()
