"""A test double of the parts of ``torch.cuda`` telemetry touches, so its GPU branch runs on CPU.

It stands in for what CI cannot run (a CUDA device): events that record on a stream and resolve
by ``query()``, a ``CUDAGraph`` whose ``capture_begin/capture_end/replay/reset`` behave as torch's
do (capture only between begin and end; replay only after a successful end; reset forgets the
capture), and tensor factories that return real CPU tensors (the stamp tables). The GPU tests
(tests/telemetry/test_gpu_real.py, marked ``gpu``) are the proof on real CUDA.
"""

from __future__ import annotations

from typing import Any

import torch


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
        assert not FakeCuda.capturing, "no event is queried while a graph is captured"
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done
        return end.t - self.t  # ms

    def synchronize(self) -> None:
        raise AssertionError("telemetry must never synchronize")


class FakeGraph:
    """torch.cuda.graphs.CUDAGraph's life cycle: capture_begin -> capture_end -> replay* -> reset."""

    def __init__(self, *, fail_end: bool = False) -> None:
        self.state = "new"
        self.fail_end = fail_end
        self.replays = 0

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        assert self.state == "new", "torch captures a graph once (reset first)"
        self.state = "capturing"
        FakeCuda.capturing = True

    def capture_end(self) -> None:
        assert self.state == "capturing"
        FakeCuda.capturing = False
        if self.fail_end:
            self.state = "broken"
            raise RuntimeError("capture invalidated")
        self.state = "captured"

    def replay(self) -> None:
        assert self.state == "captured", f"replay of a graph in state {self.state}"
        self.replays += 1

    def reset(self) -> None:
        self.state = "new"


class FakeCuda:
    Event = FakeEvent
    capturing = False
    stream_lookups = 0
    recorded = 0
    name = "stand-in GPU"  # what get_device_name answers (no measured kernel frame)
    graphs = type("graphs", (), {"CUDAGraph": FakeGraph})

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return FakeCuda.name

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
    """The module telemetry is given instead of torch: cuda is the double, tensors are real CPU ones."""

    cuda = FakeCuda
    int64, int32 = torch.int64, torch.int32

    @staticmethod
    def zeros(*shape: Any, dtype: Any = None, pin_memory: bool = False, device: Any = None) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype)


class CudaQ:
    """Stands in for a device tensor: the probe only reads is_cuda and device."""

    is_cuda = True
    device = "cuda:0"


def reset() -> None:
    FakeCuda.capturing, FakeCuda.stream_lookups, FakeCuda.recorded = False, 0, 0
    FakeCuda.name = "stand-in GPU"
