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
    """A timing event; an external one (CUDA's ``Event(external=True)``) may be recorded into a capture, and then
    records again at each replay of that graph (and is done once the replay is)."""

    clock = 0.0
    external_refused = False  # HIP's answer: no external events

    def __init__(self, enable_timing: bool = False, **kw: Any) -> None:
        assert enable_timing
        self.external = bool(kw.get("external"))
        if self.external and FakeEvent.external_refused:
            raise RuntimeError("external events are not supported here")
        self.streams: list = []
        self.t: float | None = None
        self.done = False

    def record(self, stream: Any = None) -> None:
        assert stream is not None, "events are recorded on an explicit stream"
        if FakeCuda.capturing:
            assert self.external, "no timing event may be recorded during capture unless it is external"
            FakeCuda.graphs_capturing[-1].nodes.append(self)
            self.streams.append(stream)
            return
        FakeEvent.clock += 0.004  # 4 µs per record, in ms
        self.t = FakeEvent.clock
        self.done = False  # as a real event: recorded again, it is pending until the device reaches it
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
        self.nodes: list[Any] = []  # external events and kernels (FakeStampKernel, FakeKernel) captured, in order

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        assert self.state == "new", "torch captures a graph once (reset first)"
        self.state = "capturing"
        FakeCuda.capturing = True
        FakeCuda.graphs_capturing.append(self)

    def capture_end(self) -> None:
        assert self.state == "capturing"
        FakeCuda.graphs_capturing.remove(self)
        FakeCuda.capturing = bool(FakeCuda.graphs_capturing)
        if self.fail_end:
            self.state = "broken"
            raise RuntimeError("capture invalidated")
        self.state = "captured"

    def replay(self) -> None:
        assert self.state == "captured", f"replay of a graph in state {self.state}"
        self.replays += 1
        for node in self.nodes:  # each replay re-runs the graph's nodes, 5 µs apart; events are done at once
            FakeEvent.clock += 0.005
            if isinstance(node, FakeEvent):
                node.t = FakeEvent.clock
                node.done = True
            else:
                node.run()

    def reset(self) -> None:
        self.state = "new"


class FakeStream:
    """A stream with a raw handle, as ``torch.cuda.Stream`` has (``cuda_stream``)."""

    handles = 0

    def __init__(self, device: Any = None, name: str = "") -> None:
        FakeStream.handles += 1
        self.cuda_stream = 0x1000 + FakeStream.handles
        self.name = name

    def __repr__(self) -> str:
        return f"FakeStream({self.name or self.cuda_stream})"


class FakeWait:
    """Stands in for the stream gate's Triton wait kernel (telemetry.clocks.gate), which needs a GPU.

    ``launch`` is what the gate calls to enqueue the wait: it notes the launch (with how many events had been recorded
    by then, so a test can check the wait comes before the start event) and ``run`` plays the GPU reaching it later: it
    reads the word, as the kernel's last poll would, and writes the result (0 released, 1 the polls ran out)."""

    def __init__(self) -> None:
        self.launches: list[tuple[int, int, int, int]] = []  # (index, ticket, stream handle, events recorded before)
        self._waiting: list[tuple[Any, Any, int, int]] = []

    def launcher(self, torch_mod: Any, device: Any) -> Any:
        return self.launch

    def launch(self, words: Any, results: Any, index: int, ticket: int, max_polls: int, stream: int) -> None:
        self.launches.append((index, ticket, stream, FakeCuda.recorded))
        self._waiting.append((words, results, index, ticket))

    def run(self) -> None:
        for words, results, index, ticket in self._waiting:
            results[index] = 0 if int(words[index]) == ticket else 1
        self._waiting.clear()


