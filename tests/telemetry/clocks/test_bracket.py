"""The bracket clock, driven on CPU: graph replays of kernels that write no stamps, timed by stamp kernels captured
around the call, their constant calibrated once per device by empty brackets, on CUDA and on ROCm.

CUDA, ROCm and the stamp kernel are stand-ins here (tests/telemetry/cuda_double.py: ``FakeTorch``, ``RocmTorch``,
``FakeStampKernel``, ``FakeKernel``): a graph node takes 5 µs of the double's clock, a ``FakeKernel`` its own time on
top, so a bracket around a kernel of k µs spans k + 10 µs and reads k + 5 once the empty bracket's 5 µs is off. What
the real kernel assembles to is checked by compiling it for sm_90, gfx942 and gfx950 (the vendors'
assemblers run here without a GPU); the proof on a GPU is tests/telemetry/test_gpu_graph_clock.py (marked gpu).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from dispatcher.types import Batch, CallClass
from dispatcher.validate import validate
from telemetry import TelemetryConfig
from telemetry.clocks.bracket import (AMDGCN_MEMREALTIME, CALIBRATION_BRACKETS, GLOBALTIMER, MEMREALTIME, NO_WAIT,
                                      NS_PER_TICK, PTX_GLOBALTIMER, WAIT_AFTER, WAIT_BEFORE, clock_for)

from ..conftest import L, args_for, dispatcher, scrape, series, total
from ..cuda_double import CudaQ, FakeCuda, FakeEvent, FakeGraph, FakeKernel, FakeStampKernel, FakeStream, FakeTorch
from ..cuda_double import RocmTorch, reset

PREFILL = Batch(CallClass.PREFILL, 0)
NODE_US = 5  # what the double's graph gives each node


@pytest.fixture(autouse=True)
def _fresh_double():
    reset()
    FakeEvent.clock = 0.0
    yield
    reset()


def bracketed(make_tel, stamps: FakeStampKernel, torch_module: Any = FakeTorch, **cfg: Any):
    cfg = {"models": ("glm",), "sample_every": 4, "keep_samples": True, "timing_gate": False, **cfg}
    tel = make_tel(TelemetryConfig(**cfg), torch_module=torch_module, stamp_launcher=stamps.launcher,
                   bracket_host_ns=stamps.host_ns)
    shape = validate(*args_for(8))
    return tel, dispatcher().decide(shape, PREFILL), shape


def capture(tel, decision, shape, calls: int = 1, kernel_us: float = 20.0, stream: Any = None) -> FakeGraph:
    """A graph of ``calls`` calls of one slot, each launching one kernel of ``kernel_us`` between start and stop."""
    g = FakeGraph()
    g.capture_begin()
    for _ in range(calls):
        token = tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), stream)
        FakeKernel(kernel_us)
        tel.probe.stop(token, "triton")
    g.capture_end()
    return g


def readings(tel) -> list[int]:
    """The bracket samples since the last drain (a drain flushes first)."""
    return [round(s["seconds"] * 1e9) for s in tel.drain_samples() if s["clock"] == "bracket"]


def kept(tel) -> list:
    """The samples the flushes so far kept, without another flush."""
    return [s for s in tel._kept if s[1].value == "bracket"]


def durations(tel) -> dict:
    counts = series(scrape(tel.registry), "routescope_call_duration_seconds_count")
    return {dict(k)["clock"]: v for k, v in counts.items()}


def test_the_kernel_is_warmed_before_the_capture_and_the_flush_calibrates_the_device(make_tel):
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps)
    g = capture(tel, decision, shape)
    warm = stamps.launches[:2]
    assert all(w[0] == "cuda:0" and w[1] == GLOBALTIMER and not w[4] for w in warm), "launched on a side stream"
    assert [w[2] & 1 for w in warm] == [0, 1], "both stamps' kernels (an even offset, an odd) before the capture"
    in_graph = [launch for launch in stamps.launches if launch[4]]
    assert len(in_graph) == 2, "the call's bracket: two stamps captured into its graph"
    g.replay()
    tel.flush()  # starts the calibration: a graph of empty brackets of its own, replayed
    assert tel.bracket_constants == {} and kept(tel) == [], "no constant yet: no reading"
    calibration = [launch for launch in stamps.launches[4:] if launch[4]]
    assert len(calibration) == 2 * CALIBRATION_BRACKETS
    assert all(launch[3] != 0 and launch[3] == calibration[0][3] for launch in calibration), "all on one side stream"
    g.replay()
    assert readings(tel) == [25_000], "the flush reads the calibration, then the bracket, less the constant"
    assert tel.bracket_constants == {"cuda:0": NODE_US * 1000}, "an empty bracket spans one node step"
    gauge = series(scrape(tel.registry), "routescope_clock_constant_seconds")
    assert gauge == {L(clock="bracket", device="cuda:0", rank="0"): pytest.approx(5e-6)}


def test_each_flush_reads_the_latest_finished_replay_once(make_tel):
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps)
    g = capture(tel, decision, shape, kernel_us=30.0)
    tel.flush()
    tel.flush()  # calibrated
    assert readings(tel) == [], "not replayed yet"
    for _ in range(3):
        g.replay()
    tel.flush()
    tel.flush()
    assert readings(tel) == [35_000], "three replays between two flushes: the latest, once"
    table = next(iter(tel._brackets._tables.values()))
    index = next(iter(tel._brackets._held.values()))[1]
    g.replay()
    table.host[index, 1] = table.host[index, 0] - 1  # a replay in flight: its start written, its end not yet
    tel.flush()
    assert kept(tel) == [], "an end older than its start is not read"
    g.replay()
    assert readings(tel) == [35_000]
    assert durations(tel) == {"bracket": 2}


def test_one_captured_call_in_sample_every_of_a_slot_is_bracketed(make_tel):
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps, sample_every=4)
    g = capture(tel, decision, shape, calls=8)
    assert sum(launch[4] for launch in stamps.launches) == 2 * 2, "the first and the fifth captured calls"
    tel.flush()
    for _ in range(3):
        g.replay()
        tel.flush()
    s = scrape(tel.registry)
    assert total(s, "routescope_graph_replayed_calls_total") == 24
    assert total(s, "routescope_graph_untimed_replayed_calls_total") == 6 * 3, "six captured calls hold no bracket"
    assert durations(tel) == {"bracket": 3 * 2}, "the three flushes after the calibration began: two brackets each"
    assert len(tel._brackets._held) == 2
    g.reset()
    assert not tel._brackets._held, "the graph's brackets go back to the pool with it"


def test_a_stamp_launch_that_raises_in_a_capture_leaves_the_call_untimed_and_the_capture_whole(make_tel):
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps)
    FakeCuda.name = "stand-in GPU"
    g = FakeGraph()
    g.capture_begin()  # the warm launch succeeds
    stamps.fail = True
    token = tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), None)
    tel.probe.stop(token, "triton")
    g.capture_end()
    assert g.state == "captured"
    stamps.fail = False
    g.replay()
    tel.flush()
    tel.flush()
    s = scrape(tel.registry)
    assert total(s, "routescope_graph_untimed_replayed_calls_total") == 1
    assert series(s, "routescope_telemetry_errors_total")[L(stage="timing", rank="0")] == 1
    free = len(next(iter(tel._brackets._tables.values())).free)
    assert free == tel.config.graph_timing_pool, "the claimed entry went back at once"


def test_a_second_stamp_that_raises_keeps_its_entry_until_the_graph_goes(make_tel):
    """The first stamp is a node of the graph: its entry may be reused only when the graph is gone."""
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps)
    g = FakeGraph()
    g.capture_begin()
    token = tel.probe.start(decision, shape, PREFILL, "glm", CudaQ(), None)
    stamps.fail = True
    tel.probe.stop(token, "triton")
    stamps.fail = False
    g.capture_end()
    table = next(iter(tel._brackets._tables.values()))
    assert len(table.free) == tel.config.graph_timing_pool - 1 and not tel._brackets._held
    g.reset()
    assert len(table.free) == tel.config.graph_timing_pool


def test_a_device_where_the_bracket_cannot_be_built_falls_back_to_event_pairs_on_cuda(make_tel, caplog):
    def broken(torch_module, device, clock):
        raise RuntimeError("no Triton backend for this device")

    tel = make_tel(TelemetryConfig(models=("glm",), sample_every=4, timing_gate=False), torch_module=FakeTorch,
                   stamp_launcher=broken)
    shape = validate(*args_for(8))
    g = capture(tel, dispatcher().decide(shape, PREFILL), shape)
    assert len(g.nodes) == 2 + 1, "an external pair around the call's kernel"
    g.replay()
    tel.flush()
    assert durations(tel) == {"graph": 1}
    assert sum("no graph stamp bracket" in r.message for r in caplog.records) == 1


def test_a_capture_on_a_device_not_prepared_is_untimed_and_the_flush_builds_its_table(make_tel):
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps)
    q = type("OtherQ", (), {"is_cuda": True, "device": "cuda:1"})()
    g = FakeGraph()
    g.capture_begin()  # prepares the current device (0), not the call's
    tel.probe.stop(tel.probe.start(decision, shape, PREFILL, "glm", q, None), "triton")
    g.capture_end()
    g.replay()
    tel.flush()
    s = scrape(tel.registry)
    assert series(s, "routescope_telemetry_dropped_total")[L(reason="timing_clock_pending", rank="0")] == 1
    assert total(s, "routescope_graph_untimed_replayed_calls_total") == 1
    assert set(tel._brackets._tables) == {"cuda:0", "cuda:1"}, "built outside the capture, for the next ones"


def test_on_rocm_graph_replays_are_timed_by_s_memrealtime_in_10_ns_ticks(make_tel):
    RocmTorch.use()
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps, torch_module=RocmTorch)
    assert tel._graph_events is None, "HIP takes no external events in a capture"
    g = capture(tel, decision, shape, kernel_us=12.34)
    assert {launch[1] for launch in stamps.launches} == {MEMREALTIME}
    tel.flush()
    g.replay()
    tel.flush()
    table = next(iter(tel._brackets._tables.values()))
    index = next(iter(tel._brackets._held.values()))[1]
    start_ticks, end_ticks = (int(v) for v in table.host[index])
    assert end_ticks - start_ticks == (12_340 + 2 * NODE_US * 1000) // 10, "stored in 100 MHz ticks"
    assert readings(tel) == [17_340] and tel.bracket_constants == {"cuda:0": 5_000}, "and read in ns"
    assert total(scrape(tel.registry), "routescope_graph_untimed_replayed_calls_total") == 0


def test_a_closed_telemetry_builds_nothing_before_later_captures(make_tel):
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps)
    tel.close()
    g = FakeGraph()
    g.capture_begin()
    g.capture_end()
    assert stamps.launches == [] and tel._brackets._tables == {}


def test_a_card_whose_realtime_counter_ticks_at_another_rate_is_read_at_its_rate(make_tel, caplog):
    """s_memrealtime's rate is the card's (typically 100 MHz): checked against the host's clock before calibrating."""
    RocmTorch.use()
    stamps = FakeStampKernel(ns_per_tick=40)  # a 25 MHz counter
    tel, decision, shape = bracketed(make_tel, stamps, torch_module=RocmTorch)
    g = capture(tel, decision, shape, kernel_us=12.0)
    tel.flush()
    g.replay()
    assert readings(tel) == [17_000] and tel.bracket_constants == {"cuda:0": 5_000}
    assert next(iter(tel._brackets._tables.values())).ns_per_tick == pytest.approx(40)
    assert sum("ticks every 40.00 ns" in r.message for r in caplog.records) == 1


