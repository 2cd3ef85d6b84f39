"""The GPU timing branch, driven on CPU through a stand-in torch.cuda: pooled events on the given stream,
current-stream lookups only on sampled calls, query() not synchronize(), capture counted and never timed."""

from __future__ import annotations

from typing import Any

from dispatcher import Policy, what_if
from dispatcher.types import Batch, CallClass
from telemetry import Telemetry, TelemetryConfig

from .conftest import args_for, dispatcher, scrape, series


class FakeEvent:
    clock = 0.0

    def __init__(self, enable_timing: bool = False, **kw: Any) -> None:
        assert enable_timing and not kw.get("external")
        self.streams: list = []
        self.t: float | None = None
        self.done = False

    def record(self, stream: Any = None) -> None:
        assert stream is not None, "events are recorded on an explicit stream"
        assert not FakeCuda.capturing, "no timing event may be recorded during capture"
        FakeEvent.clock += 0.004  # 4 µs per record, in ms
        self.t = FakeEvent.clock
        self.streams.append(stream)
        FakeCuda.recorded += 1

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.done and end.done
        return end.t - self.t  # ms

    def synchronize(self) -> None:
        raise AssertionError("telemetry must never synchronize")


class FakeCuda:
    Event = FakeEvent
    capturing = False
    stream_lookups = 0
    recorded = 0

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_stream(device: Any = None) -> str:
        FakeCuda.stream_lookups += 1
        return "current-stream"

    @staticmethod
    def is_current_stream_capturing() -> bool:
        return FakeCuda.capturing

    @staticmethod
    def synchronize() -> None:
        raise AssertionError("telemetry must never synchronize")


class FakeTorch:
    cuda = FakeCuda


class CudaQ:
    """Stands in for a device tensor: the probe only reads is_cuda and device."""

    is_cuda = True
    device = "cuda:0"


def probe_and_shape(make_tel, **cfg: Any):
    FakeCuda.capturing, FakeCuda.stream_lookups, FakeCuda.recorded = False, 0, 0
    tel = make_tel(TelemetryConfig(models=("glm",), **cfg), torch_module=FakeTorch)
    d = dispatcher()
    from dispatcher.validate import validate

    shape = validate(*args_for(8))
    decision = d.decide(shape, Batch(CallClass.PREFILL))
    return tel, decision, shape


def run(tel: Telemetry, decision, shape, n: int, stream: Any) -> None:
    p = tel.probe
    for _ in range(n):
        tok = p.start(decision, shape, Batch(CallClass.PREFILL), "glm", CudaQ(), stream)
        p.stop(tok, "triton")


def events_of(tel: Telemetry):
    return [e for pair in tel._gpu.free for e in pair] + [e for _, pair, _ in tel._gpu.pending for e in pair]


def test_events_on_the_given_stream_resolved_by_query(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=4, sample_every=8, timing_pool=64)
    assert tel.timing == "gpu_events"
    run(tel, decision, shape, 36, stream="s1")
    sampled = 4 + (36 - 4) // 8  # first 4, then calls 8, 16, 24, 32
    assert FakeCuda.stream_lookups == 0
    assert FakeCuda.recorded == 2 * sampled
    assert len(tel._gpu.pending) == sampled
    tel.flush()  # nothing finished yet: nothing observed, nothing waited for
    s = scrape(tel.registry)
    assert sum(series(s, "routescope_call_duration_seconds_count").values()) == 0
    for e in events_of(tel):
        e.done = True
    tel.flush()
    s = scrape(tel.registry)
    assert sum(series(s, "routescope_call_duration_seconds_count").values()) == sampled
    assert sum(series(s, "routescope_calls_total").values()) == 36
    assert len(tel._gpu.free) == 64 and not tel._gpu.pending
    assert all(st == "s1" for e in events_of(tel) for st in e.streams)
    assert set(dict(k)["impl"] for k in series(s, "routescope_calls_total")) == {"triton"}


def test_current_stream_looked_up_only_on_sampled_calls(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=2, sample_every=10)
    run(tel, decision, shape, 42, stream=None)
    assert FakeCuda.stream_lookups == 2 + 4


def test_empty_pool_drops_samples_not_calls(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=10, timing_pool=3)
    run(tel, decision, shape, 10, stream="s")
    s = scrape(tel.registry)
    assert series(s, "routescope_telemetry_dropped_total", reason="timing_pool_empty")
    assert sum(series(s, "routescope_telemetry_dropped_total", reason="timing_pool_empty").values()) == 7
    assert sum(series(s, "routescope_calls_total").values()) == 10


def test_graph_capture_counted_never_timed(make_tel):
    tel, decision, shape = probe_and_shape(make_tel, sample_first=100)
    FakeCuda.capturing = True
    run(tel, decision, shape, 5, stream="capture-stream")
    FakeCuda.capturing = False
    assert FakeCuda.recorded == 0
    run(tel, decision, shape, 2, stream="s")
    s = scrape(tel.registry)
    assert sum(series(s, "routescope_graph_captured_calls_total", kernel="intree.ragged_prefill").values()) == 5
    assert sum(series(s, "routescope_calls_total").values()) == 2


def test_cpu_tensors_use_host_time_even_with_a_gpu(make_tel):
    tel, decision, shape = probe_and_shape(make_tel)
    d = tel.instrument(dispatcher())
    for _ in range(3):
        d(*args_for(8), model="glm", num_decodes=0, num_decode_tokens=0, num_prefills=1)
    assert FakeCuda.recorded == 0 and FakeCuda.stream_lookups == 0
    s = scrape(tel.registry)
    assert sum(series(s, "routescope_call_duration_seconds_count").values()) == 3


class FakeGraph:
    """Stands in for torch.cuda.graphs.CUDAGraph: capture_begin/capture_end flip FakeCuda.capturing."""

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        FakeCuda.capturing = True

    def capture_end(self) -> None:
        FakeCuda.capturing = False


class FakeCudaWithGraphs(FakeCuda):
    graphs = type("graphs", (), {"CUDAGraph": FakeGraph})
    asked = 0

    @staticmethod
    def is_current_stream_capturing() -> bool:
        FakeCudaWithGraphs.asked += 1
        return FakeCuda.capturing


class FakeTorchWithGraphs:
    cuda = FakeCudaWithGraphs


def test_capture_seen_through_cudagraph_hook_without_per_call_query(make_tel):
    FakeCuda.capturing, FakeCuda.recorded, FakeCudaWithGraphs.asked = False, 0, 0
    tel = make_tel(TelemetryConfig(models=("glm",), sample_first=2, sample_every=1000), torch_module=FakeTorchWithGraphs)
    tel2 = make_tel(TelemetryConfig(models=("glm",)), torch_module=FakeTorchWithGraphs)  # a second one: hook once
    assert getattr(FakeGraph, "_routescope_capture_depth") == [0]
    from dispatcher.validate import validate

    shape = validate(*args_for(8))
    decision = dispatcher().decide(shape, Batch(CallClass.PREFILL))
    run(tel, decision, shape, 50, stream="s")
    assert FakeCudaWithGraphs.asked == 2, "torch is asked about capture on sampled calls only"
    g = FakeGraph()
    g.capture_begin()
    run(tel, decision, shape, 4, stream="capture-stream")
    g.capture_end()
    recorded = FakeCuda.recorded
    assert recorded == 2 * 2, "no event recorded during capture"
    s = scrape(tel.registry)
    assert sum(series(s, "routescope_graph_captured_calls_total").values()) == 4
    assert sum(series(s, "routescope_calls_total").values()) == 50
    assert tel2.timing == "gpu_events"
