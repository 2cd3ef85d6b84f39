"""`routescope bench fidelity`: telemetry's per-call latency against CUPTI's kernel time for the very same calls.

Each call goes through an instrumented ``Dispatcher`` with every call timed (``sample_every=1``:
the stamps are what default sampling takes too, one call in 128) under ``torch.profiler`` with
CUDA activity only (no CPU tracing, which would slow the host between calls and so change what
the clocks see), so CUPTI gives each call's kernel time: first kernel start to last kernel end,
the calls told apart by position (every call of a point runs the same kernels in the same order;
``call_spans_us``). Two regimes per size:

- ``idle``: the GPU has finished everything before the call is issued (a sync, then a short
  host sleep), so any clock that starts before the launch reads the host's launch time too;
- ``back_to_back``: calls issued one after another, as a serving loop does.

Prints, per size and regime, the median and p90 of telemetry's samples and of CUPTI's, their
errors, and the clock the samples came from. Samples on the ``device`` clock are the kernels'
stamped span plus the GPU model's kernel frame (``telemetry.clocks.frame``); the bench also gives the
bare span and, over every point, the frame it measures (CUPTI's median minus the span's): the
value ``ROUTESCOPE_TELEMETRY_DEVICE_FRAME_NS`` takes on a GPU model not measured yet.

``stamps=False`` withholds the project's stamps from its kernels, so telemetry times them as it times vLLM's and
AITER's, which write none: by event pairs. Each size then runs once per event clock in the same run: plain pairs
(``events``) and gated pairs (``gated``, ``telemetry.clocks.gate``), the gated readings with the GPU model's constant
taken off; the bench gives, over the gated points, the constant it measures (the gated pair's median minus CUPTI's,
before the constant): the value ``ROUTESCOPE_TELEMETRY_GATED_FRAME_NS`` takes on a GPU model not measured yet.
On a machine without CUDA it says so and exits 2.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from dispatcher import Dispatcher, Policy, detect
from dispatcher.kernels.impl import KernelImpl
from dispatcher.kernels.registry import KernelRegistry, default_registry
from dispatcher.sweep.cupti import spans
from dispatcher.sweep.grid import Layout
from dispatcher.sweep.inputs import make_sets
from dispatcher.types import GuardMode, Kernel

from ..config import TelemetryConfig
from ..core import Telemetry

DEFAULT_ROWS = (1, 2, 16, 256, 1024, 4096)
GATE_KERNEL = "gate_wait"  # telemetry.clocks.gate's wait: telemetry's kernel in the call's range, not the call's
REGIMES = ("idle", "back_to_back")
BOUND_PCT = 10.0


def call_spans_us(found: list, calls: int, telemetrys: tuple[str, ...] = (GATE_KERNEL,)) -> list[float]:
    """CUPTI's kernel time (µs) of each of ``calls`` calls that each ran the same kernels in the same order: the
    GPU's kernels in start order, telemetry's own (``telemetrys``: the gate's wait, the bracket's stamps) and copies
    left out, cut into ``calls`` runs of equal length; each run's first kernel start to its last kernel end."""
    kernels = sorted((k for k in found if k.on_gpu and "Memcpy" not in k.name and "Memset" not in k.name
                      and not any(t in k.name for t in telemetrys)), key=lambda k: k.start_us)
    if calls < 1 or not kernels or len(kernels) % calls:
        raise ValueError(f"{len(kernels)} kernels for {calls} calls: the calls cannot be told apart")
    per = len(kernels) // calls
    return [max(k.end_us for k in kernels[i:i + per]) - kernels[i].start_us for i in range(0, len(kernels), per)]


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _call_args(a: Any, layout: Layout) -> tuple[tuple, dict]:
    return ((a.q, a.kv, a.index.indices, a.index.topk_length, a.scale, layout.head_dim, layout.nope, layout.rope,
             a.attn_sink, a.output),
            {"num_decodes": a.q.shape[0], "num_decode_tokens": a.q.shape[0], "num_prefills": 0, "model": "bench"})


