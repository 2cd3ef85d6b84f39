"""Kernel time from CUPTI (dispatcher/sweep/cupti.py and the sweep's KernelTimer)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from dispatcher.sweep.cupti import CALL_PREFIX, Span, call_kernels, call_name, call_seconds, spans

HAVE_CUDA = torch.cuda.is_available()


def test_a_call_is_timed_by_its_gpu_range_alone():
    found = [Span(call_name(0), False, 0.0, 50.0),  # the host's time in the call: not kernel time
             Span(call_name(0), True, 10.0, 22.5), Span("spin_kernel", True, 0.0, 9.0),
             Span(call_name(1), True, 30.0, 34.0)]
    assert call_seconds(found) == pytest.approx({0: 12.5e-6, 1: 4.0e-6})


def test_a_call_seen_in_several_gpu_ranges_spans_them_all():
    found = [Span(call_name(3), True, 10.0, 12.0), Span(call_name(3), True, 15.0, 19.0)]
    assert call_seconds(found) == pytest.approx({3: 9.0e-6})


def test_other_names_and_a_call_without_kernels_are_absent():
    found = [Span(CALL_PREFIX + "x", True, 0.0, 1.0), Span("rs_callx_1", True, 0.0, 1.0),
             Span(call_name(2), False, 0.0, 5.0)]
    assert call_seconds(found) == {}
    assert call_seconds([Span("mine_4", True, 1.0, 3.0)], prefix="mine_") == pytest.approx({4: 2.0e-6})


def test_each_calls_kernels_are_the_gpu_spans_inside_its_range_with_what_ran_before():
    found = [Span("flush", True, 0.0, 2.0), Span("hold", True, 2.5, 8.0),
             Span(call_name(0), True, 10.0, 24.0), Span(call_name(0), False, 1.0, 30.0),
             Span("reduce", True, 11.0, 24.0), Span("partial", True, 10.0, 21.0),
             Span("hold", True, 30.0, 40.0), Span(call_name(1), True, 41.0, 45.0), Span("partial", True, 41.0, 45.0)]
    got = call_kernels(found)
    assert [k.name for k in got[0].kernels] == ["partial", "reduce"]  # in start order, whatever the event order
    assert got[0].before == Span("hold", True, 2.5, 8.0)
    assert [k.name for k in got[1].kernels] == ["partial"] and got[1].before.start_us == 30.0
    assert set(got) == {0, 1}


def test_a_call_with_no_kernel_inside_has_none_before_it():
    found = [Span("hold", True, 0.0, 5.0), Span(call_name(2), True, 6.0, 6.5)]
    assert call_kernels(found) == {2: ([], None)}  # the hold ended before the call, but no kernel of it ran
    assert call_kernels([Span(call_name(0), False, 0.0, 1.0)]) == {}  # a range on the host only: no call


def test_call_names_are_counted_from_zero():
    assert call_name(7) == CALL_PREFIX + "7"
    with pytest.raises(ValueError, match=">= 0"):
        call_name(-1)


def test_spans_read_a_real_profile():
    """A CPU-only profile: the call's range is there, on the host, so it has no kernel time."""
    x = torch.ones(64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function(call_name(0)):
            (x * 2).sum()
    found = spans(prof.events())
    mine = [s for s in found if s.name == call_name(0)]
    assert len(mine) == 1 and not mine[0].on_gpu and mine[0].end_us >= mine[0].start_us
    assert any(s.name.startswith("aten::") for s in found)
    assert call_seconds(found) == {}


@pytest.mark.filterwarnings("ignore:CUDA is not available, disabling CUDA profiling:UserWarning")  # by design here
def test_kernel_time_without_gpu_ranges_is_refused_with_the_reason(monkeypatch):
    """Calls that leave no GPU range (here the host runs them, with the timer's CUDA steps stood in for) give no
    kernel time: the profiling half of KernelTimer.paired_spans, on the CPU."""
    from dispatcher.sweep import timing

    monkeypatch.setattr(timing, "L2_FLUSH_BYTES", 1024)
    timer = timing.KernelTimer(torch.device("cpu"))
    ran = []

    def host_run(calls, repeats, around):  # GpuTimer._run without its CUDA events: the same ranges around each call
        for i in range(repeats):
            with around(i):
                calls[i % len(calls)]()
        return [1.0] * repeats

    def host_warm(launch, sets, warmup):  # GpuTimer._warm without its device synchronisation
        for i in range(warmup):
            launch(sets[i % len(sets)])
        return [lambda a=a: launch(a) for a in sets]

    monkeypatch.setattr(timer, "_warm", host_warm)
    monkeypatch.setattr(timer, "_run", host_run)
    with pytest.raises(RuntimeError, match="no GPU range for 3 of 3 calls"):
        timer.paired_spans(lambda a: ran.append(a), [None], warmup=1, repeats=3)
    assert len(ran) == 1 + 3  # the warm-up call, then the three profiled ones


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device")
def test_kernel_time_spans_a_calls_kernels_and_leaves_out_the_events():
    """Real CUPTI: one spin kernel, then two in a row; the event pair around the same calls reads more."""
    from dispatcher.sweep.timing import KernelTimer

    cycles = 100_000
    dev = torch.device("cuda")
    timer = KernelTimer(dev)
    one, one_ev = timer.paired(lambda a: torch.cuda._sleep(cycles), [None], warmup=2, repeats=20)
    two, _ = timer.paired(lambda a: (torch.cuda._sleep(cycles), torch.cuda._sleep(cycles)), [None], warmup=2,
                          repeats=20)
    assert one.timer == "cupti" and one_ev.timer == "cuda-events" and one.repeats == 20
    assert 30 < one.median_us < 200  # 100,000 cycles: 48-100 µs at 1-2.1 GHz
    assert 1.7 < two.median_us / one.median_us < 2.3  # first kernel's start to the second's end
    assert one.median_us < one_ev.median_us  # the events' own cost is not in kernel time
