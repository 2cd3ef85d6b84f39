"""`routescope bench graphs`: what replay accounting costs per ``CUDAGraph.replay()``, and that it counts right.

A decode step captured in a graph: ``calls`` instrumented dispatcher calls (pure decodes of 2
rows through the prefill entry, as vLLM's ROCm backend sends them; 61 attention layers in
DeepSeek-V4, so 64 by default). Host µs per ``replay()`` (thread CPU time: the GPU runs the
graph meanwhile) of that graph against the same graph captured from a bare dispatcher and
replayed through torch's own, unwrapped ``replay`` (so the difference is the whole cost: the
wrapper and the record it adds), interleaved; then the counts after the replays, against the
replays made.
The host-side accounting alone (``ReplayRecord.apply``) is timed too, for one slot and for
``calls`` slots (every call of the graph in a slot of its own); that part runs on CPU as well.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from dispatcher import Dispatcher, Policy, detect
from dispatcher.sweep.grid import Layout
from dispatcher.sweep.inputs import make_sets

from ..config import TelemetryConfig
from ..core import Telemetry
from ..clocks.graphs import ReplayRecord, graph_hooks
from ..slots import SlotCounters


def apply_cost_us(calls: int, slots: int, *, repeats: int = 20000) -> float:
    """Median µs of one ``ReplayRecord.apply`` for ``calls`` captured calls spread over ``slots`` slots."""
    counters = SlotCounters(max(slots, 1))
    per = [(s, calls // slots + (1 if s < calls % slots else 0), 2, 2, 0) for s in range(slots)]
    record = ReplayRecord([(counters, tuple(per))], [])
    runs = []
    for _ in range(7):
        t0 = time.thread_time_ns()
        for _ in range(repeats):
            record.apply()
        runs.append((time.thread_time_ns() - t0) / repeats / 1e3)
    assert counters.calls[0] > 0
    return statistics.median(runs)


def _capture(d: Dispatcher, call: tuple, kw: dict, calls: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        d(*call, **kw)  # warm up on a side stream, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            d(*call, **kw)
    return graph


def _replay_us(graph: torch.cuda.CUDAGraph, replays: int, replay: Any) -> float:
    torch.cuda.synchronize()
    t0 = time.thread_time_ns()
    for _ in range(replays):
        replay(graph)
    spent = (time.thread_time_ns() - t0) / replays / 1e3
    torch.cuda.synchronize()
    return spent


def run(*, calls: int = 64, replays: int = 200, rounds: int = 11, rows: int = 2) -> dict[str, Any]:
    out: dict[str, Any] = {"calls_per_graph": calls, "apply_us": {
        "one_slot": apply_cost_us(calls, 1), f"{calls}_slots": apply_cost_us(calls, calls)}}
    if not torch.cuda.is_available():
        out["device"] = "cpu (no CUDA graphs here: the host-side accounting alone)"
        return out
    out["device"] = torch.cuda.get_device_name()
    platform, policy = detect(), Policy()
    tel = Telemetry(TelemetryConfig(models=("glm",)), platform=platform, policy=policy)
    hooks = graph_hooks(torch)
    assert hooks is not None, "torch.cuda.graphs.CUDAGraph is missing"
    wrapped, unwrapped = torch.cuda.CUDAGraph.replay, hooks.unwrapped_replay
    watched = tel.instrument(Dispatcher(platform=platform, policy=policy))
    bare = Dispatcher(platform=platform, policy=policy)
    layout = Layout(512, 64)
    a = make_sets(rows, 2048, 16, layout, 8192, dtype=torch.bfloat16, device=torch.device("cuda"))[0]
    call = (a.q, a.kv, a.index.indices, None, a.scale, layout.head_dim, layout.nope, layout.rope, None, a.output)
    kw = {"num_decodes": rows, "num_decode_tokens": rows, "num_prefills": 0, "model": "glm"}
    try:
        g_watched = _capture(watched, call, kw, calls)
        g_bare = _capture(bare, call, kw, calls)
        before = tel.flush()
        eager = sum(before.calls.values())
        with_record, without = [], []
        for i in range(rounds):
            for graph, replay, into in ((g_watched, wrapped, with_record),
                                        (g_bare, unwrapped, without))[:: 1 if i % 2 else -1]:
                into.append(_replay_us(graph, replays, replay))
        totals = tel.flush()
        made = rounds * replays
        out.update({
            "replay_us_with_record": statistics.median(with_record),
            "replay_us_without": statistics.median(without),
            "added_us_per_replay": statistics.median(w - b for w, b in zip(with_record, without)),
            "replays": made,
            "calls_counted_from_replays": sum(totals.replayed.values()),
            "calls_expected_from_replays": made * calls,
            "calls_total": sum(totals.calls.values()) - eager,
            "captured": sum(totals.captured.values()),
            "decode_in_prefill_calls": sum(totals.dip_calls.values()) - sum(before.dip_calls.values()),
        })
        out["exact"] = out["calls_counted_from_replays"] == out["calls_expected_from_replays"] == out["calls_total"]
    finally:
        tel.close()
    return out


def render(result: dict[str, Any]) -> None:
    """The result as a table: what a replay costs, then whether the counts came out exact."""
    from rich.console import Console
    from rich.table import Table

    calls = result["calls_per_graph"]
    table = Table(title=f"replay accounting, {result['device']}, a graph of {calls} calls")
    table.add_column("what")
    table.add_column("value", justify="right")
    for slots, us in result["apply_us"].items():
        table.add_row(f"ReplayRecord.apply, {slots.replace('_', ' ')} (µs)", f"{us:.2f}")
    if "replay_us_with_record" in result:
        table.add_row("replay() with the record / torch's own (µs)",
                      f"{result['replay_us_with_record']:.2f} / {result['replay_us_without']:.2f}")
        table.add_row("added per replay (µs)", f"{result['added_us_per_replay']:.2f}")
        table.add_row("calls counted from replays / expected",
                      f"{result['calls_counted_from_replays']:,} / {result['calls_expected_from_replays']:,}")
        table.add_row("decode-in-prefill calls counted", f"{result['decode_in_prefill_calls']:,}")
        table.add_row("exact", "yes" if result["exact"] else "[red]NO[/red]")
    Console(width=120).print(table)
