"""The GPU runner: check the kernels at full shapes, optionally search Triton's tile configs, time the targets, sweep.

On a GPU machine, from the repository root (``bash scripts/gpu/h200_run.sh`` installs the carried wheels first):

    OUT=out/gpu python3 scripts/gpu/h200_run.py [--skip-check] [--skip-search] [--skip-sweep] [--sweep-repeats N]

Writes ``correctness.json`` (every correctness case, bf16 and fp16, through the kernels the dispatcher runs),
``search.json`` (Triton's tile configs timed; the fastest kept for the rest of the run), ``targets.json`` (the
target shapes by the event pair, with Triton's kernels and the torch reference beside them) and the event-pair
sweep over the default grid in all three layouts (``sweep.{json,csv,md,png}``) under OUT, and prints a summary.
docs/benchmarks.md says what each figure means.
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
SWEEP_LAYOUTS = "448+64,512+0,512+64"
# The chosen Triton configs and their nearest neighbours (block_n, warps, stages, MMA chains);
# docs/kernels.md, "Triton kernel design figures".
PREFILL_CANDIDATES = [TileConfig(64, 4, 2, 4), TileConfig(64, 4, 2, 2), TileConfig(64, 4, 2, 1)]
DECODE_CANDIDATES = [TileConfig(64, 4, 2, 4), TileConfig(32, 4, 2, 4), TileConfig(32, 4, 2, 1)]
PER_SM = (2, 4)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def preferred(kernel: str):
    """The launch the dispatcher uses on this GPU (the registry's first: gluon on Hopper, handing over to triton)."""
    from dispatcher.kernels.registry import default_registry
    from dispatcher.types import Kernel

    name = Kernel.INTREE_RAGGED_PREFILL if kernel == "prefill" else Kernel.INTREE_SPARSE_DECODE
    return default_registry().resolve(name, "cuda").launch


def chosen() -> dict:
    """Triton's tile configs as this run uses them (the search may change them)."""
    return {"prefill": list(triton_prefill.PREFILL_CONFIG), "decode": list(triton_decode.DECODE_CONFIG),
            "per_sm": triton_decode.PROGRAMS_PER_SM}


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
    return timer.time(fn, sets, warmup=3, repeats=repeats).median_us


def phase_search(timer: GpuTimer, out: Path) -> dict:
    """Time Triton's candidate configs, keep the fastest for the rest of the run (not written back to the code)."""
    res: dict = {"prefill": [], "decode": []}
    for cfg in PREFILL_CANDIDATES:
        us = time_call(timer, lambda a, c=cfg: triton_prefill.launch(a, config=c), 16384, repeats=10)
        res["prefill"].append({"config": list(cfg), "rows": 16384, "median_us": us})
        log(f"prefill {cfg}: {us:.0f} us at 16384 rows")
    for cfg in DECODE_CANDIDATES:
        for per_sm in PER_SM:
            def fn(a, c=cfg, p=per_sm):
                sms = triton_decode.sm_count(a.q.device)
                s = triton_decode.choose_splits(a.q.shape[0], 1, a.index.indices.shape[1], c.block_n, sms, p)
                triton_decode.launch(a, config=c, splits=s)
            t2, t16 = time_call(timer, fn, 2), time_call(timer, fn, 16)
            res["decode"].append({"config": list(cfg), "per_sm": per_sm, "us_2": t2, "us_16": t16})
            log(f"decode {cfg} per_sm={per_sm}: {t2:.1f} us at 2 rows, {t16:.1f} us at 16 rows")
    triton_prefill.PREFILL_CONFIG = TileConfig(*min(res["prefill"], key=lambda r: r["median_us"])["config"])
    best = min(res["decode"], key=lambda r: r["us_2"] + r["us_16"])
    triton_decode.DECODE_CONFIG, triton_decode.PROGRAMS_PER_SM = TileConfig(*best["config"]), best["per_sm"]
    res["chosen"] = chosen()
    (out / "search.json").write_text(json.dumps(res, indent=1))
    log(f"chosen: {res['chosen']}")
    return res


def phase_targets(timer: GpuTimer, out: Path) -> dict:
    """The target shapes with the preferred kernels, and Triton's beside them (same run, same inputs)."""
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
        "prefill_448+64_us_16384": time_call(timer, pre, 16384, layout=Layout(448, 64), repeats=30),
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
    """The default grid by the event pair, as `routescope sweep` runs it (the JSON records the command)."""
    from rich.console import Console

    from dispatcher.sweep.cli import replay_command
    from dispatcher.sweep.grid import parse_kernels, parse_layouts
    from dispatcher.sweep.report import device_name, document, print_tables, write_all
    from dispatcher.sweep.runner import SweepPlan, run_sweep
    from dispatcher.types import Kernel

    plan = SweepPlan(kernels=(), rows=GPU_ROWS, topk=GPU_TOPK, layouts=parse_layouts(SWEEP_LAYOUTS), device=DEV,
                     repeats=repeats)
    known = {k: [i.impl for i in plan.registry.impls(k)] for k in Kernel}
    plan.kernels = parse_kernels(",".join(GPU_KERNELS), known)
    results = run_sweep(plan)
    labels = list(dict.fromkeys(r.label for r in results))
    doc = document(results, a=labels[0], b=labels[1], layouts=[str(x) for x in plan.layouts],
                   device=device_name(DEV), command=replay_command(plan, Path("out/sweep")))
    doc["configs"] = chosen()
    write_all(out, results, doc)
    print_tables(Console(width=140), results, doc)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-search", action="store_true", help="keep Triton's committed tile configs")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--sweep-repeats", type=int, default=30)
    opt = ap.parse_args()
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    log(f"{torch.cuda.get_device_name(DEV)}, torch {torch.__version__}, "
        f"triton {triton.__version__}, {triton_decode.sm_count(DEV)} SMs")
    timer = GpuTimer(DEV)
    if not opt.skip_search:  # first, so the checks below run the configs that will be timed
        phase_search(timer, out)
    checks = None if opt.skip_check else phase_check(out)
    targets = phase_targets(timer, out)
    doc = None if opt.skip_sweep else phase_sweep(out, opt.sweep_repeats)
    print("\n==== summary ====")
    if checks:
        print(f"checks: {sum(c['ok'] for c in checks)}/{len(checks)} ok, "
              f"worst rel {max(c['rel_err'] for c in checks):.2e}")
    print(f"triton configs: {chosen()}")
    for k, v in targets.items():
        print(f"{k:24} {v:12.1f} us")
    if doc:
        print("gate:", doc["recommendation"]["reason"])


if __name__ == "__main__":
    main()