def test_the_rate_check_waits_for_its_interval_and_for_the_gpu(make_tel):
    """On a GPU the stamps run after the flush that launched them, a second apart: until then nothing is read."""
    from telemetry.clocks.bracket import RATE_ROW, GraphBrackets

    RocmTorch.use()
    stamps = FakeStampKernel()
    now = [0]
    brackets = GraphBrackets(RocmTorch, None, 4, launcher=stamps.launcher, host_ns=lambda: now[0],
                             rate_interval_ns=1_000_000_000)
    brackets.prepare("cuda:0")
    table = brackets._tables["cuda:0"]
    assert not table.rate_checked and brackets.calibrate() == 0 and table.rate_probe[1] is None
    now[0] = 999_999_999
    brackets.calibrate()
    assert table.rate_probe[1] is None, "not a second yet"
    now[0] = 1_000_000_000
    FakeEvent.clock += 1000.0  # the GPU's clock (in ms), a second on
    brackets.calibrate()
    assert table.rate_checked and table.ns_per_tick == 10 and table.calibrating is not None
    assert int(table.host[RATE_ROW, 1]) - int(table.host[RATE_ROW, 0]) == 100_000_000


def test_the_clock_follows_the_torch_build():
    assert clock_for(FakeTorch) == GLOBALTIMER and clock_for(RocmTorch) == MEMREALTIME
    assert NS_PER_TICK == {GLOBALTIMER: 1, MEMREALTIME: 10}


