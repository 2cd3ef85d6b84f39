"""The stream gate and the event clocks for kernels that write no stamps, driven on CPU.

CUDA and ROCm are stand-ins here (tests/telemetry/cuda_double.py: ``FakeTorch``, ``RocmTorch``) and so is the gate's
wait kernel (``FakeWait``); the wait kernel's own logic runs for real in Triton's interpreter below. The proof on a
GPU is tests/telemetry/test_gpu_real.py (marked gpu).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dispatcher.types import Batch, CallClass
from dispatcher.validate import validate
from telemetry import TelemetryConfig
from telemetry.clocks.gate import PENDING, GateFactory

from ..conftest import L, args_for, dispatcher, scrape, series, total
from ..cuda_double import CudaQ, FakeCuda, FakeEvent, FakeGraph, FakeStream, FakeTorch, FakeWait, RocmTorch, reset

PREFILL = Batch(CallClass.PREFILL)
SERIES = dict(kernel="intree.ragged_prefill", rows_bucket="8-15", model="glm", rank="0")


def gated_telemetry(make_tel, wait: FakeWait, torch_module: Any = FakeTorch, **cfg: Any):
    cfg = {"models": ("glm",), "sample_first": 2, "sample_every": 1000, **cfg}
    tel = make_tel(TelemetryConfig(**cfg), torch_module=torch_module, gate_launcher=wait.launcher)
    shape = validate(*args_for(8))
    return tel, dispatcher().decide(shape, PREFILL), shape


def with_gate(make_tel, wait: FakeWait, **cfg: Any):
    """Telemetry whose device gate is built: one sampled call (untimed: it asks for the gate), then the flush that
    builds the gate."""
    tel, decision, shape = gated_telemetry(make_tel, wait, **cfg)
    stream = FakeStream(name="s")
    one_call(tel, decision, shape, stream)
    tel.flush()
    return tel, decision, shape, stream


def one_call(tel, decision, shape, stream, *, impl: str = "triton", raises: bool = False) -> Any:
    token = tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), stream)
    if raises:
        tel.probe.error(token, RuntimeError("launch failed"), impl)
    else:
        tel.probe.stop(token, impl)
    return token


def finish_gpu_work(tel, wait: FakeWait) -> None:
    """What the GPU does later: the waits read their words, the events complete."""
    wait.run()
    for pair in list(tel._events.free) + [p for _, p, _ in tel._events.pending]:
        pair[0].done = pair[1].done = True


def durations(tel) -> dict:
    return {dict(k)["clock"]: v for k, v in series(scrape(tel.registry), "routescope_call_duration_seconds_count").items()}


@pytest.fixture(autouse=True)
def _fresh_double():
    reset()
    yield
    reset()


def test_the_first_sampled_call_asks_for_a_gate_and_the_flush_builds_it(make_tel):
    """Before the gate is built a sampled call is not timed at all: a plain pair would start the series on a clock
    (events) it leaves once the gate is there."""
    wait = FakeWait()
    tel, decision, shape = gated_telemetry(make_tel, wait)
    stream = FakeStream(name="s")
    recorded = FakeCuda.recorded
    one_call(tel, decision, shape, stream)  # no gate yet: no pair at all, and the device is queued
    assert wait.launches == [] and FakeCuda.recorded == recorded and not tel._events.pending
    tel.flush()  # builds the gate and warms it (one launch on a side stream, released at once)
    assert len(wait.launches) == 1 and wait.launches[0][2] != stream.cuda_stream
    finish_gpu_work(tel, wait)
    tel.flush()
    assert durations(tel) == {}
    assert series(scrape(tel.registry), "routescope_telemetry_dropped_total")[
        L(reason="timing_clock_pending", rank="0")] == 1
    one_call(tel, decision, shape, stream)
    finish_gpu_work(tel, wait)
    tel.flush()
    assert durations(tel) == {"gated": 1}, "the series' first sample is on the clock it keeps"


def test_a_gated_call_waits_before_its_start_event_and_is_released_after_its_end_event(make_tel):
    wait = FakeWait()
    tel, decision, shape, stream = with_gate(make_tel, wait)
    gate = tel._events.gates.get("cuda:0")
    recorded = FakeCuda.recorded
    token = tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), stream)
    index, ticket, on_stream, recorded_before = wait.launches[-1]
    assert on_stream == stream.cuda_stream, "the wait goes on the call's own stream"
    assert recorded_before == recorded, "the wait is enqueued before the start event"
    assert FakeCuda.recorded == recorded + 1
    assert int(gate.words_host[index]) != ticket, "closed until the launch returns"
    tel.probe.stop(token, "triton")
    assert FakeCuda.recorded == recorded + 2 and int(gate.words_host[index]) == ticket, "opened after the end event"
    finish_gpu_work(tel, wait)
    tel.flush()
    assert durations(tel) == {"gated": 1}
    assert len(tel._events.free) == tel.config.timing_pool and not any(tel._events.gated)


def test_a_gated_reading_loses_the_gpu_models_constant(make_tel):
    wait = FakeWait()
    tel, decision, shape, stream = with_gate(make_tel, wait, gated_frame_ns=1_500, keep_samples=True)
    FakeEvent.clock = 0.0
    one_call(tel, decision, shape, stream)  # the double's records are 4 µs apart
    finish_gpu_work(tel, wait)
    tel.flush()
    gated = [round(s["seconds"] * 1e9) for s in tel.drain_samples() if s["clock"] == "gated"]
    assert gated == [4_000 - 1_500]


def test_a_wait_that_ran_out_drops_its_sample_and_says_so(make_tel):
    """The launch synchronised or took longer than the wait's polls: the pair holds host time, so no sample."""
    wait = FakeWait()
    tel, decision, shape, stream = with_gate(make_tel, wait)
    token = tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), stream)
    wait.run()  # the GPU reaches the wait's last poll before the host opens the gate
    tel.probe.stop(token, "triton")
    finish_gpu_work(tel, wait)
    tel.flush()
    s = scrape(tel.registry)
    assert durations(tel) == {}
    assert series(s, "routescope_telemetry_dropped_total")[L(reason="timing_gate_timeout", rank="0")] == 1