def unstamped_registry() -> KernelRegistry:
    """The default implementations with their stamps withheld: stand-ins for kernels that write none (vLLM's, AITER's)."""
    source, registry = default_registry(), KernelRegistry()
    for kernel in Kernel:
        for impl in source.impls(kernel):
            registry.register(KernelImpl(impl.kernel, impl.impl, _without_stamp(impl.launch), impl.runs_on))
    return registry


def _without_stamp(launch: Any) -> Any:
    def launch_unstamped(args: Any) -> Any:
        return launch(args._replace(stamp=None))

    return launch_unstamped


def measure_point(d: Dispatcher, tel: Telemetry, sets: list, layout: Layout, *, calls: int, regime: str,
                  frame_ns: int = 0) -> dict:
    """One size in one regime: telemetry's samples and CUPTI's kernel times of the same ``calls`` calls;
    ``frame_ns``, the frame in the device clock's samples (taken off again for the bare span)."""
    from torch.profiler import ProfilerActivity, profile

    tel.drain_samples()
    work = [_call_args(sets[i % len(sets)], layout) for i in range(calls)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for args, kw in work:
            if regime == "idle":
                torch.cuda.synchronize()
                time.sleep(0.0002)
            d(*args, **kw)
        torch.cuda.synchronize()
    samples = tel.drain_samples()
    got = [s["seconds"] * 1e6 for s in samples]
    ref = call_spans_us(spans(prof.events()), calls)
    clocks = sorted({s["clock"] for s in samples})
    if not got or not ref:
        return {"regime": regime, "samples": len(got), "cupti_calls": len(ref), "clocks": clocks,
                "error": "no samples" if not got else "no CUPTI kernel ranges"}
    out = {"regime": regime, "clocks": clocks, **figures(got, ref)}
    if clocks == ["device"]:
        out["span_median_us"] = out["telemetry_median_us"] - frame_ns / 1000
        out["frame_gap_ns"] = 1000 * (out["cupti_median_us"] - out["span_median_us"])
    elif clocks == ["gated"]:  # what the pair read beyond CUPTI before the constant came off
        out["gated_excess_ns"] = 1000 * (out["telemetry_median_us"] - out["cupti_median_us"]) + frame_ns
    if len(got) == len(ref):
        paired = [100.0 * (t - c) / c for t, c in zip(got, ref)]
        out["paired_median_error_pct"] = statistics.median(paired)
    return out


def figures(got: list[float], ref: list[float]) -> dict[str, Any]:
    """Telemetry's readings against CUPTI's (µs): each side's median and p90, the error of each (%), the bound."""
    out: dict[str, Any] = {"samples": len(got), "cupti_calls": len(ref)}
    for name, q in (("median", 0.5), ("p90", 0.9)):
        t, c = _quantile(got, q), _quantile(ref, q)
        out[f"telemetry_{name}_us"] = t
        out[f"cupti_{name}_us"] = c
        out[f"{name}_error_pct"] = 100.0 * (t - c) / c
    out["within_bound"] = all(abs(out[f"{n}_error_pct"]) <= BOUND_PCT for n in ("median", "p90"))
    return out


def run(*, rows: tuple[int, ...] = DEFAULT_ROWS, regimes: tuple[str, ...] = REGIMES, calls: int = 60,
        topk: int = 2048, layout: Layout = Layout(512, 64), heads: int = 16, kv_len: int = 8192,
        dtype: torch.dtype = torch.bfloat16, timing: str = "gpu", guard: str = "observe",
        frame_ns: int = -1, stamps: bool = True, gated_frame_ns: int = -1) -> dict[str, Any]:
    """Every size in every regime; ``timing`` is the TelemetryConfig timing mode under test, ``guard`` the decode
    guard (observe: pure decodes run on the prefill kernel, as in the seed's bug; reroute: on the split-K one),
    ``frame_ns`` its ``device_frame_ns`` (-1: the GPU model's measured frame). ``stamps=False``: the kernels write
    none, and each size runs under plain and gated event pairs (``gated_frame_ns``: -1, the GPU model's constant)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench fidelity needs a CUDA device (CUPTI is the reference)")
    platform, policy = detect(), Policy(guard=GuardMode(guard))
    cfg = TelemetryConfig(models=("bench",), sample_first=1 << 30, sample_every=1, keep_samples=True,
                          decisions_maxlen=0, timing=timing, timing_pool=4 * calls, device_frame_ns=frame_ns,
                          gated_frame_ns=gated_frame_ns)
    variants = [("stamps", cfg)] if stamps else [("events", cfg.with_(timing_gate=False)), ("gated", cfg)]
    runs = []
    for name, variant_cfg in variants:
        tel = Telemetry(variant_cfg, platform=platform, policy=policy)
        registry = None if stamps else unstamped_registry()
        runs.append((name, tel, tel.instrument(Dispatcher(platform=platform, policy=policy, registry=registry))))
    device = torch.device("cuda")
    points: list[dict[str, Any]] = []
    frame = 0
    gated_in_use = 0
    try:
        for r in rows:
            sets = make_sets(r, topk, heads, layout, max(kv_len, r), dtype=dtype, device=device)
            for name, tel, d in runs:
                for i in range(3):  # compile and warm outside the profiler (and build the gate: a flush)
                    args, kw = _call_args(sets[i % len(sets)], layout)
                    d(*args, **kw)
                    torch.cuda.synchronize()
                    tel.flush()
                frame = max(tel.device_frames.values(), default=frame)
                gated_in_use = tel.gated_frame_ns if name == "gated" else gated_in_use
                for regime in regimes:
                    point = measure_point(d, tel, sets, layout, calls=calls, regime=regime,
                                          frame_ns=gated_in_use if name == "gated" else frame)
                    points.append({"rows": r, "variant": name, **point})
    finally:
        for _, tel, _ in runs:
            tel.close()
    gaps = [p["frame_gap_ns"] for p in points if "frame_gap_ns" in p]
    excess = [p["gated_excess_ns"] for p in points if "gated_excess_ns" in p]
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "timing": timing, "guard": guard,
            "layout": str(layout), "topk": topk, "heads": heads, "kv_len": kv_len, "dtype": str(dtype),
            "calls_per_point": calls, "bound_pct": BOUND_PCT, "stamps": stamps, "frame_ns_in_use": frame,
            "frame_ns_measured": round(statistics.median(gaps)) if gaps else None,
            "gated_frame_ns_in_use": gated_in_use if not stamps else None,
            "gated_frame_ns_measured": round(statistics.median(excess)) if excess else None, "points": points}


def point_cells(p: dict[str, Any]) -> list[str]:
    """One point's row as printed; n is the calls telemetry timed / CUPTI saw (each side's quantiles are its own)."""
    head = [str(p["rows"]), p["regime"], ",".join(p["clocks"]), f"{p['samples']}/{p['cupti_calls']}"]
    if "error" in p:
        return [*head, p["error"], *[""] * 6]
    return [*head, f"{p['telemetry_median_us']:.1f}", f"{p['cupti_median_us']:.1f}", f"{p['median_error_pct']:+.1f}%",
            f"{p['telemetry_p90_us']:.1f}", f"{p['cupti_p90_us']:.1f}", f"{p['p90_error_pct']:+.1f}%",
            "yes" if p["within_bound"] else "NO"]


def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"telemetry vs CUPTI, {result['device']}, {result['layout']}, top-k {result['topk']}, "
                        f"{result['dtype']}, guard {result['guard']}, {result['calls_per_point']} calls a point")
    for col in ("rows", "regime", "clock", "n", "telemetry p50 µs", "CUPTI p50 µs", "err p50", "telemetry p90 µs",
                "CUPTI p90 µs", "err p90", f"within {result['bound_pct']:.0f}%"):
        table.add_column(col, justify="right")
    for p in result["points"]:
        table.add_row(*point_cells(p))
    console = Console(width=160)
    console.print(table)
    if result.get("gated_frame_ns_measured") is not None:
        console.print(f"gated pairs: {result['gated_frame_ns_in_use']} ns taken off each reading; measured here "
                      f"{result['gated_frame_ns_measured']} ns (the gated median beyond CUPTI's before it came off, "
                      f"median over the points)")
    if result.get("frame_ns_measured") is not None:
        console.print(f"kernel frame: {result['frame_ns_in_use']} ns added to each stamped span; measured here "
                      f"{result['frame_ns_measured']} ns (CUPTI's median minus the span's, median over the points)")
