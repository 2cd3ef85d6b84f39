"""One GPU session's worth of work: check the Triton kernels, pick tile configs, time the targets, run the sweep.

Writes everything under OUT (default ./out/gpu) and prints a short table last. Usage:
    python scripts/gpu/h200_run.py [--skip-check] [--skip-search] [--skip-sweep] [--sweep-repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import triton_decode, triton_prefill  # noqa: E402
from dispatcher.kernels.torch_ref import ragged_prefill as torch_ref  # noqa: E402
from dispatcher.kernels.triton_prefill import TileConfig  # noqa: E402
from dispatcher.sweep.correctness import run_checks  # noqa: E402
from dispatcher.sweep.grid import GPU_KERNELS, GPU_ROWS, GPU_TOPK, Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import GpuTimer  # noqa: E402

DEV = torch.device("cuda")
V32 = Layout(512, 64)
# Runs 1-2 (docs/benchmarks.md) tried heads-as-M and slots-as-M tiles, 4 and 8 warps, register caps:
# (64, 4, 2) won the prefill and (32, 4, 2) the decode. Run 3 adds 8 and 16 warps under a 128-register cap.
# Session 2 cut the head block into independent MMA chains (TileConfig.chunks); scripts/gpu/kernel_lab.py
# searched those, so the candidates here are its winners and their neighbours.
PREFILL_CANDIDATES = [TileConfig(64, 4, 2, 4), TileConfig(64, 4, 2, 2), TileConfig(64, 4, 2, 1)]
DECODE_CANDIDATES = [TileConfig(32, 4, 2, 4), TileConfig(32, 4, 2, 1)]
PER_SM = (2, 4)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def preferred(kernel: str):
    """The launch the dispatcher uses on this GPU (the registry's first: gluon on Hopper, handing over to triton)."""
    from dispatcher.kernels.registry import default_registry
    from dispatcher.types import Kernel

    name = Kernel.INTREE_RAGGED_PREFILL if kernel == "prefill" else Kernel.INTREE_SPARSE_DECODE
    return default_registry().resolve(name, "cuda").launch


def phase_check(out: Path) -> list[dict]:
    found = run_checks({"prefill": preferred("prefill"), "decode": preferred("decode")},
                       (torch.bfloat16, torch.float16), DEV, big=True)
    rows = [{**c._asdict(), "ok": c.ok} for c in found]
    (out / "correctness.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        log(f"check {'ok  ' if r['ok'] else 'FAIL'} {r['dtype']:8} {r['kernel']:7} rel {r['rel_err']:.2e} "
            f"(bound {r['bound']:.0e}) {r['case']}")
    return rows


def time_call(timer: GpuTimer, fn, rows: int, topk: int = 2048, layout: Layout = V32, repeats: int = 30) -> float:
    sets = make_sets(rows, topk, 16, layout, default_kv_len(rows, topk), dtype=torch.bfloat16, device=DEV)
    t = timer.time(fn, sets, warmup=3, repeats=repeats)
    return t.median_us


def phase_search(timer: GpuTimer, out: Path) -> dict:
    res: dict = {"prefill": [], "decode": []}
    for cfg in PREFILL_CANDIDATES:
        try:
            us = time_call(timer, lambda a, c=cfg: triton_prefill.launch(a, config=c), 16384, repeats=10)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is just skipped
            log(f"prefill {cfg} failed: {exc.__class__.__name__}: {str(exc)[:200]}")
            continue
        res["prefill"].append({"config": list(cfg), "rows": 16384, "median_us": us})
        log(f"prefill {cfg}: {us:.0f} us at 16384 rows")
    for cfg in DECODE_CANDIDATES:
        for per_sm in PER_SM:
            def fn(a, c=cfg, p=per_sm):
                sms = triton_decode.sm_count(a.q.device)
                s = triton_decode.choose_splits(a.q.shape[0], 1, a.index.indices.shape[1], c.block_n, sms, p)
                triton_decode.launch(a, config=c, splits=s)
            try:
                t2, t16 = time_call(timer, fn, 2), time_call(timer, fn, 16)
            except Exception as exc:  # noqa: BLE001
                log(f"decode {cfg} failed: {exc.__class__.__name__}: {str(exc)[:200]}")
                break
            res["decode"].append({"config": list(cfg), "per_sm": per_sm, "us_2": t2, "us_16": t16})
            log(f"decode {cfg} per_sm={per_sm}: {t2:.1f} us at 2 rows, {t16:.1f} us at 16 rows")
    if res["prefill"]:
        best = min(res["prefill"], key=lambda r: r["median_us"])
        triton_prefill.PREFILL_CONFIG = TileConfig(*best["config"])
    if res["decode"]:
        best = min(res["decode"], key=lambda r: r["us_2"] + r["us_16"])
        triton_decode.DECODE_CONFIG = TileConfig(*best["config"])
        triton_decode.PROGRAMS_PER_SM = best["per_sm"]
    res["chosen"] = chosen()
    (out / "search.json").write_text(json.dumps(res, indent=1))
    log(f"chosen: {res['chosen']}")
    return res


def chosen() -> dict:
    from dispatcher.kernels import gluon_sm90

    return {"prefill": list(triton_prefill.PREFILL_CONFIG), "decode": list(triton_decode.DECODE_CONFIG),
            "per_sm": triton_decode.PROGRAMS_PER_SM, "reduce_values": triton_decode.REDUCE_VALUES,
            "max_splits": triton_decode.MAX_SPLITS, "sm90_prefill": list(gluon_sm90.PREFILL_SM90),
            "sm90_decode": list(gluon_sm90.DECODE_SM90), "sm90_decode_d512": list(gluon_sm90.DECODE_SM90_D512),
            "sm90_per_sm": gluon_sm90.DECODE_PER_SM}


def phase_reduce_search(timer: GpuTimer, out: Path) -> list[dict]:
    """Run 4: the decode's reduce program size and split cap, at 1, 2 and 16 rows (tile configs fixed)."""
    found = []
    for values in (4096, 2048, 1024):
        for max_splits in (64, 32):
            def fn(a, v=values, ms=max_splits):
                s = triton_decode.choose_splits(a.q.shape[0], 1, a.index.indices.shape[1],
                                                triton_decode.DECODE_CONFIG.block_n, triton_decode.sm_count(DEV),
                                                max_splits=ms)
                triton_decode.launch(a, splits=s, reduce_values=v)
            t = {r: time_call(timer, fn, r, repeats=100) for r in (1, 2, 16)}
            found.append({"reduce_values": values, "max_splits": max_splits, **{f"us_{r}": v for r, v in t.items()}})
            log(f"decode reduce_values={values} max_splits={max_splits}: "
                + ", ".join(f"{v:.1f} us at {r} rows" for r, v in t.items()))
    best = min(found, key=lambda r: r["us_2"] + r["us_16"])
    triton_decode.REDUCE_VALUES, triton_decode.MAX_SPLITS = best["reduce_values"], best["max_splits"]
    (out / "search.json").write_text(json.dumps({"reduce": found, "chosen": chosen()}, indent=1))
    log(f"chosen: {chosen()}")
    return found


def phase_targets(timer: GpuTimer, out: Path) -> dict:
    """The issue's target shapes with the preferred kernels, and Triton's beside them (same run, same inputs)."""
    pre, dec = preferred("prefill"), preferred("decode")
    graphs = GpuTimer(DEV, graphs=True)
    t = {
        "decode_us_2": time_call(timer, dec, 2, repeats=100),
        "decode_us_16": time_call(timer, dec, 16, repeats=100),
        "decode_graph_us_2": time_call(graphs, dec, 2, repeats=100),
        "decode_graph_us_16": time_call(graphs, dec, 16, repeats=100),
        "prefill_us_2": time_call(timer, pre, 2, repeats=100),
        "prefill_us_16": time_call(timer, pre, 16, repeats=100),
        "prefill_us_16384": time_call(timer, pre, 16384, repeats=30),
        "prefill_512+0_us_16384": time_call(timer, pre, 16384, layout=Layout(512, 0), repeats=30),
        "decode_us_16384": time_call(timer, dec, 16384, repeats=30),
        "triton_decode_us_2": time_call(timer, triton_decode.launch, 2, repeats=100),
        "triton_decode_us_16": time_call(timer, triton_decode.launch, 16, repeats=100),
        "triton_prefill_us_16384": time_call(timer, triton_prefill.launch, 16384, repeats=30),
        "torch_ref_us_2": time_call(timer, torch_ref, 2, repeats=10),
        "torch_ref_us_16384": time_call(timer, torch_ref, 16384, repeats=3),
    }
    (out / "targets.json").write_text(json.dumps(t, indent=1))
    return t


def phase_sweep(out: Path, repeats: int) -> dict:
    from rich.console import Console

    from dispatcher.sweep.cli import replay_command
    from dispatcher.sweep.grid import parse_kernels, parse_layouts
    from dispatcher.sweep.report import device_name, document, print_tables, write_all
    from dispatcher.sweep.runner import SweepPlan, run_sweep
    from dispatcher.types import Kernel

    plan = SweepPlan(kernels=(), rows=GPU_ROWS, topk=GPU_TOPK, layouts=parse_layouts("512+64,512+0"), device=DEV,
                     repeats=repeats)
    known = {k: [i.impl for i in plan.registry.impls(k)] for k in Kernel}
    plan.kernels = parse_kernels(",".join(GPU_KERNELS), known)
    n = [0]

    def step(what: str) -> None:
        n[0] += 1
        if n[0] % 12 == 0:
            log(f"sweep {n[0]}/{plan.points * 2}: {what}")

    results = run_sweep(plan, on_step=step)
    labels = list(dict.fromkeys(r.label for r in results))
    doc = document(results, a=labels[0], b=labels[1], layouts=[str(x) for x in plan.layouts],
                   device=device_name(DEV), command=replay_command(plan, Path("out/sweep")))
    doc["configs"] = chosen()
    write_all(out, results, doc)
    print_tables(Console(width=140), results, doc)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--check-new-only", action="store_true", help="skip the checks if the search kept the defaults")
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument("--reduce-search", action="store_true", help="search the decode reduce only (run 4)")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--sweep-repeats", type=int, default=30)
    opt = ap.parse_args()
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    log(f"{torch.cuda.get_device_name(DEV)}, torch {torch.__version__}, "
        f"triton {triton.__version__}, {triton_decode.sm_count(DEV)} SMs")
    summary: dict = {}
    timer = GpuTimer(DEV)
    defaults = chosen()
    if opt.reduce_search:
        phase_reduce_search(timer, out)
    elif not opt.skip_search:  # first, so the checks below run the configs that will be timed
        phase_search(timer, out)
    if opt.check_new_only and chosen() == defaults:
        summary["checks"] = f"skipped: the search kept the defaults {defaults}, checked in an earlier run"
    elif not opt.skip_check:
        checks = phase_check(out)
        summary["checks"] = f"{sum(c['ok'] for c in checks)}/{len(checks)} ok with {chosen()}, worst rel " \
                            f"{max(c['rel_err'] for c in checks):.2e}"
    targets = phase_targets(timer, out)
    doc = None if opt.skip_sweep else phase_sweep(out, opt.sweep_repeats)
    print("\n==== summary ====")
    for k, v in summary.items():
        print(f"{k}: {v}")
    print(f"configs: {chosen()}")
    for k, v in targets.items():
        print(f"{k:20} {v:12.1f} us")
    if doc:
        print("gate:", doc["recommendation"]["reason"])
        for c in doc["crossover"]:
            print(f"crossover {c['layout']} top-k {c['topk']}: {c['rows']} (est {c['estimate']})")


if __name__ == "__main__":
    main()
