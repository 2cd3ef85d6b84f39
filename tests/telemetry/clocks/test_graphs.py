"""Replay accounting: calls captured in a CUDA graph count at every replay, exactly as eager calls do.

Driven on CPU through tests/telemetry/cuda_double.py's CUDAGraph, which follows torch's life cycle; the
proof on a real graph is tests/telemetry/test_gpu_real.py (marked gpu).
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest

from dispatcher.types import Batch, CallClass
from dispatcher.validate import validate
from telemetry import Telemetry, TelemetryConfig
from telemetry.clocks.graphs import RECORD_ATTR

from ..conftest import L, args_for, dispatcher, scrape, series, total
from ..cuda_double import CudaQ, FakeCuda, FakeGraph, FakeTorch, reset

PURE_DECODE_2 = Batch(CallClass.PURE_DECODE, 2, 2, 2)


def make(make_tel, **cfg: Any) -> Telemetry:
    reset()
    cfg.setdefault("timing_gate", False)  # tests/telemetry/clocks/test_gate.py drives the gate
    cfg.setdefault("graph_clock", "events")  # external pairs here; tests/telemetry/clocks/test_bracket.py: brackets
    return make_tel(TelemetryConfig(models=("glm",), **cfg), torch_module=FakeTorch)


def call(tel: Telemetry, rows: int, batch: Batch, *, model: str = "glm", impl: str = "triton") -> Any:
    shape = validate(*args_for(rows))
    decision = dispatcher().decide(shape, batch)
    token = tel.probe.start(decision, shape, batch, model, CudaQ(), "s")
    tel.probe.stop(token, impl)
    return token


def batch_for(rows: int) -> Batch:
    return PURE_DECODE_2 if rows == 2 else Batch(CallClass.PREFILL, 0, 0, 1)


def captured(tel: Telemetry, rows_list: list[int], *, graph: FakeGraph | None = None) -> FakeGraph:
    g = graph or FakeGraph()
    g.capture_begin()
    for rows in rows_list:
        call(tel, rows, batch_for(rows))
    g.capture_end()
    return g


def counts(tel: Telemetry) -> dict[str, float]:
    s = scrape(tel.registry)
    return {name: total(s, name) for name in (
        "routescope_calls_total", "routescope_rows_total", "routescope_decisions_total",
        "routescope_decode_in_prefill_calls_total", "routescope_decode_in_prefill_rows_total",
        "routescope_would_route_calls_total", "routescope_traffic_calls_total", "routescope_traffic_rows_total",
        "routescope_graph_captured_calls_total", "routescope_graph_replayed_calls_total",
        "routescope_graph_untimed_replayed_calls_total", "routescope_decode_path_calls_total",
        "routescope_decode_path_rows_total")}


def test_every_replay_counts_every_captured_call_exactly(make_tel):
    tel = make(make_tel, graph_timing_pool=0)  # no event pairs for captured calls: nothing can time their replays
    eager = make(make_tel)
    g = captured(tel, [2, 16, 1024])
    assert counts(tel)["routescope_calls_total"] == 0, "capture runs nothing"
    for _ in range(1000):
        g.replay()
    for _ in range(1000):  # the same calls, eagerly, into a second telemetry
        for rows in (2, 16, 1024):
            call(eager, rows, batch_for(rows))
    got, want = counts(tel), counts(eager)
    assert got["routescope_graph_captured_calls_total"] == 3
    assert got["routescope_graph_replayed_calls_total"] == 3000 == got["routescope_calls_total"]
    # No kernel here writes a device stamp: every replayed call is untimed, and says so.
    assert got["routescope_graph_untimed_replayed_calls_total"] == 3000
    assert total(scrape(tel.registry), "routescope_call_duration_seconds_count") == 0
    for name in ("routescope_calls_total", "routescope_rows_total", "routescope_decisions_total",
                 "routescope_decode_in_prefill_calls_total", "routescope_decode_in_prefill_rows_total",
                 "routescope_would_route_calls_total", "routescope_traffic_calls_total",
                 "routescope_traffic_rows_total"):
        assert got[name] == want[name], name
    assert got["routescope_rows_total"] == 1000 * (2 + 16 + 1024)
    snap = tel.snapshot()
    assert {(r["kernel"], r["calls"]) for r in snap["graph_replayed"]} == {
        ("intree.ragged_prefill", 2000), ("aiter.pa_prefill_sparse", 1000)}
    assert sum(r["calls"] for r in snap["counts"]) == 3000


def test_a_graphed_pure_decode_in_prefill_grows_by_one_per_replay(make_tel):
    tel = make(make_tel)
    g = captured(tel, [2])
    dip = L(kernel="intree.ragged_prefill", model="glm", call_class="pure_decode", rank="0")
    for n in range(1, 6):
        g.replay()
        s = scrape(tel.registry)
        assert series(s, "routescope_decode_in_prefill_calls_total") == {dip: n}
        assert series(s, "routescope_decode_in_prefill_rows_total") == {dip: 2 * n}


def test_reset_and_garbage_collection_stop_counting(make_tel):
    tel = make(make_tel)
    g = captured(tel, [2, 16])
    g.replay()
    g.reset()
    assert getattr(g, RECORD_ATTR, None) is None
    captured(tel, [1024], graph=g)  # captured again after the reset: only the new call
    g.replay()
    c = counts(tel)
    assert c["routescope_calls_total"] == 2 + 1 and c["routescope_rows_total"] == 2 + 16 + 1024
    g2 = captured(tel, [16])
    record = getattr(g2, RECORD_ATTR)
    dropped = []
    record._on_drop.append(lambda: dropped.append(True))
    del g2, record
    gc.collect()
    assert dropped == [True], "a collected graph drops its record"


def test_eager_and_replayed_calls_add_up(make_tel):
    tel = make(make_tel)
    g = captured(tel, [16, 16])
    for i in range(100):
        g.replay()
        if i % 4 == 0:
            call(tel, 16, batch_for(16))
    c = counts(tel)
    assert c["routescope_calls_total"] == 200 + 25
    assert c["routescope_graph_replayed_calls_total"] == 200


def test_a_capture_that_fails_records_nothing(make_tel):
    tel = make(make_tel)
    g = FakeGraph(fail_end=True)
    with pytest.raises(RuntimeError):
        captured(tel, [2, 16], graph=g)
    assert getattr(g, RECORD_ATTR, None) is None
    assert counts(tel)["routescope_calls_total"] == 0
    call(tel, 2, batch_for(2))  # and the next eager call counts as eager: no capture left open
    assert counts(tel)["routescope_calls_total"] == 1


def test_a_capture_on_another_thread_leaves_this_threads_calls_eager(make_tel):
    tel = make(make_tel)
    g = FakeGraph()
    begun, done = threading.Event(), threading.Event()

    def other() -> None:
        g.capture_begin()
        begun.set()
        done.wait(10)
        g.capture_end()

    t = threading.Thread(target=other)
    t.start()
    begun.wait(10)
    FakeCuda.capturing = False  # this thread's stream is not capturing
    for _ in range(5):
        call(tel, 16, batch_for(16))
    done.set()
    t.join(10)
    c = counts(tel)
    assert c["routescope_calls_total"] == 5 and c["routescope_graph_captured_calls_total"] == 0
    assert getattr(g, RECORD_ATTR, None) is None


def test_nested_captures_record_into_the_innermost_graph(make_tel):
    tel = make(make_tel)
    outer, inner = FakeGraph(), FakeGraph()
    outer.capture_begin()
    call(tel, 2, batch_for(2))
    inner.capture_begin()
    call(tel, 16, batch_for(16))
    call(tel, 16, batch_for(16))
    inner.capture_end()
    FakeCuda.capturing = True  # still inside the outer capture
    call(tel, 1024, batch_for(1024))
    outer.capture_end()
    inner.replay()
    c = counts(tel)
    assert c["routescope_calls_total"] == 2 and c["routescope_rows_total"] == 32
    outer.replay()
    c = counts(tel)
    assert c["routescope_calls_total"] == 4 and c["routescope_rows_total"] == 32 + 2 + 1024


def test_captured_calls_are_timed_by_stamps_once_per_flush(make_tel):
    """A captured call whose kernels stamp: each flush samples its latest replay (never a replay twice)."""
    tel = make(make_tel, sample_first=1, sample_every=1000)
    shape = validate(*args_for(16))
    decision = dispatcher().decide(shape, batch_for(16))
    first = tel.probe.start(decision, shape, batch_for(16), "glm", CudaQ(), "s")  # makes the stamp table
    first.stamp.armed = True  # this slot's kernels stamp: captured calls of it get stamps too
    tel.probe.stop(first, "triton")
    g = FakeGraph()
    g.capture_begin()
    token = tel.probe.start(decision, shape, batch_for(16), "glm", CudaQ(), "s")
    assert token.stamp is not None
    token.stamp.armed = True  # the launch baked the stamp entry into the graph
    tel.probe.stop(token, "triton")
    g.capture_end()
    host = token.stamp.table.host
    for replay, (start, end) in enumerate([(10_000, 30_000), (50_000, 75_000)]):
        g.replay()
        host[token.stamp.index] = (start, end)  # what the replayed kernels wrote
        tel.flush()
        tel.flush()  # nothing new: no second sample of the same replay
    s = scrape(tel.registry)
    got = series(s, "routescope_call_duration_seconds_count", clock="device")
    assert sum(got.values()) == 2
    assert total(s, "routescope_call_duration_seconds_sum", clock="device") == pytest.approx(20e-6 + 25e-6)
    assert total(s, "routescope_graph_replayed_calls_total") == 2
    assert total(s, "routescope_graph_untimed_replayed_calls_total") == 0, "stamped replays are timed"
    g.reset()
    assert token.stamp.index in tel._stamps.table("cuda:0", create=False).free_graph, "reset frees the entry"


def test_decode_entry_calls_in_a_graph_count_at_every_replay(make_tel):
    """The decode entry's calls feed the decode-in-prefill share: graphed, they must count per replay too."""
    tel, eager = make(make_tel), make(make_tel)
    g = FakeGraph()
    g.capture_begin()
    tel.record_decode_path(4, "glm")
    tel.record_decode_path(4, "glm")
    call(tel, 2, batch_for(2))  # the misrouted decode beside them, in the same graph
    g.capture_end()
    assert counts(tel)["routescope_decode_path_calls_total"] == 0, "capture runs nothing"
    for _ in range(50):
        g.replay()
        eager.record_decode_path(4, "glm")
        eager.record_decode_path(4, "glm")
        call(eager, 2, batch_for(2))
    got, want = counts(tel), counts(eager)
    assert got["routescope_decode_path_calls_total"] == 100 == want["routescope_decode_path_calls_total"]
    assert got["routescope_decode_path_rows_total"] == 400 == want["routescope_decode_path_rows_total"]
    assert got["routescope_decode_in_prefill_calls_total"] == 50 == want["routescope_decode_in_prefill_calls_total"]
    assert tel.snapshot()["decode_path"] == [{"model": "glm", "calls": 100, "rows": 400}]
    g.reset()
    g.capture_begin()
    g.capture_end()
    g.replay()
    assert counts(tel)["routescope_decode_path_calls_total"] == 100, "a reset graph's record is gone"


