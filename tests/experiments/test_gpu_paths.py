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


def test_clock_reads_an_armed_stamp_and_else_the_event_pair():
    reset()
    clock = Clock(FakeTorch)
    stamped, unstamped = Ticket("cell", True, None), Ticket("cell", False, None)
    stamp = clock.begin(stamped, CudaQ(), "s1")
    assert stamp is not None and stamp.index == 0
    assert clock.begin(unstamped, CudaQ(), None) is not None  # each timed call gets its own entry
    table = stamp.table
    table.host[stamp.index] = (1_000, 41_000)  # what the kernels write: start and end, ns
    stamp.armed = True
    clock.end(stamped)
    clock.end(unstamped)
    first = clock.resolve()  # the stamp is written; the unstamped call's end event has not completed
    assert [(t.is_b, round(s, 12)) for t, s in first] == [(True, round((40_000 + table.frame) * 1e-9, 12))]
    start, end, _ = unstamped.pair
    start.done = end.done = True
    (ticket, seconds), = clock.resolve()
    assert ticket is unstamped and abs(seconds - (end.t - start.t) * 1e-3) < 1e-12
    assert not any(table.busy)  # both entries given back
    assert FakeCuda.stream_lookups == 1  # only the call that named no stream looked one up
    recorded = FakeCuda.recorded
    again = Ticket("cell", True, None)  # the same cell and arm: its kernels stamp, so no event pair any more
    assert clock.begin(again, CudaQ(), None) is not None
    assert again.pair is None and FakeCuda.recorded == recorded and FakeCuda.stream_lookups == 1


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


def test_gated_clock_times_unstamped_kernels_and_drops_plain_readings():
    from ..telemetry.cuda_double import FakeStream, FakeWait

    reset()
    wait = FakeWait()
    clock = Clock(FakeTorch, gated=True, gate_launcher=wait.launcher)
    stream = FakeStream(name="s")

    def timed(ticket):
        assert clock.begin(ticket, CudaQ(), stream) is None  # no stamp: the kernels run as production runs them
        clock.end(ticket)
        wait.run()
        if ticket.pair is not None:
            _, pair, _ = ticket.pair
            pair[0].done = pair[1].done = True
        return clock.resolve()

    first = Ticket("cell", True, None)
    assert timed(first) == [] and clock.dropped == 1  # no gate yet: not timed, counted; the flush builds the gate
    second = Ticket("cell", True, None)
    (ticket, seconds), = timed(second)
    assert ticket is second and seconds >= 0
    assert wait.launches[-1][2] == stream.cuda_stream  # the second call waited behind the gate, on its stream
    reset()
