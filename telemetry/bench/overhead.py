"""Host cost per call of (a) the bare dispatcher, (b) with telemetry, (c) with naive prometheus_client calls.

All three run the same calls in one process, interleaved pass by pass in a shuffled order,
and the median over passes is reported (differences are medians of per-pass differences, so
slow drift of the machine cancels). First with a no-op kernel launch, so telemetry's cost is
not hidden under the kernel's; then with the real (small) torch kernels.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from prometheus_client import CollectorRegistry

from dispatcher import Dispatcher, Policy, what_if
from dispatcher.types import Batch

from ..config import TelemetryConfig
from ..core import Telemetry
from .workload import NOOP_IMPL, NaiveProbe, make_calls, noop_registry, real_registry

VARIANTS = ("bare", "empty_probe", "instrumented", "naive_prometheus")


class EmptyProbe:
    """start/stop/error that do nothing: what the dispatcher's probe protocol itself costs (two calls)."""

    def __init__(self) -> None:
        def start(decision: Any, shape: Any, batch: Any, model: Any, q: Any, stream: Any, impl: Any = None) -> Any:
            return None

        def stop(token: Any, impl: str, announced: Any = None) -> None:
            return None

        def error(token: Any, exc: BaseException, impl: str | None = None, announced: str | None = None) -> None:
            return None

        self.start, self.stop, self.error = start, stop, error


def _pass(d: Dispatcher, calls: list) -> tuple[float, float]:
    """(thread CPU ns, wall ns) per call: CPU time ignores the time other processes hold the core."""
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for args, kw in calls:
        d(*args, **kw)
    c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
    return (c1 - c0) / len(calls), (w1 - w0) / len(calls)


def _probe_only(probe: Any, records: list, impl: str) -> float:
    """start, and stop where the dispatcher calls it (not for an int token whose announced impl ran)."""
    start, stop = probe.start, probe.stop
    t0 = time.thread_time_ns()
    for dec, shape, batch, model, q in records:
        token = start(dec, shape, batch, model, q, None, impl)
        if token.__class__ is not int:
            stop(token, impl, impl)
    return (time.thread_time_ns() - t0) / len(records)


def _records(d: Dispatcher, calls: list) -> list:
    """(decision, shape, batch, model, q) per call, exactly as the dispatcher hands them to a probe."""
    from dispatcher.classify import classify
    from dispatcher.validate import validate

    out = []
    for args, kw in calls:
        shape = validate(*args)
        meta = {k: v for k, v in kw.items() if k != "model"}
        batch: Batch = classify(rows=shape.rows, spec_tokens=d.policy.spec_tokens, **meta)
        out.append((d.decide(shape, batch), shape, batch, kw.get("model"), args[0]))
    return out


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """(median of per-pass a - b, its band): half the differences' interquartile range, and never less than how
    far the difference of the two medians lies from it, so the printed medians and difference always agree
    within the printed band."""
    diffs = [x - y for x, y in zip(a, b)]
    d = statistics.median(diffs)
    q = statistics.quantiles(diffs, n=4, method="inclusive") if len(diffs) > 1 else [d, d, d]
    gap = abs((statistics.median(a) - statistics.median(b)) - d)
    return d, max((q[2] - q[0]) / 2, gap)


def resolved(diff: float, band: float) -> bool:
    """A difference told apart from noise: larger than its band."""
    return diff > band


def measure(*, calls: int, repeats: int, kernels: str, multiproc_dir: str | None = None, seed: int = 0) -> dict[str, Any]:
    """One interleaved run; ``kernels`` is "noop" or "real" (torch on one thread, so the calling thread's CPU time
    is the whole kernel's and not a share of a pool's that moves from pass to pass)."""
    import torch

    threads = torch.get_num_threads()
    if kernels == "real":
        torch.set_num_threads(1)
    try:
        return _measure(calls=calls, repeats=repeats, kernels=kernels, multiproc_dir=multiproc_dir, seed=seed)
    finally:
        torch.set_num_threads(threads)


