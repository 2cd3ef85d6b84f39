"""CUDA graphs on the plugin's path: vLLM's prefill and decode entries, called while a graph is captured,
count at every replay of it, exactly as the same calls made eagerly.

vLLM here is TEST DOUBLES (tests/vllm_plugin/doubles.py), and the graph is tests/telemetry/cuda_double.py's
stand-in for torch's ``CUDAGraph`` (no CUDA device in CI); the query tensor is a CPU tensor that reports
``is_cuda`` as a device tensor would. The proof on a real graph is the dispatcher's GPU test
(tests/telemetry/test_gpu_real.py); the plugin shares its probe and graph hooks.
"""

from __future__ import annotations

import pytest
import torch

from dispatcher import what_if
from routescope.vllm import plugin
from telemetry import Telemetry, TelemetryConfig
from tests.telemetry.cuda_double import FakeCuda, FakeGraph, FakeStampKernel, FakeTorch, RocmTorch, reset

from .conftest import Meta, prefill_args, samples, telemetry

ON = {"ROUTESCOPE_VLLM": "1"}
MODEL = "double/served-model"


class DeviceLooking(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` as a CUDA tensor does: the probe only asks that, and the device."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)  # the device a capture on the stand-in's current device (0) prepares


def _on_device(args: tuple) -> tuple:
    return (args[0].as_subclass(DeviceLooking),) + args[1:]


@pytest.fixture(params=["cuda", "rocm"])
def graphed(vllm_doubles, request):
    """Doubles loaded, the plugin observing as on gfx942, telemetry given the CUDA stand-in (as CUDA or as ROCm)."""
    d = vllm_doubles()
    ops, backend, fc = d.ops(), d.backend(), d.fc()
    ops._ON_GFX942 = True
    reset()
    torch_module = FakeTorch
    if request.param == "rocm":
        torch_module = RocmTorch
        RocmTorch.use()

    def factory(*, platform, policy, model, rank, **_):
        return Telemetry(TelemetryConfig(models=(model,), rank=rank, timing_gate=False), platform=platform,
                         policy=policy, torch_module=torch_module, stamp_launcher=FakeStampKernel().launcher,
                         bracket_host_ns=FakeStampKernel.host_ns)

    assert plugin.install(env=ON, platform=what_if("gfx942"), telemetry_factory=factory) == "observing"
    yield ops, backend, fc
    reset()


def _decode_step(backend, fc, rows: int = 2) -> None:
    """One decode step as the seed's GLM bug runs it: a pure decode through the prefill entry, and the decode entry."""
    args, _ = prefill_args(rows)
    with fc.set_forward_context({"layer.0": Meta(rows, rows, 0, 0, rows)}):
        backend.forward_prefill(*_on_device(args))
    backend.forward_decode(torch.zeros(rows, 2, 12).as_subclass(DeviceLooking))


def test_calls_captured_through_vllms_entries_count_at_every_replay(graphed):
    ops, backend, fc = graphed
    _decode_step(backend, fc)  # one eager step first (vLLM warms up before it captures)
    g = FakeGraph()
    g.capture_begin()
    _decode_step(backend, fc)
    g.capture_end()
    tel = telemetry()
    tel.flush()
    assert samples(tel, "routescope_calls_total") == 1, "the capture itself runs nothing"
    assert samples(tel, "routescope_graph_captured_calls_total", model=MODEL) == 1
    for _ in range(40):
        g.replay()
    tel.flush()
    assert samples(tel, "routescope_calls_total", kernel="intree.ragged_prefill", call_class="pure_decode") == 41
    assert samples(tel, "routescope_graph_replayed_calls_total", model=MODEL) == 40
    assert samples(tel, "routescope_decode_in_prefill_calls_total", call_class="pure_decode") == 41
    assert samples(tel, "routescope_decode_in_prefill_rows_total", call_class="pure_decode") == 82
    assert samples(tel, "routescope_decode_path_calls_total", model=MODEL) == 41
    assert samples(tel, "routescope_decode_path_rows_total", model=MODEL) == 82
    # vLLM's own kernels write no device stamp: a stamp bracket captured around the call times their replays on
    # CUDA and on ROCm alike (clock bracket: one sample a flush, the latest replay, once the device is calibrated)
    assert samples(tel, "routescope_graph_untimed_replayed_calls_total", model=MODEL) == 0
    assert samples(tel, "routescope_call_duration_seconds_count", clock="bracket") == 1
    assert samples(tel, "routescope_call_duration_seconds_count", clock="graph") == 0
    assert not FakeCuda.capturing and plugin.current().observer.errors.get("prefill", 0) == 0


def test_a_reset_graph_stops_counting_on_the_plugin_path(graphed):
    ops, backend, fc = graphed
    g = FakeGraph()
    g.capture_begin()
    _decode_step(backend, fc)
    g.capture_end()
    g.replay()
    g.reset()
    g.capture_begin()  # captured again without our calls: a graph of other work
    g.capture_end()
    for _ in range(5):
        g.replay()
    tel = telemetry()
    tel.flush()
    assert samples(tel, "routescope_calls_total") == 1
    assert samples(tel, "routescope_decode_path_calls_total") == 1
