"""The experiment's gated clock on CPU, through the CUDA double of tests/telemetry (a stand-in for a device this
machine lacks; the H200 run of `routescope bench experiment` is the proof on real CUDA): the calibrations take off
what they measured, readings wait for them, every reading carries its clock's bound, the ROCm form alike.

In the double an event record moves its clock 4 µs on, so a gated pair around a kernel of k µs reads k + 4 µs and an
empty gated pair 4 µs: the offset the clock must find and take off without being told."""

from __future__ import annotations

import pytest

from experiments import calibration
from experiments.calibration import DEFAULT_BOUND_NS, DEVICE, KERNEL, KERNEL_CAL_EVERY, KERNEL_CAL_FIRST
from experiments.clock import Clock, Ticket

from ..telemetry.cuda_double import EPOCH_NS, CudaQ, FakeEvent, FakeStream, FakeTorch, FakeWait, RocmTorch, reset


class Gpu:
    """Plays the device for a gated clock: runs a call's kernel between its records, then the waits and events."""

    def __init__(self, torch_mod=FakeTorch) -> None:
        reset()
        self.wait = FakeWait()
        self.clock = Clock(torch_mod, gate_launcher=self.wait.launcher)
        self.stream = FakeStream(name="compute")

    def call(self, cell: str, kernel_us: float, *, stamps: bool = True, span_short_ns: int = 0,
             is_b: bool = True) -> Ticket:
        """One timed call; a kernel that stamps writes a span ``span_short_ns`` shorter than it ran."""
        ticket = Ticket(cell, is_b, None)
        stamp = self.clock.begin(ticket, CudaQ(), self.stream)
        start_ns = round(FakeEvent.clock * 1e6)
        FakeEvent.clock += kernel_us / 1000
        if stamp is not None and stamps:
            stamp.table.host[stamp.index] = (EPOCH_NS + start_ns,
                                             EPOCH_NS + start_ns + round(kernel_us * 1000) - span_short_ns)
            stamp.armed = True
        self.clock.end(ticket)
        return ticket

    def flush(self) -> list:
        """The device has run everything queued: waits released, events done; then the flush reads."""
        self.wait.run()
        events = self.clock._events
        if events is not None:
            for _, pair, _ in events.pending:
                pair[0].done = pair[1].done = True
        return self.clock.resolve()


def _warm(gpu: Gpu) -> None:
    """The first gated call finds no gate (not timed, counted); the flush builds it and queues the empty pairs."""
    gpu.call("warm", 5.0)
    assert gpu.flush() == [] and gpu.clock.dropped == 1
    assert gpu.flush() == []  # the empty pairs are read


def test_per_kernel_calibration_takes_off_the_offset_its_stamped_calls_measured():
    gpu = Gpu()
    _warm(gpu)
    got = []
    for _ in range(64):
        gpu.call("cell", 7.5, span_short_ns=300)  # the stamp misses 300 ns of the kernel, as a real frame would
        got += gpu.flush()
    kcal = gpu.clock.kernels[("cell", True)]
    calibrating = sum(n <= KERNEL_CAL_FIRST or n % KERNEL_CAL_EVERY == 0 for n in range(1, 65))  # not samples
    assert len(got) == 64 - calibrating and gpu.clock.calibrating == calibrating
    # raw pair less the stamped span, measured (to the ns the double's float milliseconds keep)
    assert kcal.stamps is True and abs(kcal.offset_ns() - (4000 + 300)) <= 2
    for ticket, seconds in got:
        # each unstamped reading is its raw pair (7.5 + 4 µs) less exactly that measured offset
        assert seconds == pytest.approx((7500 + 4000 - kcal.offset_ns()) * 1e-9, abs=3e-9)
        assert ticket.bound == pytest.approx(DEFAULT_BOUND_NS[KERNEL] * 1e-9)
    exact = Gpu()  # a stamp that sees the whole kernel: the readings are the kernel time itself
    _warm(exact)
    readings = []
    for _ in range(16):
        exact.call("cell", 12.0)
        readings += [s for _, s in exact.flush()]
    assert readings and all(s == pytest.approx(12e-6, abs=3e-9) for s in readings)