def _measure(*, calls: int, repeats: int, kernels: str, multiproc_dir: str | None, seed: int) -> dict[str, Any]:
    platform, policy = what_if("gfx942"), Policy()
    registry = noop_registry if kernels == "noop" else real_registry
    impl = NOOP_IMPL if kernels == "noop" else "torch"
    # the mix's decodes through the prefill entry are the workload, not a bug to warn about (the warning is logged
    # once per model x kernel, before any timed pass: the per-call path is the default one)
    cfg = TelemetryConfig(models=("glm", "dsv4"), multiproc_dir=multiproc_dir, log_first_decode_in_prefill=False)
    tel = Telemetry(cfg, platform=platform, policy=policy)
    bare = Dispatcher(platform=platform, policy=policy, registry=registry())
    inst = tel.instrument(Dispatcher(platform=platform, policy=policy, registry=registry()))
    naive_probe = NaiveProbe(CollectorRegistry(), tel._agg.buckets, arch=platform.arch)
    naive = Dispatcher(platform=platform, policy=policy, registry=registry(), probe=naive_probe)
    workload = make_calls(calls, seed=seed)
    empty = Dispatcher(platform=platform, policy=policy, registry=registry(), probe=EmptyProbe())
    disp = {"bare": bare, "empty_probe": empty, "instrumented": inst, "naive_prometheus": naive}
    tel.start()
    try:
        for d in disp.values():  # warm up: caches, first-N timed calls of every slot, label children
            _pass(d, workload)
        gc.collect()
        gc.freeze()  # torch's many objects out of the collector's way: collections stay cheap and even
        per: dict[str, list[float]] = {v: [] for v in VARIANTS}
        wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
        rng = random.Random(seed)
        for _ in range(repeats):
            order = list(VARIANTS)
            rng.shuffle(order)
            for v in order:
                cpu_ns, wall_ns = _pass(disp[v], workload)
                per[v].append(cpu_ns)
                wall[v].append(wall_ns)
        records = _records(bare, workload)
        probe_only = {"instrumented": [], "naive_prometheus": []}
        for _ in range(repeats):
            probe_only["instrumented"].append(_probe_only(tel.probe, records, impl))
            probe_only["naive_prometheus"].append(_probe_only(naive_probe, records, impl))
    finally:
        gc.unfreeze()
        tel.close()
    med = {v: statistics.median(x) for v, x in per.items()}
    d_inst, band_inst = paired(per["instrumented"], per["bare"])
    d_naive, band_naive = paired(per["naive_prometheus"], per["bare"])
    d_empty, band_empty = paired(per["empty_probe"], per["bare"])
    both = resolved(d_inst, band_inst) and resolved(d_naive, band_naive)
    return {
        "kernels": kernels,
        "kernel_note": ("kernel launch replaced by a no-op (registry entries whose launch does nothing)"
                        if kernels == "noop" else "real torch kernels (CPU, one torch thread), AITER names served by "
                                                  "the torch prefill"),
        "calls": calls,
        "repeats": repeats,
        "bare_ns_per_call": med["bare"],
        "instrumented_ns_per_call": med["instrumented"],
        "naive_prometheus_ns_per_call": med["naive_prometheus"],
        "empty_probe_ns_per_call": med["empty_probe"],
        "instrumented_minus_bare_ns": d_inst,
        "instrumented_minus_bare_band_ns": band_inst,
        "empty_probe_minus_bare_ns": d_empty,
        "empty_probe_minus_bare_band_ns": band_empty,
        "instrumented_minus_empty_probe_ns": statistics.median(
            i - e for i, e in zip(per["instrumented"], per["empty_probe"])),
        "naive_minus_bare_ns": d_naive,
        "naive_minus_bare_band_ns": band_naive,
        "naive_over_instrumented_overhead": (d_naive / d_inst) if both and d_inst > 0 else None,
        "naive_over_instrumented_note": None if both else (
            "unknown: a difference is within its band (the kernels' own variation hides telemetry's cost)"),
        "probe_only_ns_per_call": {k: statistics.median(v) for k, v in probe_only.items()},
        "wall_ns_per_call": {v: statistics.median(x) for v, x in wall.items()},
        "wall_instrumented_minus_bare_ns": statistics.median(i - b for i, b in zip(wall["instrumented"], wall["bare"])),
        "clock": "thread CPU time (time.thread_time_ns), medians over interleaved passes; wall time beside it",
        "instrumented_calls_counted": sum(tel.totals.calls.values()),
        "telemetry_errors": sum(tel.totals.telemetry_errors.values()),
        "multiprocess": multiproc_dir is not None,
    }


def run(*, calls: int, repeats: int, real: bool = True, real_calls: int | None = None) -> dict[str, Any]:
    """The no-op run (headline keys at top level) and, if asked, the real-kernel run."""
    noop = measure(calls=calls, repeats=repeats, kernels="noop")
    out = {k: noop[k] for k in ("bare_ns_per_call", "instrumented_ns_per_call", "naive_prometheus_ns_per_call",
                                "instrumented_minus_bare_ns", "naive_minus_bare_ns", "naive_over_instrumented_overhead")}
    out["kernel_note"] = noop["kernel_note"]
    out["noop_kernel"] = noop
    if real:
        out["real_kernels"] = measure(calls=real_calls or max(64, calls // 20), repeats=min(repeats, 21),
                                      kernels="real")
    out["python"] = sys.version.split()[0]
    out["cpus"] = os.cpu_count()
    return out


def _measure_in_child(*, calls: int, repeats: int, multiproc_dir: str | None = None, seed: int = 0) -> dict[str, Any]:
    """``measure`` of the no-op run in a fresh interpreter (its own memory layout and hash seed)."""
    import json

    env = dict(os.environ)
    if multiproc_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
    code = ("import json,sys; from telemetry.bench.overhead import measure; "
            f"print(json.dumps(measure(calls={calls}, repeats={repeats}, kernels='noop', "
            f"multiproc_dir={multiproc_dir!r}, seed={seed})))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_multiprocess(*, calls: int, repeats: int) -> dict[str, Any]:
    """The same no-op measurement in a child whose prometheus_client runs in multiprocess (mmap) mode."""
    with tempfile.TemporaryDirectory(prefix="routescope-bench-mp-") as tmp:
        return _measure_in_child(calls=calls, repeats=repeats, multiproc_dir=tmp)


def run_processes(*, calls: int, repeats: int, processes: int,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The no-op measurement in ``processes`` fresh interpreters, one after another.

    Within one process the medians over passes are steady, but a process's memory layout moves its
    figure by tens of ns (the same probe code, placed in another object, reads 40 ns apart): the
    median over processes is the figure to hold against a budget."""
    runs = []
    for i in range(processes):
        if progress is not None:
            progress(i, processes)
        runs.append(_measure_in_child(calls=calls, repeats=repeats, seed=i))
    inst = [r["instrumented_minus_bare_ns"] for r in runs]
    naive = [r["naive_minus_bare_ns"] for r in runs]
    return {
        "processes": processes,
        "instrumented_minus_bare_ns": inst,
        "instrumented_minus_bare_median_ns": statistics.median(inst),
        "naive_minus_bare_median_ns": statistics.median(naive),
        "bare_ns_per_call": [r["bare_ns_per_call"] for r in runs],
        "telemetry_errors": sum(r["telemetry_errors"] for r in runs),
    }
