"""The GPU timing branch, driven on CPU through a stand-in torch.cuda (tests/telemetry/cuda_double.py): device stamps
where the launch arms them, pooled events on the given stream where it does not, query() never synchronize(),
no event or stamp read while a graph is captured, and one clock per series."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.types import Batch, CallClass
from telemetry import Telemetry, TelemetryConfig
from telemetry.clocks.frame import MEASURED_NS

from .conftest import L, args_for, dispatcher, scrape, series, total
from .cuda_double import CudaQ, FakeCuda, FakeTorch, reset

PREFILL = Batch(CallClass.PREFILL)


def probe_and_shape(make_tel, **cfg: Any):
    reset()
    cfg.setdefault("timing_gate", False)  # plain pairs here; tests/telemetry/clocks/test_gate.py drives the gate
    tel = make_tel(TelemetryConfig(models=("glm",), **cfg), torch_module=FakeTorch)
    from dispatcher.validate import validate

    shape = validate(*args_for(8))
    decision = dispatcher().decide(shape, PREFILL)
    return tel, decision, shape


def run(tel: Telemetry, decision, shape, n: int, stream: Any, *, stamp: tuple[int, int] | None = None,
        impl: str = "triton") -> list:
    """n calls through the probe; with ``stamp`` each sampled call's launch arms its stamp and writes (start, end)."""
    p = tel.probe
    tokens = []
    for _ in range(n):
        tok = p.start(decision, shape, PREFILL, "glm", CudaQ(), stream)
        st = getattr(tok, "stamp", None)
        if stamp is not None and st is not None:
            st.armed = True
            st.table.host[st.index] = stamp  # what the kernels write: first program's start, last program's end
        p.stop(tok, impl)
        tokens.append(tok)
    return tokens


def events_of(tel: Telemetry):
    return [e for pair in tel._events.free for e in pair[:2]] + [e for _, pair, _ in tel._events.pending for e in pair[:2]]


def test_kernels_that_write_no_stamps_are_timed_by_events_on_the_given_stream(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=4, sample_every=8, timing_pool=64)
    assert tel.timing == "gpu"
    run(tel, decision, shape, 36, stream="s1")
    sampled = 4 + (36 - 4) // 8  # first 4, then calls 8, 16, 24, 32
    assert FakeCuda.stream_lookups == 0
    assert FakeCuda.recorded == 2 * sampled
    assert len(tel._events.pending) == sampled
    tel.flush()  # nothing finished yet: nothing observed, nothing waited for
    assert total(scrape(tel.registry), "routescope_call_duration_seconds_count") == 0
    for e in events_of(tel):
        e.done = True
    tel.flush()
    s = scrape(tel.registry)
    assert series(s, "routescope_call_duration_seconds_count") == {
        L(kernel="intree.ragged_prefill", rows_bucket="8-15", model="glm", clock="events", rank="0"): sampled}
    assert total(s, "routescope_calls_total") == 36
    assert len(tel._events.free) == 64 and not tel._events.pending
    assert all(st == "s1" for e in events_of(tel) for st in e.streams)
    assert set(dict(k)["impl"] for k in series(s, "routescope_calls_total")) == {"triton"}


def test_armed_stamps_time_calls_on_the_device_clock_and_events_stop(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=4, sample_every=8)
    tokens = run(tel, decision, shape, 36, stream="s1", stamp=(1_000_000, 1_040_000))  # 40 µs each
    sampled = 4 + (36 - 4) // 8
    assert sum(1 for t in tokens if getattr(t, "stamp", None) is not None) == sampled
    assert FakeCuda.recorded == 1, "the first sampled call tries both clocks; once its stamp is armed, events stop"
    tel.flush()
    s = scrape(tel.registry)
    assert series(s, "routescope_call_duration_seconds_count") == {
        L(kernel="intree.ragged_prefill", rows_bucket="8-15", model="glm", clock="device", rank="0"): sampled}
    assert total(s, "routescope_call_duration_seconds_sum") == sampled * 40e-6
    assert all(not b for b in tel._stamps.table("cuda:0", create=False).busy), "read stamps are freed"