def test_decode_entry_calls_on_a_thread_not_capturing_count_now(make_tel):
    tel = make(make_tel)
    g = FakeGraph()
    g.capture_begin()
    FakeCuda.capturing = False  # a capture is under way, but this stream is not capturing
    tel.record_decode_path(3, "glm")
    FakeCuda.capturing = True
    g.capture_end()
    g.replay()
    assert counts(tel)["routescope_decode_path_calls_total"] == 1


def test_a_full_graph_stamp_table_drops_the_timing_not_the_counts(make_tel):
    """Every graph entry held: the captured call still counts at each replay, untimed, and the drop is counted."""
    tel = make(make_tel, sample_first=1, sample_every=1000)
    shape = validate(*args_for(16))
    decision = dispatcher().decide(shape, batch_for(16))
    first = tel.probe.start(decision, shape, batch_for(16), "glm", CudaQ(), "s")  # makes the stamp table
    first.stamp.armed = True
    tel.probe.stop(first, "triton")
    tel._stamps.table("cuda:0", create=False).free_graph.clear()  # as if 4,096 captured calls held them
    g = FakeGraph()
    g.capture_begin()
    token = tel.probe.start(decision, shape, batch_for(16), "glm", CudaQ(), "s")
    assert token.stamp is None
    tel.probe.stop(token, "triton")
    g.capture_end()
    for _ in range(3):
        g.replay()
    s = scrape(tel.registry)
    assert total(s, "routescope_telemetry_dropped_total", reason="timing_pool_empty") == 1
    assert total(s, "routescope_graph_replayed_calls_total") == 3
    assert total(s, "routescope_graph_untimed_replayed_calls_total") == 3