class FakeStampKernel:
    """Stands in for the bracket clock's Triton stamp kernel (telemetry.clocks.bracket), which needs a GPU.

    ``launcher`` is what the bracket builds its stamp from, per device and clock: a launch outside a capture stores the
    double's clock at once; inside one it becomes a node of the graph, which stores the clock at each replay. The
    stored value is in the clock's own ticks: ns for ``%globaltimer``, 10 ns for ``s_memrealtime`` (100 MHz)."""

    def __init__(self, ns_per_tick: int | None = None) -> None:
        self.launches: list[tuple[str, int, int, int, bool]] = []  # (device, clock, offset, stream, in a capture)
        self.fail = False  # True: every launch raises (a launch error inside a capture)
        self.ns_per_tick = ns_per_tick  # a card whose clock ticks at another rate than its clock's usual one

    @staticmethod
    def host_ns() -> int:
        """The host's clock for the bracket's tick-rate check: the double's one clock, 1 ms on at each reading."""
        FakeEvent.clock += 0.001
        return round(FakeEvent.clock * 1e6)

    def launcher(self, torch_mod: Any, device: Any, clock: int) -> Any:
        from telemetry.clocks.bracket import NS_PER_TICK

        per_tick = self.ns_per_tick or NS_PER_TICK[clock]

        def launch(times: Any, offset: int, stream: int) -> None:
            if self.fail:
                raise RuntimeError("stamp launch failed")
            self.launches.append((str(device), clock, offset, stream, FakeCuda.capturing))
            node = _StampNode(times, offset, per_tick)
            if FakeCuda.capturing:
                FakeCuda.graphs_capturing[-1].nodes.append(node)
            else:
                node.run()

        return launch


EPOCH_NS = 1_000_000_000  # a GPU's clock is never 0 (a stamp of 0 reads as not written)


class _StampNode:
    def __init__(self, times: Any, offset: int, per_tick: int) -> None:
        self.flat, self.offset, self.per_tick = times.view(-1), offset, per_tick

    def run(self) -> None:
        self.flat[self.offset] = (round(FakeEvent.clock * 1e6) + EPOCH_NS) // self.per_tick  # the clock is in ms


class FakeKernel:
    """A call's kernel in a capture: at each replay it takes ``us`` of the double's clock (beyond a node's 5 µs)."""

    def __init__(self, us: float) -> None:
        self.us = us
        if FakeCuda.capturing:
            FakeCuda.graphs_capturing[-1].nodes.append(self)

    def run(self) -> None:
        FakeEvent.clock += self.us / 1000


class _Context:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


CURRENT_STREAM = FakeStream(name="current")  # what current_stream answers: one stream, with a raw handle


class FakeCuda:
    Event = FakeEvent
    Stream = FakeStream
    capturing = False
    graphs_capturing: list[FakeGraph] = []  # innermost last
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
    def current_device() -> int:
        return 0

    @staticmethod
    def current_stream(device: Any = None) -> FakeStream:
        FakeCuda.stream_lookups += 1
        return CURRENT_STREAM

    @staticmethod
    def device(device: Any = None) -> _Context:
        return _Context()

    @staticmethod
    def stream(stream: Any = None) -> _Context:
        return _Context()

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


class RocmTorch(FakeTorch):
    """The same stand-in as torch built for ROCm presents itself: ``torch.version.hip`` set, an AMD device name, and
    HIP's refusal of external events in a capture. It stands in for an MI300X/MI325X, which CI does not have; nothing
    here runs HIP."""

    version = type("version", (), {"hip": "6.3.42134", "cuda": None})

    @staticmethod
    def use() -> None:
        FakeCuda.name = "AMD Instinct MI300X"
        FakeEvent.external_refused = True


class CudaQ:
    """Stands in for a device tensor: the probe only reads is_cuda and device."""

    is_cuda = True
    device = "cuda:0"


def reset() -> None:
    FakeCuda.capturing, FakeCuda.stream_lookups, FakeCuda.recorded = False, 0, 0
    FakeCuda.graphs_capturing = []
    FakeEvent.external_refused = False
    FakeCuda.name = "stand-in GPU"
