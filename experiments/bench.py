"""`routescope bench experiment`: split_below_N experiments on the demo's traffic, against a CUPTI ground truth.

One run, one device:
1. the demo's prefill-entry calls (``workloads.traffic``, GLM's decode rows through prefill, so small calls reach the
   prefill entry) at full shapes on a GPU, up to ``max_rows`` rows (larger calls are on A under every split_below
   candidate and would only dilute the cost figure); with ``thin`` > 1 every call from ``keep_rows`` up to
   ``keep_below`` rows and one in ``thin`` of the others, over as much more traffic as that takes
   (``experiments.sample``), so the thin buckets near the crossover get enough calls to decide;
2. each fraction: the stream through the Dispatcher with the experiment attached (flusher thread at 0.5 s; the kill
   switch set out of the way, since the bench measures cells on both sides of the crossover);
3. the ground truth: a sample of the same calls of every moved cell replayed under both arms, in interleaved blocks
   (A then B, then B then A), each call's kernel time from CUPTI (torch.profiler's GPU ranges); the host clock on
   CPU;
4. throughput (``experiments.throughput``), measured first, before any profiler runs: interleaved passes with no
   experiment and with A/A at each fraction; the median ratio per pair of passes is the machinery's cost.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from dispatcher import Dispatcher
from dispatcher.kernels import default_registry
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.types import Kernel
from workloads.scale import scaled
from workloads.traffic import DEMO_MODELS, CallSpec

from .config import ExperimentConfig
from .control import Registry, experiments, start
from .covariate import predictor_for
from .sample import stream, thinned
from .stats import crossover
from .throughput import drive as _drive
from .throughput import sync as _sync
from .throughput import throughput
from .truth import ground_truth, truth_buckets


def typer_option(default: Any, text: str, *names: str) -> Any:
    """A typer option with its help (typer is imported only when the command is built)."""
    import typer

    return typer.Option(default, *names, help=text)


class Operands:
    """One model's preallocated operands; a call launches on leading slices."""

    def __init__(self, shape: Any, max_rows: int, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        from dispatcher.sweep.inputs import topk_indices

        gen = torch.Generator(device=device).manual_seed(seed)
        h, d = shape.heads, shape.head_dim
        self.shape = shape
        self.q = torch.randn((max_rows, h, d), device=device, generator=gen).to(dtype)
        self.kv = torch.randn((shape.kv_pool, 1, d), device=device, generator=gen).to(dtype)
        self.indices = topk_indices(max_rows, shape.topk, shape.kv_pool, device, gen)
        self.out = torch.empty((max_rows, h, shape.nope_head_dim), device=device, dtype=dtype)
        self.scale = d ** -0.5

    def call(self, spec: CallSpec) -> tuple[tuple, dict]:
        """Positional and keyword arguments of the Dispatcher call for ``spec``."""
        r, s = spec.rows, self.shape
        return ((self.q[:r], self.kv, self.indices[:r], None, self.scale, s.head_dim, s.nope_head_dim,
                 s.rope_head_dim, None, self.out[:r]), {"query_lens": spec.query_lens, "model": spec.model})

    def args(self, spec: CallSpec) -> KernelArgs:
        r = spec.rows
        return KernelArgs(self.q[:r], self.kv, SparseIndex(self.indices[:r], None), self.scale, None, self.out[:r])


def _experiment(d: Dispatcher, ops: dict, specs: list[CallSpec], config: ExperimentConfig,
                device: torch.device, say: Any = None) -> dict:
    """One experiment over the stream; its view once every timing is in."""
    reg = Registry(d.platform, d.policy, torch_mod=torch, predictor=predictor_for(d.platform))
    reg.attach(d)
    start(reg, config)
    reg.start_flusher(0.5)
    t0 = time.perf_counter()
    chunk = max(len(specs) // 4, 1)
    for i in range(0, len(specs), chunk):
        _drive(d, ops, specs[i:i + chunk])
        if say is not None and i + chunk < len(specs):
            say(f"  {config.id}: {i + chunk:,} of {len(specs):,} calls ({time.perf_counter() - t0:.0f} s)")
    _sync(device)
    wall = time.perf_counter() - t0
    reg.close()
    for _ in range(20):  # the last events and stamps are read at these flushes
        reg.flush()
    view = experiments(reg)[0]
    view["wall_s"] = wall
    view["clock_calibration"] = reg.current.state()["clock_calibration"] if reg.current is not None else {}
    return view


def _off_ns(measured: float | None, truth: float | None) -> float | None:
    return (measured - truth) * 1e9 if measured is not None and truth else None


def run(*, calls: int = 60000, fractions: tuple[float, ...] = (0.01, 0.05), threshold: int = 256, seed: int = 7,
        max_rows: int = 1024, per_cell: int = 200, tp_calls: int = 8000, tp_repeats: int = 8,
        device: str | None = None, clock: str = "gated", keep_rows: int = 0, thin: int = 1,
        keep_below: int | None = None, progress: Any = None) -> dict:
    """The whole bench; a JSON-ready result."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    say = progress or (lambda text: None)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    full = dev.type == "cuda"
    t_gen = time.perf_counter()
    if thin > 1:
        specs, generated = thinned(calls, seed=seed, max_rows=max_rows, keep_rows=keep_rows, thin=thin,
                                   keep_below=keep_below, progress=say)
    else:
        specs, generated = stream(calls, seed=seed, max_rows=max_rows), None
    traffic_s = time.perf_counter() - t_gen
    ops = {m.name: Operands(scaled(m, full=full), max_rows, dev, dtype, seed + i) for i, m in enumerate(DEMO_MODELS)}
    d = Dispatcher(registry=default_registry(triton=dev.type == "cuda"))
    say(f"warming up on {dev} ({d.platform.arch}, {d.platform.device_name or 'cpu'})")
    warm = {(s.model, s.rows if s.rows <= 32 else s.rows.bit_length(), s.kind): s for s in specs}
    impl_b = d.registry.resolve(Kernel.INTREE_SPARSE_DECODE, dev.type)
    for spec in warm.values():
        args, kw = ops[spec.model].call(spec)
        d(*args, **kw)
        impl_b.launch(ops[spec.model].args(spec))
    _sync(dev)
    result: dict[str, Any] = {"device": d.platform.device_name or dev.type, "arch": d.platform.arch,
                              "calls": len(specs), "threshold": threshold, "seed": seed, "max_rows": max_rows,
                              "clock": clock, "truth_clock": "cupti" if full else "host", "keep_rows": keep_rows,
                              "keep_below": keep_below, "thin": thin,
                              "traffic": {"generated": generated, "seconds": traffic_s},
                              "fractions": list(fractions),
                              "experiments": {}}
    # first: torch.profiler (the ground truth) leaves CUPTI subscribed after it stops (Kineto calls cuptiFinalize only
    # with TEARDOWN_CUPTI=1), which makes every later CUDA API call dearer; a serving process runs no profiler
    say("throughput: no experiment against A/A")
    result["throughput"] = throughput(d, ops, specs[:tp_calls], fractions, dev, repeats=tp_repeats, clock=clock)
    say("ground truth: interleaved replay of the same calls under both arms")
    truth = ground_truth(d, ops, specs, threshold, dev, per_cell=per_cell)
    gt_buckets = truth_buckets(truth)
    result["ground_truth"] = {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in truth.items()}
    result["ground_truth_buckets"] = gt_buckets
    result["ground_truth_crossover"] = crossover([(b["lo"], b["hi"], b["ratio"], b["ratio"]) for b in gt_buckets],
                                                 below=True)
    by_label = {b["rows_bucket"]: b for b in gt_buckets}
    for f in fractions:
        say(f"experiment split_below_{threshold} at fraction {f}")
        config = ExperimentConfig(id=f"split-{f}", candidate=f"split_below_{threshold}", fraction=f, seed=seed,
                                  harm_bound=1.0, budget=1.0, clock=clock)
        view = _experiment(d, ops, specs, config, dev, say)
        rows = []
        for cell in view["cells"]:
            gt = truth.get((cell["model"], cell["rows_bucket"], cell["call_class"]))
            ratio, lo, hi = cell["ratio"], cell["ratio_low"], cell["ratio_high"]
            rows.append({**{k: cell[k] for k in ("model", "rows_bucket", "call_class", "calls_a", "calls_b",
                                                "timed_a", "timed_b", "ratio", "ratio_low", "ratio_high", "cuped",
                                                "mean_a_s", "mean_b_s", "ratio_low_stat", "ratio_high_stat",
                                                "clock_bound_s")},
                         "prediction": cell["prediction"].get("ratio"),
                         "truth": gt["ratio"] if gt else None,
                         "off": (ratio / gt["ratio"] - 1.0) if gt and ratio else None,
                         "inside": (lo <= gt["ratio"] <= hi) if gt and lo is not None else None,
                         "inside_stat": (cell["ratio_low_stat"] <= gt["ratio"] <= cell["ratio_high_stat"])
                         if gt and cell["ratio_low_stat"] is not None else None,
                         # each arm's mean reading against CUPTI's (ns): what the clock's bound must hold
                         "off_a_ns": _off_ns(cell["mean_a_s"], gt and gt["mean_a"]),
                         "off_b_ns": _off_ns(cell["mean_b_s"], gt and gt["mean_b"])})
        pooled_rows = []
        for b in view["buckets"]:
            gt = by_label.get(b["rows_bucket"])
            # the truth over the cells the bucket's band covers (those with two timed pairs), weighted as it weighs
            # them; the truth over all the bucket's cells beside it
            covered = [(c["calls_a"] + c["calls_b"], truth.get((c["model"], c["rows_bucket"], c["call_class"])))
                       for c in view["cells"] if c["rows_bucket"] == b["rows_bucket"] and c["kernel_a"] != c["kernel_b"]
                       and min(c["timed_a"], c["timed_b"]) >= 2]
            covered = [(w, t) for w, t in covered if t is not None]
            true = (sum(w * t["mean_b"] for w, t in covered) / sum(w * t["mean_a"] for w, t in covered)
                    if covered else None)
            pooled_rows.append({**b, "truth": true, "truth_all_cells": gt["ratio"] if gt else None,
                                "off": (b["ratio"] / true - 1.0) if true and b["ratio"] else None,
                                "inside": (b["ratio_low"] <= true <= b["ratio_high"])
                                if true and b["ratio_low"] is not None else None})
        result["experiments"][str(f)] = {"cells": rows, "buckets": pooled_rows,
                                         "crossover": view["crossover"]["rows"],
                                         "crossover_detail": view["crossover"],
                                         "clock_calibration": view["clock_calibration"],
                                         "saving": view["saving"], "state": view["state"],
                                         "stop_reason": view["stop_reason"], "wall_s": view["wall_s"],
                                         "clock_dropped": view["clock_dropped"], "never_moved": view["never_moved"]}
    return result


def experiment_command(
    calls: int = typer_option(60000, "prefill-entry calls of the demo's traffic per experiment run"),
    fractions: str = typer_option("0.01,0.05", "comma-separated fractions of eligible calls sent to B"),
    threshold: int = typer_option(256, "the candidate split_below_N's N (rows)"),
    max_rows: int = typer_option(1024, "calls with more rows are left out of the stream"),
    per_cell: int = typer_option(200, "calls per cell replayed under each arm for the ground truth"),
    tp_calls: int = typer_option(8000, "distinct calls of a throughput pass (repeated to fill it)"),
    tp_repeats: int = typer_option(8, "throughput passes per variant (interleaved; each at least 1.2 s)"),
    seed: int = typer_option(7, "the traffic's and the assignment's seed"),
    device: str = typer_option("", "cuda or cpu (default: cuda where torch sees one)"),
    clock: str = typer_option("gated", "GPU clock of the experiment's timed calls: gated or stamp"),
    keep_rows: int = typer_option(0, "with --thin: every call of this many rows or more is kept (a rows bucket edge)",
                                  "--keep-rows"),
    keep_below: int = typer_option(0, "with --thin: the kept calls have fewer rows than this (0: no upper edge)"),
    thin: int = typer_option(1, "keep one in this many calls outside --keep-rows..--keep-below, over more traffic "
                             "(1: none thinned)"),
    as_json: bool = typer_option(False, "print JSON", "--json"),
) -> None:
    """split_below_N experiments on the demo's traffic through the Dispatcher, against an interleaved replay."""
    import json

    import typer

    try:
        values = tuple(float(v) for v in fractions.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{fractions!r}: expected numbers like 0.01,0.05", param_hint="--fractions") from exc
    if device not in ("", "cpu", "cuda"):
        raise typer.BadParameter(f"{device!r}: cuda or cpu (or empty: cuda where torch sees one)", param_hint="--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter("cuda: no CUDA/ROCm device is visible to torch", param_hint="--device")
    if thin < 1:
        raise typer.BadParameter(f"{thin}: one in at least 1", param_hint="--thin")
    if thin > 1:
        from dispatcher.policy import Policy
        from telemetry.buckets import rows_edges

        edges = rows_edges(Policy().thresholds + (threshold,))
        for name, edge in (("--keep-rows", keep_rows), ("--keep-below", keep_below)):
            if edge and edge not in edges or name == "--keep-rows" and edge < 2:
                raise typer.BadParameter(f"{edge}: thinning keeps whole rows buckets, so {name} is one of their "
                                         f"edges ({', '.join(map(str, edges[1:12]))}, ...)", param_hint=name)
        if keep_below and keep_below <= keep_rows:
            raise typer.BadParameter(f"{keep_below}: must be above --keep-rows {keep_rows}", param_hint="--keep-below")
    for f in values:
        try:  # the same bounds as a start
            ExperimentConfig(id="check", candidate=f"split_below_{threshold}", fraction=f, clock=clock)
        except ValueError as exc:
            errors = getattr(exc, "errors", None)
            first = errors()[0] if callable(errors) else None
            text = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(exc)
            raise typer.BadParameter(text) from exc
    result = run(calls=calls, fractions=values, threshold=threshold, seed=seed, max_rows=max_rows, per_cell=per_cell,
                 tp_calls=tp_calls, tp_repeats=tp_repeats, device=device or None, clock=clock,
                 keep_rows=keep_rows, thin=thin, keep_below=keep_below or None,
                 progress=lambda text: typer.echo(f"bench experiment: {text}", err=True))
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        from .bench_render import render

        render(result)