def test_the_event_graph_clock_can_still_be_chosen(make_tel):
    stamps = FakeStampKernel()
    tel, decision, shape = bracketed(make_tel, stamps, graph_clock="events")
    g = capture(tel, decision, shape)
    g.replay()
    tel.flush()
    assert tel._brackets is None and stamps.launches == [] and durations(tel) == {"graph": 1}
    with pytest.raises(ValueError, match="graph_clock"):
        TelemetryConfig(graph_clock="cupti")
    assert TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_GRAPH_CLOCK": "events"}).graph_clock == "events"


def test_the_asm_strings_are_the_ones_the_kernel_holds_and_follow_the_vendors_syntax():
    """PTX ISA: ``mov.u64 d, %globaltimer;`` (a 64-bit special register, ns). AMD CDNA3/CDNA4 ISA: ``s_memrealtime
    SDST[2]`` is an SMEM instruction, so ``s_waitcnt lgkmcnt(0)`` must come before its SGPR pair is read."""
    import inspect

    from telemetry.clocks import bracket

    source = inspect.getsource(bracket.stamp_kernel)
    assert '"mov.u64 $0, %globaltimer;"' in source and PTX_GLOBALTIMER == "mov.u64 $0, %globaltimer;"
    assert '"s_memrealtime $0\\n\\ts_waitcnt lgkmcnt(0)"' in source
    assert re.fullmatch(r"mov\.u64 \$0, %globaltimer;", PTX_GLOBALTIMER)
    first, second = AMDGCN_MEMREALTIME.split("\n")
    assert first == "s_memrealtime $0" and second.strip() == "s_waitcnt lgkmcnt(0)"