def test_a_launch_that_raises_opens_its_gate(make_tel):
    """A closed gate left behind would hold the stream until its polls run out: the error path opens it."""
    wait = FakeWait()
    tel, decision, shape, stream = with_gate(make_tel, wait)
    gate = tel._events.gates.get("cuda:0")
    one_call(tel, decision, shape, stream, raises=True)
    index, ticket, _, _ = wait.launches[-1]
    assert int(gate.words_host[index]) == ticket
    assert not any(tel._events.gated) and len(tel._events.free) == tel.config.timing_pool


def test_kernels_that_stamp_are_never_gated_once_known(make_tel):
    wait = FakeWait()
    tel, decision, shape = gated_telemetry(make_tel, wait, sample_first=4)
    stream = FakeStream()
    other = validate(*args_for(16))  # another slot's call builds the gate: the slot below is still unlearnt
    one_call(tel, dispatcher().decide(other, PREFILL), other, stream)
    tel.flush()
    token = tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), stream)  # tries a stamp and a gated pair
    index, ticket, _, _ = wait.launches[-1]
    token.stamp.armed = True
    token.stamp.table.host[token.stamp.index] = (1_000, 41_000)
    tel.probe.stop(token, "triton")
    gate = tel._events.gates.get("cuda:0")
    assert int(gate.words_host[index]) == ticket, "the unused pair's gate opens"
    launches = len(wait.launches)
    one_call(tel, decision, shape, stream)
    assert len(wait.launches) == launches, "the slot is known to stamp: no gate, no pair"


def test_a_device_whose_gate_cannot_be_built_keeps_plain_pairs(make_tel, caplog):
    def broken(torch_module, device):
        raise RuntimeError("no Triton backend for this device")

    tel = make_tel(TelemetryConfig(models=("glm",), sample_first=4, sample_every=1000), torch_module=FakeTorch,
                   gate_launcher=broken)
    shape = validate(*args_for(8))
    decision = dispatcher().decide(shape, PREFILL)
    for _ in range(2):
        one_call(tel, decision, shape, FakeStream())  # the first asks for the gate (untimed), the flush fails it
        tel.flush()
    one_call(tel, decision, shape, FakeStream())
    for pair in [p for _, p, _ in tel._events.pending]:
        pair[0].done = pair[1].done = True
    tel.flush()
    assert durations(tel) == {"events": 2}, "plain pairs from the verdict on: the series' one clock"
    assert sum("no stream gate" in r.message for r in caplog.records) == 1, "said once, not per call"


def test_the_gate_can_be_switched_off(make_tel):
    wait = FakeWait()
    tel, decision, shape = gated_telemetry(make_tel, wait, timing_gate=False)
    for _ in range(2):
        one_call(tel, decision, shape, FakeStream())
        tel.flush()
    assert wait.launches == [] and tel._events.gates is None


def test_tickets_are_per_word_so_two_calls_in_flight_never_release_each_other(make_tel):
    wait = FakeWait()
    gates = GateFactory(FakeTorch, 4, launcher=wait.launcher)
    gates.get("cuda:0")
    gates.prepare()
    gate = gates.get("cuda:0")
    gate.close(1, 7)
    gate.close(2, 7)
    gate.open(2)
    wait.run()
    assert [gate.outcome(i) for i in (1, 2)] == [1, 0]
    gate.close(3, 7)
    assert gate.outcome(3) == PENDING


def captured_call(tel, decision, shape, stream) -> None:
    tel.probe.stop(tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), stream), "triton")


