"""The experiment's GPU branch on CPU, through the CUDA double of tests/telemetry (a stand-in for a device this
machine lacks; the H200 run of `routescope bench experiment` is the proof on real CUDA): the clock reads a written
device stamp, falls back to the event pair, never synchronises; captured calls are never moved."""

from __future__ import annotations

from dispatcher import CallClass, CallShape, what_if
from dispatcher.policy import DecisionCache, Policy
from dispatcher.types import Batch
from experiments import ExperimentConfig
from experiments.assignment import Arm as AssignedArm
from experiments.assignment import assign
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
    # counted: the captured calls the draws picked (B or timed A), the only ones whose capture changes anything
    (cell,) = exp.cells.values()
    picked = sum(assign(exp.config.seed, 0.1, cell.key, i) is not AssignedArm.A for i in range(2000))
    assert 300 < picked < 500 and exp.never_moved["capture"] == picked
    assert exp.b_calls == 0 and cell.calls_b == 0 and cell.calls_a == 2000 - picked
    FakeCuda.capturing = False
    arms = [exp.choose(decision, shape, Batch(CallClass.PREFILL), "m", CudaQ()) for _ in range(2000)]
    assert sum(a is not None and a.is_b for a in arms) > 100  # outside the capture the same calls do move
    reset()


def test_the_current_stream_is_looked_up_once_per_raw_stream():
    """torch.cuda.current_stream() builds a Stream per call; the clock reads the raw handle and keeps the object."""
    from ..telemetry.cuda_double import FakeStream, FakeWait

    reset()
    raw = {"handle": 11}
    streams: list = []

    class RawCuda(FakeCuda):
        @staticmethod
        def current_stream(device=None):
            FakeCuda.stream_lookups += 1
            streams.append(FakeStream(name=f"current {raw['handle']}"))
            return streams[-1]

    class RawTorch(FakeTorch):
        cuda = RawCuda
        _C = type("_C", (), {"_cuda_getCurrentRawStream": staticmethod(lambda index: raw["handle"])})

    class IndexedQ(CudaQ):
        def get_device(self) -> int:
            return 0

    wait = FakeWait()
    clock = Clock(RawTorch, gated=True, gate_launcher=wait.launcher)
    clock.begin(Ticket("cell", True, None), IndexedQ(), None)  # no gate yet; the flush builds it
    clock.resolve()
    for i in range(6):
        raw["handle"] = 11 if i < 3 else 12
        clock.begin(Ticket("cell", True, None), IndexedQ(), None)
    assert FakeCuda.stream_lookups == 2  # one per raw handle seen, not one per call
    assert [launch[2] for launch in wait.launches[-6:]] == [streams[0].cuda_stream] * 3 + [streams[1].cuda_stream] * 3
    reset()
