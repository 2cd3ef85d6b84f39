"""The bench's ground truth: the same calls replayed under both arms, timed by CUPTI (the host clock on CPU)."""

from __future__ import annotations

import statistics
import time
from bisect import bisect_right
from contextlib import nullcontext
from typing import Any

import torch

from dispatcher import Dispatcher
from dispatcher.types import Kernel
from telemetry.buckets import rows_edges, rows_labels
from workloads.traffic import CallSpec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _label_of(edges: tuple[int, ...], labels: tuple[str, ...], rows: int) -> tuple[str, int, int | None]:
    i = bisect_right(edges, rows) - 1
    return labels[i], edges[i], edges[i + 1] if i + 1 < len(edges) else None


class _HostSpan:
    """The host clock around a block (the CPU's ground truth)."""

    seconds = 0.0

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self._t0


class _Stamps:
    """Device stamps for the ground truth's stamped launches: one entry each, read after the replay (CUDA only)."""

    def __init__(self, device: torch.device, entries: int) -> None:
        from telemetry.clocks.frame import AUTO, device_name, frame_ns
        from telemetry.clocks.stamps import StampTable

        self.table = StampTable(torch, device, eager=max(entries, 1), graph=0,
                                frame=frame_ns(device_name(torch, device), AUTO))

    def claim(self) -> Any:
        return self.table.claim()

    def seconds(self, stamp: Any) -> float | None:
        if stamp is None or not stamp.armed:
            return None
        start, end = self.table.read(stamp.index)
        return (end - start + self.table.frame) * 1e-9 if start > 0 and end >= start else None