def test_graph_replays_of_unstamped_calls_are_timed_by_pairs_recorded_into_the_graph(make_tel):
    tel = make_tel(TelemetryConfig(models=("glm",), sample_every=4, keep_samples=True, timing_gate=False,
                                   graph_clock="events"), torch_module=FakeTorch)
    shape = validate(*args_for(8))
    decision = dispatcher().decide(shape, PREFILL)
    g = FakeGraph()
    g.capture_begin()
    for _ in range(8):
        captured_call(tel, decision, shape, FakeStream())
    g.capture_end()
    assert len(g.nodes) == 2 * 2, "one captured call in sample_every (the first included) holds a pair"
    tel.flush()
    assert durations(tel) == {}, "not replayed yet: nothing to read"
    for _ in range(3):
        g.replay()
    tel.flush()
    tel.flush()
    s = scrape(tel.registry)
    assert durations(tel) == {"graph": 2}, "the latest replay, once per flush, per held pair"
    assert total(s, "routescope_graph_untimed_replayed_calls_total") == 6 * 3, "the six captured calls without a pair"
    assert total(s, "routescope_graph_replayed_calls_total") == 24
    g.replay()
    tel.flush()
    assert durations(tel) == {"graph": 4}
    held = len(tel._graph_events.held)
    g.reset()
    assert held == 2 and not tel._graph_events.held and len(tel._graph_events.free) == 2


def test_on_rocm_the_gate_keeps_its_form_and_external_graph_pairs_are_refused(make_tel):
    """HIP refuses external events in a capture: with the event graph clock asked for, no pair is recorded into a
    graph there and replays say untimed (the bracket clock times them: tests/telemetry/clocks/test_bracket.py)."""
    RocmTorch.use()
    wait = FakeWait()
    tel, decision, shape = gated_telemetry(make_tel, wait, torch_module=RocmTorch, graph_clock="events")
    assert tel._graph_events is None
    stream = FakeStream()
    one_call(tel, decision, shape, stream)
    tel.flush()
    one_call(tel, decision, shape, stream)
    assert len(wait.launches) == 2, "the same Triton wait gates a HIP stream"
    finish_gpu_work(tel, wait)
    tel.flush()
    g = FakeGraph()
    g.capture_begin()
    captured_call(tel, decision, shape, stream)
    g.capture_end()
    g.replay()
    tel.flush()
    s = scrape(tel.registry)
    assert durations(tel) == {"gated": 1}, "an MI300X has no measured constant: the bare reading"
    assert total(s, "routescope_graph_untimed_replayed_calls_total") == 1


@pytest.mark.parametrize("name,value", [("gate_max_polls", 0), ("gated_frame_ns", -2), ("graph_frame_ns", 10**6),
                                        ("graph_timing_pool", -1)])
def test_bad_gate_settings_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        TelemetryConfig(**{name: value})


def test_the_gate_settings_come_from_the_environment():
    cfg = TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_TIMING_GATE": "0", "ROUTESCOPE_TELEMETRY_GATE_MAX_POLLS": "64",
                                    "ROUTESCOPE_TELEMETRY_GATED_FRAME_NS": "2400"})
    assert (cfg.timing_gate, cfg.gate_max_polls, cfg.gated_frame_ns) == (False, 64, 2400)


ROOT = Path(__file__).resolve().parents[3]  # the repository root
WAIT_KERNEL = textwrap.dedent("""
    import torch, triton
    import triton.language as tl
    from telemetry.clocks.gate import _wait_kernel
    kernel = _wait_kernel(triton, tl)
    words = torch.zeros(4, dtype=torch.int32)
    results = torch.full((4,), -1, dtype=torch.int32)
    words[1] = 9
    kernel[(1,)](words, results, 1, 9, 5)    # released before the wait: passes at once
    kernel[(1,)](words, results, 2, 9, 5)    # never released: gives up after 5 polls
    kernel[(1,)](words, results, 3, 1, 5)    # a ticket of 1 is not folded into the kernel as a constant
    print(results.tolist())
""")


@pytest.mark.slow
def test_the_wait_kernel_passes_a_released_word_and_gives_up_on_a_closed_one():
    """The real Triton kernel, in Triton's interpreter (CPU): the bounded poll and the result it writes."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", WAIT_KERNEL], capture_output=True, text=True, env=env, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[-1, 0, 1, 1]"


def test_the_production_clocks_hold_no_profiler_subscriber():
    """CUPTI (and rocprofiler/roctracer under torch.profiler) allows one activity subscriber per process: the clocks
    telemetry runs in production use events and a kernel of their own, so a user's torch.profiler or Nsight always
    wins. Only the benchmarks (telemetry/bench) use CUPTI, as a reference."""
    import re
    from pathlib import Path

    import telemetry

    root = Path(telemetry.__file__).parent
    uses = re.compile(r"^\s*(?:import|from)\s+\S*(?:profiler|cupti|kineto|roctracer|rocprofiler)|torch\.profiler\.",
                      re.M | re.I)
    offenders = sorted(f"{path.relative_to(root)}: {m.group(0).strip()}" for path in root.rglob("*.py")
                       if "bench" not in path.parts for m in uses.finditer(path.read_text()))
    assert not offenders, offenders
    assert uses.search("from torch.profiler import profile") and uses.search("    import cupti")
