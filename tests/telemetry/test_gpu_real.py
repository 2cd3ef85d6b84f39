"""Telemetry on a real CUDA GPU (marker gpu): graph replays counted exactly, and per-call latency within 10% of
CUPTI's kernel time, GPU idle and back to back. The CPU tests of the same logic use tests/telemetry/cuda_double.py."""

from __future__ import annotations

import pytest
import torch

from dispatcher import Dispatcher, Policy, detect
from dispatcher.sweep.grid import Layout
from dispatcher.sweep.inputs import make_sets
from telemetry import Telemetry, TelemetryConfig

pytestmark = pytest.mark.gpu

LAYOUT = Layout(512, 64)


def _call(a, rows: int, *, pure_decode: bool = True):
    meta = ({"num_decodes": rows, "num_decode_tokens": rows, "num_prefills": 0} if pure_decode
            else {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 1})
    return ((a.q, a.kv, a.index.indices, None, a.scale, LAYOUT.head_dim, LAYOUT.nope, LAYOUT.rope, None, a.output),
            {**meta, "model": "glm"})


def _graph(d: Dispatcher, calls: list) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for args, kw in calls:
            d(*args, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args, kw in calls:
            d(*args, **kw)
    return graph


@pytest.fixture
def instrumented():
    platform, policy = detect(), Policy()
    tel = Telemetry(TelemetryConfig(models=("glm",)), platform=platform, policy=policy)
    yield tel, tel.instrument(Dispatcher(platform=platform, policy=policy))
    tel.close()


def test_every_replay_is_counted_exactly(instrumented):
    tel, d = instrumented
    sets = {r: make_sets(r, 2048, 16, LAYOUT, 8192, dtype=torch.bfloat16, device=torch.device("cuda"))[0]
            for r in (2, 16, 1024)}
    calls = [_call(sets[2], 2), _call(sets[16], 16), _call(sets[1024], 1024, pure_decode=False)]
    graph = _graph(d, calls)
    before = tel.flush()
    for _ in range(1000):
        graph.replay()
    torch.cuda.synchronize()
    after = tel.flush()
    grew = lambda field: sum(getattr(after, field).values()) - sum(getattr(before, field).values())  # noqa: E731
    assert grew("calls") == 3000 and grew("replayed") == 3000
    assert grew("rows") == 1000 * (2 + 16 + 1024)
    assert grew("dip_calls") == 2000, "the two pure decodes run on the prefill kernel: one each per replay"
    assert grew("dip_rows") == 1000 * (2 + 16)
    assert grew("decisions") == 3000 and grew("traffic_calls") == 3000 and grew("traffic_rows") == grew("rows")
    assert grew("would_route") == 3000 * len(tel.counterfactuals)
    assert grew("replayed_untimed") == 0, "the project's kernels stamp: their replays are timed"
    assert sum(after.captured.values()) == 3
    for _ in range(10):
        d(*calls[0][0], **calls[0][1])  # eager calls beside the replays
    graph.replay()
    graph.reset()
    x = torch.zeros(8, device="cuda")
    with torch.cuda.graph(graph):  # the same graph object captured again, with work of no dispatcher call
        x.add_(1)
    for _ in range(5):
        graph.replay()  # counts nothing: the reset dropped the record
    graph2 = _graph(d, calls[:1])  # the warm-up call is eager: 1 more
    for _ in range(5):
        graph2.replay()
    torch.cuda.synchronize()
    last = tel.flush()
    assert sum(last.calls.values()) - sum(after.calls.values()) == 10 + 3 + 1 + 5


@pytest.mark.parametrize("rows", [2, 16, 256, 4096])
def test_latency_is_within_ten_percent_of_cupti(rows):
    from telemetry.bench.fidelity import run

    result = run(rows=(rows,), calls=40)
    bad = [p for p in result["points"] if not p.get("within_bound")]
    assert not bad, bad
    assert all(p["clocks"] == ["device"] for p in result["points"])


@pytest.mark.parametrize("rows", [1, 2])
def test_the_shortest_kernels_read_within_ten_percent_of_cupti(rows):
    """Pure decodes rerouted to the decode kernel: one 8.5 µs launch, where the kernel frame is 14% of the time."""
    from telemetry.bench.fidelity import run
    from telemetry.clocks.frame import MEASURED_NS

    result = run(rows=(rows,), calls=40, guard="reroute")
    bad = [p for p in result["points"] if not p.get("within_bound")]
    assert not bad, bad
    assert result["frame_ns_in_use"] == MEASURED_NS.get(torch.cuda.get_device_name(), 0)


@pytest.mark.parametrize("rows", [2, 16, 256, 4096])
def test_kernels_that_write_no_stamps_read_within_ten_percent_of_cupti_when_gated(rows):
    """The project's kernels with their stamps withheld stand in for vLLM's and AITER's: gated pairs within 10%."""
    from telemetry.bench.fidelity import run

    result = run(rows=(rows,), calls=40, stamps=False)
    gated = [p for p in result["points"] if p["variant"] == "gated"]
    assert len(gated) == 2 and all(p["clocks"] == ["gated"] for p in gated), gated
    bad = [p for p in gated if not p.get("within_bound")]
    assert not bad, bad


def test_graph_replays_of_kernels_that_write_no_stamps_are_timed_by_captured_pairs():
    """A captured call whose kernels write no stamp, with the event graph clock asked for (``graph_clock="events"``,
    also where the bracket cannot be built): an external pair in the graph times its replays, within 10% of CUPTI's
    kernel time of a replayed graph of the same call at 256 rows (the bracket clock: test_gpu_graph_clock.py)."""
    from torch.profiler import ProfilerActivity, profile

    from dispatcher.sweep.cupti import spans
    from telemetry.bench.fidelity import unstamped_registry

    platform, policy = detect(), Policy()
    tel = Telemetry(TelemetryConfig(models=("glm",), keep_samples=True, timing_gate=False, graph_clock="events"),
                    platform=platform, policy=policy)
    try:
        d = tel.instrument(Dispatcher(platform=platform, policy=policy, registry=unstamped_registry()))
        a = make_sets(256, 2048, 16, LAYOUT, 8192, dtype=torch.bfloat16, device=torch.device("cuda"))[0]
        graph = _graph(d, [_call(a, 256, pure_decode=False)])
        tel.drain_samples()
        readings = []
        for _ in range(20):
            graph.replay()
            torch.cuda.synchronize()
            readings += [s["seconds"] * 1e6 for s in tel.drain_samples() if s["clock"] == "graph"]
        assert len(readings) == 20, "one reading per flush of a replayed graph"
        after = tel.flush()
        assert sum(after.replayed_untimed.values()) == 0
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                graph.replay()
            torch.cuda.synchronize()
        kernels = sorted((s for s in spans(prof.events()) if s.on_gpu and "Memcpy" not in s.name
                          and "Memset" not in s.name), key=lambda s: s.start_us)
        per = len(kernels) // 20
        assert per >= 1 and len(kernels) == 20 * per, [s.name for s in kernels[:8]]
        replays = sorted(max(s.end_us for s in kernels[i:i + per]) - kernels[i].start_us
                         for i in range(0, len(kernels), per))  # first kernel start to last kernel end, per replay
        ref = replays[len(replays) // 2]
        got = sorted(readings)[len(readings) // 2]
        assert abs(got - ref) / ref <= 0.10, (got, ref)
    finally:
        tel.close()
