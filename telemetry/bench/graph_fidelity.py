"""`routescope bench fidelity --no-stamps --graphs`: the graph clocks against CUPTI's span of the same replayed calls.

The project's kernels with their stamps withheld stand in for vLLM's and AITER's, which write none. Each case (a
rows count on the split-K decode or on the prefill kernel) is captured into CUDA graphs of 1 and of 8 calls back to
back, through an instrumented ``Dispatcher`` with every captured call timed (``sample_every=1``), once per graph
clock in the same run: ``graph`` (an external event pair recorded into the graph, the older clock) and ``bracket``
(two stamp kernels captured around the call, ``telemetry.clocks.bracket``). Two regimes: ``synced`` (replay, sync,
flush; ``replays`` times) and ``back_to_back`` (``replays`` bursts of ``BURST`` replays queued without a sync, then a
sync and a flush: it reads each bracket's latest replay, the burst's last, which ran queued right behind the others).
A flush made while a replay is between a bracket's two stamps reads nothing for it (its end is older than its start),
so a graph kept busy without a pause, whose bracket spans most of it, is read rarely: hence the sync.

Telemetry's readings come from replays with no profiler attached. The reference is CUPTI's span of each call (first
kernel start to last kernel end, the stamp kernels left out) over replays of the same graph driven the same way, CUDA
activity only: no CPU tracing, which would slow the host between replays. Calls are told apart by position: every
replay runs the same kernels in the same order.

Also per case and graph: the host µs per ``replay()`` and the GPU µs per replay (replays queued behind a sleep
kernel, so the GPU never waits for the host) of each clock's graph against a bare graph of the same calls captured
without telemetry, in ``COST_ROUNDS`` interleaved rounds: the median difference over the graph's calls is each
bracket's (or pair's) cost inside a replay, printed with its range over the rounds and an A/A control (a second
bare capture against the first, in the same rounds).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from dispatcher import Dispatcher, Policy, detect
from dispatcher.sweep.cupti import spans
from dispatcher.sweep.grid import Layout
from dispatcher.sweep.inputs import make_sets
from dispatcher.types import GuardMode

from ..config import TelemetryConfig
from ..core import Telemetry
from .fidelity import BOUND_PCT, _call_args, _quantile, unstamped_registry

CASES = (("split-K", "reroute", 2), ("split-K", "reroute", 16), ("prefill kernel", "observe", 2),
         ("prefill kernel", "observe", 16), ("prefill kernel", "observe", 256), ("prefill kernel", "observe", 4096))
GRAPH_CALLS = (1, 8)
REGIMES = ("synced", "back_to_back")
CLOCKS = ("graph", "bracket")  # the graph_clock setting of each: events, bracket
STAMP_KERNEL = "graph_stamp"  # the bracket's kernel: telemetry's, not the call's
BURST = 8  # replays queued back to back between two flushes
SLEEP_CYCLES = 40_000_000  # ~20 ms on an H200: every timed replay is queued before the GPU reaches the first
COST_ROUNDS = 7
COST_GPU_US = 100_000.0  # GPU time a cost measurement queues (replays of the bare graph), 10 to 100 replays
COST_GOAL_US = 2.0  # the aim for a bracket's GPU time inside a replay


def drive(graph: Any, regime: str, replays: int, tel: Telemetry | None = None) -> int:
    """Replay ``graph`` ``replays`` times in ``regime`` (a flush where telemetry reads); returns the replays made."""
    if regime == "synced":
        for _ in range(replays):
            graph.replay()
            torch.cuda.synchronize()
            if tel is not None:
                tel.flush()
        return replays
    bursts = replays
    for _ in range(bursts):
        for _ in range(BURST):
            graph.replay()
        torch.cuda.synchronize()  # the bench's wait: a flush while a replay is between a bracket's stamps reads none
        if tel is not None:
            tel.flush()
    if tel is not None:
        tel.flush()
    return bursts * BURST


def cupti_call_us(graph: Any, regime: str, replays: int, calls: int, tel: Telemetry | None = None) -> list[float]:
    """CUPTI's span of every call of every replay (µs): its own kernels, first start to last end; driven as
    telemetry's readings were (``tel`` flushes between replays alike, its samples unused)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        made = drive(graph, regime, replays, tel)
    kernels = sorted((s for s in spans(prof.events()) if s.on_gpu and "Memcpy" not in s.name
                      and "Memset" not in s.name and STAMP_KERNEL not in s.name), key=lambda s: s.start_us)
    n = made * calls
    if not kernels or len(kernels) % n:
        raise RuntimeError(f"CUPTI saw {len(kernels)} kernels for {n} replayed calls: cannot tell the calls apart")
    per = len(kernels) // n
    return [max(k.end_us for k in kernels[i:i + per]) - kernels[i].start_us for i in range(0, len(kernels), per)]