@pytest.mark.parametrize(("name", "setting", "frame_ns"), [
    ("stand-in GPU", -1, 0),  # a model not measured: the bare span
    ("NVIDIA H200", -1, MEASURED_NS["NVIDIA H200"]),  # the measured frame of its model
    ("NVIDIA H200", 500, 500),  # the setting wins
    ("NVIDIA H200", 0, 0),
])
def test_device_samples_add_the_kernel_frame_of_the_gpu_model(make_tel, name, setting, frame_ns):
    """What the kernels' programs cannot stamp of their GPU time is added to every span, once a call."""
    tel, decision, shape = probe_and_shape(make_tel, sample_first=4, sample_every=1000, device_frame_ns=setting)
    FakeCuda.name = name  # read when the device's stamp table is made, at its first sampled call
    run(tel, decision, shape, 4, stream="s1", stamp=(1_000_000, 1_040_000))  # 40 µs spans
    tel.flush()
    s = scrape(tel.registry)
    assert total(s, "routescope_call_duration_seconds_count") == 4
    assert total(s, "routescope_call_duration_seconds_sum") == pytest.approx(4 * (40_000 + frame_ns) * 1e-9)
    assert tel.device_frames == {"cuda:0": frame_ns} == tel.snapshot()["device_frames"]


def test_unwritten_stamps_wait_then_are_given_up(make_tel, monkeypatch):
    import telemetry.clocks.stamps as stamps

    tel, decision, shape = probe_and_shape(make_tel, sample_first=1, sample_every=1000)
    p = tel.probe
    tok = p.start(decision, shape, PREFILL, "glm", CudaQ(), "s")
    tok.stamp.armed = True  # the launch armed it; its kernels have not written yet
    p.stop(tok, "triton")
    tel.flush()
    table = tel._stamps.table("cuda:0", create=False)
    assert total(scrape(tel.registry), "routescope_call_duration_seconds_count") == 0
    assert table.busy[tok.stamp.index], "an unwritten stamp waits for a later flush"
    monkeypatch.setattr(stamps, "GIVE_UP_S", -1.0)
    tel.flush()
    assert total(scrape(tel.registry), "routescope_telemetry_dropped_total", reason="timing_unresolved") == 1
    assert not table.busy[tok.stamp.index]


def test_current_stream_looked_up_only_on_sampled_calls(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=2, sample_every=10)
    run(tel, decision, shape, 42, stream=None)
    assert FakeCuda.stream_lookups == 2 + 4


def test_empty_pool_drops_samples_not_calls(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=10, timing_pool=3)
    run(tel, decision, shape, 10, stream="s")
    s = scrape(tel.registry)
    assert total(s, "routescope_telemetry_dropped_total", reason="timing_pool_empty") == 7
    assert total(s, "routescope_calls_total") == 10


def test_cpu_tensors_use_host_time_even_with_a_gpu(make_tel):
    tel, decision, shape = probe_and_shape(make_tel)
    d = tel.instrument(dispatcher())
    for _ in range(3):
        d(*args_for(8), model="glm", num_decodes=0, num_decode_tokens=0, num_prefills=1)
    assert FakeCuda.recorded == 0 and FakeCuda.stream_lookups == 0
    s = scrape(tel.registry)
    assert series(s, "routescope_call_duration_seconds_count") == {
        L(kernel="intree.ragged_prefill", rows_bucket="8-15", model="glm", clock="host", rank="0"): 3}


def test_a_slot_timed_by_two_clocks_keeps_two_series(make_tel):
    """A slot whose implementation changes (stamps, then none) never mixes clocks in one series."""
    tel, decision, shape = probe_and_shape(make_tel, sample_first=3, sample_every=1000)
    run(tel, decision, shape, 1, stream="s", stamp=(1_000, 3_000))
    for e in events_of(tel):
        e.done = True
    tel.flush()
    tel.probe.stop(tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), "s"), "torch")  # no stamp armed
    tel.probe.stop(tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), "s"), "torch")
    for e in events_of(tel):
        e.done = True
    tel.flush()
    s = scrape(tel.registry)
    counts = {dict(k)["clock"]: v for k, v in series(s, "routescope_call_duration_seconds_count").items()}
    assert counts == {"device": 1, "events": 1}