def ground_truth(d: Dispatcher, ops: dict, specs: list[CallSpec], threshold: int, device: torch.device, *,
                 per_cell: int, block: int = 16) -> dict[tuple, dict]:
    """(model, rows bucket, call class) -> mean kernel seconds of A and B over the same calls.

    Each sampled call is launched right behind the call that preceded it in the stream (on A, untimed), as it runs
    in the stream; arms alternate in blocks (A then B, then B then A). Every call runs twice per arm: plain (the
    truth: CUPTI's kernel time of the kernels as production runs them) and with a device stamp (CUPTI's time of the
    stamped kernels, and the stamp's own reading: what the experiment's clock adds and how true it reads).
    """
    edges = rows_edges(d.policy.thresholds + (threshold,))
    labels = rows_labels(edges)
    cells: dict[tuple, list[int]] = {}
    bounds: dict[tuple, tuple] = {}
    for i, spec in enumerate(specs):
        if spec.rows >= threshold:
            continue
        label, lo, hi = _label_of(edges, labels, spec.rows)
        key = (spec.model, label, spec.kind)
        cells.setdefault(key, []).append(i)
        bounds[key] = (lo, hi)
    dev = device.type
    impl_a = d.registry.resolve(Kernel.INTREE_RAGGED_PREFILL, dev)
    impl_b = d.registry.resolve(Kernel.INTREE_SPARSE_DECODE, dev)
    plan: list[tuple[tuple, str, bool, int]] = []  # (cell, arm, stamped, stream index)
    for key, where in cells.items():
        step = max(1, len(where) // per_cell)
        sample = where[::step][:per_cell]
        for b in range(0, len(sample), block):
            chunk = sample[b:b + block]
            arms = ("a", "b") if (b // block) % 2 == 0 else ("b", "a")
            for stamped in (False, True):
                for arm in arms:
                    plan.extend((key, arm, stamped, i) for i in chunk)
    stamps = _Stamps(device, len(plan)) if device.type == "cuda" else None
    claimed: list[Any] = [None] * len(plan)

    def launcher(n: int) -> Any:
        key, arm, stamped, i = plan[n]
        spec, before = specs[i], specs[i - 1] if i > 0 else None
        impl = impl_a if arm == "a" else impl_b

        def call(around: Any = nullcontext) -> None:
            if before is not None:
                impl_a.launch(ops[before.model].args(before))
            args = ops[spec.model].args(spec)
            if stamped and stamps is not None:
                claimed[n] = stamps.claim()
                args = args._replace(stamp=claimed[n])
            with around():
                impl.launch(args)
        return call

    calls = [launcher(n) for n in range(len(plan))]
    for n, (key, arm, stamped, i) in enumerate(plan):  # compiles and warms every variant first (unstamped)
        if not stamped:
            impl_a.launch(ops[specs[i].model].args(specs[i]))
            impl_b.launch(ops[specs[i].model].args(specs[i]))
    _sync(device)
    if stamps is not None:
        stamps = _Stamps(device, len(plan))  # a fresh table: every entry claimed once below
    seconds = replay_seconds(calls, device, last_only=True)
    out: dict[tuple, dict] = {}
    for n, ((key, arm, stamped, _), t) in enumerate(zip(plan, seconds)):
        entry = out.setdefault(key, {"lo": bounds[key][0], "hi": bounds[key][1], "stream_calls": len(cells[key]),
                                     "a": [], "b": [], "a_stamped": [], "b_stamped": [], "a_read": [], "b_read": []})
        if t is not None:
            entry[arm + ("_stamped" if stamped else "")].append(t)
        if stamped and stamps is not None:
            read = stamps.seconds(claimed[n])
            if read is not None:
                entry[arm + "_read"].append(read)
    for entry in out.values():
        for field in ("a", "b", "a_stamped", "b_stamped", "a_read", "b_read"):
            values = entry.pop(field)
            entry["mean_" + field] = statistics.fmean(values) if values else None
        entry["ratio"] = entry["mean_b"] / entry["mean_a"]
        entry["ratio_stamped"] = (entry["mean_b_stamped"] / entry["mean_a_stamped"]
                                  if entry["mean_a_stamped"] else None)
        entry["ratio_read"] = entry["mean_b_read"] / entry["mean_a_read"] if entry["mean_a_read"] else None
    return out


def truth_buckets(truth: dict[tuple, dict]) -> list[dict]:
    """The ground truth pooled per rows bucket as the experiment pools it: cells weighted by their stream calls."""
    groups: dict[tuple, list[dict]] = {}
    for (model, label, kind), v in truth.items():
        groups.setdefault((v["lo"], v["hi"], label), []).append(v)
    out = []
    for (lo, hi, label), members in sorted(groups.items()):
        total_a = sum(v["stream_calls"] * v["mean_a"] for v in members)
        total_b = sum(v["stream_calls"] * v["mean_b"] for v in members)
        out.append({"rows_bucket": label, "lo": lo, "hi": hi, "ratio": total_b / total_a,
                    "calls": sum(v["stream_calls"] for v in members)})
    return out


def replay_seconds(calls: list, device: torch.device, *, last_only: bool = False) -> list[float]:
    """Kernel seconds of each call launched back to back (the live regime, no L2 flush, no hold): CUPTI's GPU range
    of the call (torch.profiler, ``dispatcher.sweep.cupti``) on CUDA, the host clock elsewhere. ``last_only``: a call
    launches context first and then the call timed; only the kernels of its last launch are in the range."""
    if device.type != "cuda":
        out = []
        for call in calls:
            span = _HostSpan()
            if last_only:
                call(lambda span=span: span)
            else:
                with span:
                    call()
            out.append(span.seconds)
        return out
    from torch.profiler import ProfilerActivity, profile, record_function

    from dispatcher.sweep.cupti import call_name, call_seconds, spans

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i, call in enumerate(calls):
            if last_only:
                call(lambda i=i: record_function(call_name(i)))
            else:
                with record_function(call_name(i)):
                    call()
        torch.cuda.synchronize(device)
    seconds = call_seconds(spans(prof.events()))
    return [seconds.get(i) for i in range(len(calls))]  # None: the profiler kept no GPU range for that call