def capture(d: Dispatcher, sets: list, layout: Layout, calls: int) -> Any:
    """A graph of ``calls`` calls back to back (warmed eagerly on a side stream first, as torch asks)."""
    work = [_call_args(sets[i % len(sets)], layout) for i in range(calls)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for args, kw in work:
            d(*args, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args, kw in work:
            d(*args, **kw)
    return graph


def replay_costs(graph: Any, replays: int = 100) -> tuple[float, float]:
    """(host µs per ``replay()``, GPU µs per replay): the replays queued behind a sleep, timed by one event pair."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    t0 = time.perf_counter_ns()
    for _ in range(replays):
        graph.replay()
    host = (time.perf_counter_ns() - t0) / replays / 1e3
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) * 1e3 / replays


def cost_replays(bare: Any) -> int:
    """Replays a cost measurement queues: about ``COST_GPU_US`` of the bare graph, 10 to 100."""
    _, gpu = replay_costs(bare, 10)
    return max(10, min(100, round(COST_GPU_US / max(gpu, 1e-3))))


def interleaved_costs(graph: Any, bare: Any, calls: int, rounds: int = COST_ROUNDS,
                      control: Any = None) -> dict[str, float]:
    """What ``graph`` costs beyond ``bare`` per replay, medians over ``rounds`` rounds taking each in turn; with
    ``control`` (a second capture of the bare graph) the same difference for it, the A/A noise of the figure."""
    replays = cost_replays(bare)
    host, gpu, bare_host, bare_gpu, aa = [], [], [], [], []
    for _ in range(rounds):
        h, g = replay_costs(bare, replays)
        bare_host.append(h)
        bare_gpu.append(g)
        h, g = replay_costs(graph, replays)
        host.append(h)
        gpu.append(g)
        if control is not None:
            aa.append(replay_costs(control, replays)[1] - bare_gpu[-1])
    med = statistics.median
    per_call = sorted((g - b) / calls for g, b in zip(gpu, bare_gpu))
    out = {"host_us_per_replay": med(host), "bare_host_us_per_replay": med(bare_host),
           "gpu_us_per_replay": med(gpu), "bare_gpu_us_per_replay": med(bare_gpu),
           "gpu_us_per_timed_call": med(per_call), "gpu_us_per_timed_call_range": [per_call[0], per_call[-1]],
           "host_us_added_per_replay": med(h - b for h, b in zip(host, bare_host)), "rounds": rounds,
           "replays_per_round": replays}
    if aa:
        out["aa_gpu_us_per_call"] = med(aa) / calls
    return out


def calibrated(tel: Telemetry, tries: int = 50) -> int:
    """Flush until the bracket's constant is known on this device (its calibration replays need a flush or two)."""
    for _ in range(tries):
        tel.flush()
        torch.cuda.synchronize()
        constants = tel.bracket_constants
        if constants:
            return max(constants.values())
    raise RuntimeError("the bracket's calibration never finished")


def _stats(got: list[float], ref: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": len(got), "cupti_calls": len(ref)}
    if not got or not ref:
        return {**out, "error": "no samples" if not got else "no CUPTI kernels"}
    for name, q in (("median", 0.5), ("p90", 0.9)):
        t, c = _quantile(got, q), _quantile(ref, q)
        out[f"telemetry_{name}_us"], out[f"cupti_{name}_us"] = t, c
        out[f"{name}_error_pct"] = 100.0 * (t - c) / c
    out["within_bound"] = all(abs(out[f"{n}_error_pct"]) <= BOUND_PCT for n in ("median", "p90"))
    return out


def run(*, cases: tuple[tuple[str, str, int], ...] = CASES, graph_calls: tuple[int, ...] = GRAPH_CALLS,
        regimes: tuple[str, ...] = REGIMES, clocks: tuple[str, ...] = CLOCKS, replays: int = 40, topk: int = 2048,
        layout: Layout = Layout(512, 64), heads: int = 16, kv_len: int = 8192, dtype: torch.dtype = torch.bfloat16,
        progress: Any = None) -> dict[str, Any]:
    """Every case x graph size x clock x regime; ``progress(text)`` hears of each case as it starts."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench fidelity --graphs needs a CUDA device (CUPTI is the reference)")
    platform, device = detect(), torch.device("cuda")
    points: list[dict[str, Any]] = []
    costs: list[dict[str, Any]] = []
    constants: list[int] = []
    for label, guard, rows in cases:
        if progress is not None:
            progress(f"{rows} rows on the {label}")
        policy = Policy(guard=GuardMode(guard))
        sets = make_sets(rows, topk, heads, layout, max(kv_len, rows), dtype=dtype, device=device)
        bare = Dispatcher(platform=platform, policy=policy, registry=unstamped_registry())
        for calls in graph_calls:
            bare_graph = capture(bare, sets, layout, calls)
            control = capture(bare, sets, layout, calls)  # the A/A control of the cost: a bare graph against another
            for clock in clocks:
                cfg = TelemetryConfig(models=("bench",), sample_first=1 << 30, sample_every=1, keep_samples=True,
                                      decisions_maxlen=0, timing="gpu", timing_gate=False,
                                      graph_clock="events" if clock == "graph" else "bracket")
                tel = Telemetry(cfg, platform=platform, policy=policy)
                try:
                    d = tel.instrument(Dispatcher(platform=platform, policy=policy, registry=unstamped_registry()))
                    graph = capture(d, sets, layout, calls)
                    constant = calibrated(tel) if clock == "bracket" else None
                    if constant is not None:
                        constants.append(constant)
                    costs.append({"case": label, "rows": rows, "calls": calls, "clock": clock,
                                  **interleaved_costs(graph, bare_graph, calls, control=control)})
                    for regime in regimes:
                        tel.drain_samples()
                        drive(graph, regime, replays, tel)
                        got = [s["seconds"] * 1e6 for s in tel.drain_samples() if s["clock"] == clock]
                        ref = cupti_call_us(graph, regime, replays, calls, tel)
                        points.append({"case": label, "guard": guard, "rows": rows, "calls": calls, "clock": clock,
                                       "regime": regime, "constant_ns": constant, **_stats(got, ref)})
                finally:
                    tel.close()
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layout": str(layout), "topk": topk,
            "heads": heads, "kv_len": kv_len, "dtype": str(dtype), "replays_per_point": replays,
            "bound_pct": BOUND_PCT, "bracket_constant_ns": sorted(constants), "points": points, "costs": costs}


def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"graph clocks vs CUPTI, {result['device']}, {result['layout']}, top-k {result['topk']}, "
                        f"{result['dtype']}, {result['replays_per_point']} replays a point")
    for col in ("call", "rows", "graph", "regime", "clock", "telemetry p50 µs", "CUPTI p50 µs", "err p50",
                "telemetry p90 µs", "CUPTI p90 µs", "err p90", f"within {result['bound_pct']:.0f}%"):
        table.add_column(col, justify="right")
    for p in result["points"]:
        head = (p["case"], str(p["rows"]), f"{p['calls']} call{'s' if p['calls'] > 1 else ''}", p["regime"], p["clock"])
        if "error" in p:
            table.add_row(*head, p["error"], *[""] * 6)
            continue
        table.add_row(*head, f"{p['telemetry_median_us']:.2f}", f"{p['cupti_median_us']:.2f}",
                      f"{p['median_error_pct']:+.1f}%", f"{p['telemetry_p90_us']:.2f}", f"{p['cupti_p90_us']:.2f}",
                      f"{p['p90_error_pct']:+.1f}%", "yes" if p["within_bound"] else "NO")
    console = Console(width=170)
    console.print(table)
    cost = Table(title="cost inside a replay, against a bare graph of the same calls")
    for col in ("call", "rows", "graph", "clock", "GPU µs per timed call", "rounds' range", "A/A µs",
                f"within {COST_GOAL_US:g} µs", "host µs added per replay()", "bare host µs per replay()"):
        cost.add_column(col, justify="right")
    for c in result["costs"]:
        lo, hi = c.get("gpu_us_per_timed_call_range", (c["gpu_us_per_timed_call"],) * 2)
        aa = c.get("aa_gpu_us_per_call")
        cost.add_row(c["case"], str(c["rows"]), str(c["calls"]), c["clock"], f"{c['gpu_us_per_timed_call']:+.2f}",
                     f"{lo:+.2f} to {hi:+.2f}", "" if aa is None else f"{aa:+.2f}",
                     "yes" if c["gpu_us_per_timed_call"] <= COST_GOAL_US else "NO",
                     f"{c['host_us_added_per_replay']:+.2f}", f"{c['bare_host_us_per_replay']:.2f}")
    console.print(cost)
    if result["bracket_constant_ns"]:
        values = result["bracket_constant_ns"]
        console.print(f"bracket constant (calibrated by telemetry, empty brackets, no profiler): {values[0]}-"
                      f"{values[-1]} ns over {len(values)} calibrations, median {statistics.median(values):.0f} ns")