@pytest.mark.slow
@pytest.mark.parametrize("backend,arch,warp,clock,wait", [
    ("cuda", 90, 32, GLOBALTIMER, NO_WAIT), ("cuda", 90, 32, GLOBALTIMER, WAIT_BEFORE),
    ("cuda", 90, 32, GLOBALTIMER, WAIT_AFTER), ("hip", "gfx942", 64, MEMREALTIME, NO_WAIT),
    ("hip", "gfx950", 64, MEMREALTIME, NO_WAIT)])
def test_the_stamp_kernel_assembles_for_each_target(backend, arch, warp, clock, wait, monkeypatch):
    """Compiled ahead of time on CPU: ptxas takes the PTX, LLVM's AMDGPU assembler the AMDGCN; the result holds the
    clock read, its wait where AMD needs one, one 64-bit store, and under PDL ``griddepcontrol.wait`` before the
    read (the first stamp) or after the store (the second), in a kernel compiled for a PDL launch."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from telemetry.clocks import bracket
    from telemetry.clocks.bracket import stamp_kernel

    # a compiled kernel, not the interpreter's (tests/dispatcher/kernels sets TRITON_INTERPRET=1 for the whole run on a
    # CPU, and triton.jit reads it when it decorates): a fresh one, the module's kept kernel restored after
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(bracket, "_KERNEL", None)

    src = triton.compiler.ASTSource(fn=stamp_kernel(triton, tl), signature={"times": "*i64", "offset": "i32",
                                                                            "CLOCK": "constexpr", "WAIT": "constexpr"},
                                    constexprs={"CLOCK": clock, "WAIT": wait})
    options = {"num_warps": 1, **({"launch_pdl": True} if wait != NO_WAIT else {})}  # as the launcher compiles it
    compiled = triton.compile(src, target=GPUTarget(backend, arch, warp), options=options)
    if backend == "cuda":
        ptx = compiled.asm["ptx"]
        lines = [line.strip() for line in ptx.splitlines()]
        read = next(i for i, line in enumerate(lines) if re.fullmatch(r"mov\.u64 \t?%rd\d+, %globaltimer;", line))
        store = next(i for i, line in enumerate(lines) if re.search(r"st\.global\.(b|u)64", line))
        waits = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")]
        assert read < store, lines
        assert waits == {NO_WAIT: [], WAIT_BEFORE: [w for w in waits if w < read],
                         WAIT_AFTER: [w for w in waits if w > store]}[wait] and len(waits) == (wait != NO_WAIT), lines
        assert compiled.metadata.launch_pdl == (wait != NO_WAIT) and compiled.metadata.num_warps == 1
        assert "cubin" in compiled.asm, "ptxas assembled it"
    else:
        gcn = compiled.asm["amdgcn"]
        lines = [line.strip() for line in gcn.splitlines()]
        at = next(i for i, line in enumerate(lines) if re.fullmatch(r"s_memrealtime s\[\d+:\d+\]", line))
        assert lines[at + 1] == "s_waitcnt lgkmcnt(0)", lines[at - 2:at + 4]
        assert any(line.startswith("global_store_dwordx2") for line in lines[at:]), "one 64-bit store after it"
        assert "hsaco" in compiled.asm, "the AMDGPU assembler and linker took it"


@pytest.mark.parametrize("capability,clock,pdl", [((9, 0), GLOBALTIMER, True), ((10, 0), GLOBALTIMER, True),
                                                  ((8, 0), GLOBALTIMER, False), ((9, 4), MEMREALTIME, False)])
def test_the_launcher_asks_for_pdl_on_cuda_from_sm_90_and_waits_on_the_right_side(capability, clock, pdl, monkeypatch):
    """The first stamp (even offset) waits before its read, the second (odd) after its store, each its own compiled
    kernel (handle key); a PDL launch only where ``griddepcontrol`` exists: CUDA from sm_90, never HIP (double)."""
    import numpy as np

    from dispatcher.kernels import launcher
    from telemetry.clocks import bracket

    launches = []
    monkeypatch.setattr(launcher, "launch", lambda fn, key, grid, args, consts, stream: launches.append(
        (key, grid, args[1], dict(consts), stream)))

    class Cuda:  # a TEST DOUBLE of torch.cuda: the capability query alone
        @staticmethod
        def get_device_capability(device):
            return capability

    class Torch:  # a TEST DOUBLE of torch: what the launcher reads
        cuda, int64 = Cuda, np.int64

    class Times:
        @staticmethod
        def data_ptr():
            return 4096

    stamp = bracket.triton_stamp_launcher(Torch, "cuda:0", clock)
    stamp(Times, 6, 11)
    stamp(Times, 7, 11)
    (key0, grid0, off0, c0, s0), (key1, grid1, off1, c1, s1) = launches
    assert grid0 == grid1 == (1,) and (off0, off1) == (6, 7) and s0 == s1 == 11 and key0 != key1
    assert c0["num_warps"] == c1["num_warps"] == 1 and c0["CLOCK"] == c1["CLOCK"] == clock
    assert (c0["WAIT"], c1["WAIT"]) == ((WAIT_BEFORE, WAIT_AFTER) if pdl else (NO_WAIT, NO_WAIT))
    assert c0.get("launch_pdl", False) == c1.get("launch_pdl", False) == pdl