def test_device_calibration_from_empty_pairs_for_kernels_that_write_no_stamp(monkeypatch):
    monkeypatch.setitem(calibration.KERNEL_STEP_NS, "stand-in GPU", 700)
    gpu = Gpu()
    _warm(gpu)
    cal = gpu.clock.devices["cuda:0"]
    assert abs(cal.offset_ns - (4000 + 700)) <= 2  # the empty pairs' floor (4 µs each) plus the model's kernel step
    got = []
    for _ in range(20):
        gpu.call("foreign", 30.0, stamps=False)
        got += gpu.flush()
    kcal = gpu.clock.kernels[("foreign", True)]
    assert kcal.stamps is False and kcal.offset_ns() is None  # two misses: its kernels write none
    assert len(got) == 20  # every call a sample (no stamp was written, so none was slowed)
    assert all(s == pytest.approx((30_000 + 4000 - 4700) * 1e-9, abs=3e-9) for _, s in got)
    assert all(t.bound == pytest.approx(DEFAULT_BOUND_NS[DEVICE] * 1e-9) for t, _ in got)


def test_readings_wait_for_their_calibration_and_are_never_mixed_in_raw():
    gpu = Gpu()
    gpu.call("warm", 5.0)
    gpu.clock.resolve()  # builds the gate and queues the empty pairs; the device has run none of it yet
    ticket = gpu.call("cell", 9.0, stamps=False)  # a foreign kernel before any calibration is known
    gpu.wait.run()
    _, pair, _ = gpu.clock._events.pending[-1]
    pair[0].done = pair[1].done = True  # only this call's pair is done
    assert gpu.clock.resolve() == []  # held: neither its arm's nor the device's offset is known
    (got, seconds), = [r for r in gpu.flush() if r[0] is ticket] or [(None, None)]
    # its arm's first miss does not yet say the kernels write no stamp; the device's offset is known, but the
    # reading waits (for the arm's calibration, up to calibration.GIVE_UP_S), then takes the device's
    assert got is None
    gpu.clock._held = [(t, d, ns, since - calibration.GIVE_UP_S) for t, d, ns, since in gpu.clock._held]
    cal_offset = gpu.clock.devices["cuda:0"].offset_ns
    (got, seconds), = gpu.flush()
    assert got is ticket and seconds == pytest.approx((9000 + 4000 - cal_offset) * 1e-9, abs=3e-9)


def test_rocm_form_hip_events_and_the_gates_wait_calibrate_alike():
    RocmTorch.use()  # an MI300X as torch built for ROCm presents it; nothing here runs HIP
    try:
        gpu = Gpu(RocmTorch)
        RocmTorch.use()  # Gpu() reset the double's name
        _warm(gpu)
        got = []
        for _ in range(24):
            gpu.call("cell", 20.0, span_short_ns=500)
            got += gpu.flush()
        kcal = gpu.clock.kernels[("cell", True)]
        assert abs(kcal.offset_ns() - 4500) <= 2
        assert got and all(s == pytest.approx(19.5e-6, abs=3e-9) for _, s in got)
        # an AMD model has no measured bound: the default, twice the H200's, stated as a guess
        assert all(t.bound == pytest.approx(DEFAULT_BOUND_NS[KERNEL] * 1e-9) for t, _ in got)
        assert gpu.clock.calibrated()["devices"]["cuda:0"]["pairs"] == calibration.CALIBRATION_PAIRS
    finally:
        reset()


def test_host_clock_readings_carry_no_bound():
    class Cpu:
        is_cuda = False

    clock = Clock(FakeTorch)
    ticket = Ticket("cell", False, None)
    assert clock.begin(ticket, Cpu(), None) is None
    clock.end(ticket)
    (got, seconds), = clock.resolve()
    assert got is ticket and seconds >= 0 and ticket.bound == 0.0
