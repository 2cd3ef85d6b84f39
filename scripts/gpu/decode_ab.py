"""The Hopper split-K decode as one cooperative launch against its two launches (partials, then Triton's reduce).

On a GPU machine, from the repository root (``bash scripts/gpu/h200_check.sh split`` runs it):

    python3 scripts/gpu/decode_ab.py [--rows 1,2,4,8,16,32,66] [--repeats 200] [--rounds 3]

Both variants run the same plan (same split count, same partial kernel); per shape they take turns, ``rounds``
times, each timed by CUPTI's kernel time (first kernel start to last kernel end, the gap between two launches
included) under the sweep's protocol (L2 flushed, GPU held before each call: ``dispatcher.sweep.timing``), and by
the host's wall time of issuing 20 calls back to back. Prints one JSON object: per shape the medians of each,
and how the outputs differ (the two reduces sum the splits in different orders).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90  # noqa: E402
from dispatcher.sweep.grid import Layout  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402

SHAPES = ((Layout(512, 64), None), (Layout(512, 0), None), (Layout(512, 64), torch.float8_e4m3fn))


def variants(args) -> dict:
    """{"one_launch": ..., "two_launches": ...}: both recipes of the decode's default plan for ``args``, or {} where
    the one launch does not apply (one split a row, or a grid that is not resident at once)."""
    two = gluon_sm90.two_launch_recipe(args)
    if two is None:
        return {}
    return {"one_launch": gluon_sm90.split_reduce_recipe(args, gluon_sm90._decode_plan(args)), "two_launches": two}


def host_us(fn, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = (time.perf_counter_ns() - t0) / calls / 1e3
    torch.cuda.synchronize()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,66")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    from dispatcher.sweep.timing import KernelTimer

    dev = torch.device("cuda")
    timer = KernelTimer(dev)
    out = {"device": torch.cuda.get_device_name(), "shapes": []}
    for layout, kv in SHAPES:
        for rows in (int(r) for r in opts.rows.split(",")):
            sets = make_sets(rows, 2048, 16, layout, 8192, dtype=torch.bfloat16, device=dev, kv_dtype=kv)
            pick = variants(sets[0])
            if not pick:
                continue
            kernel = {name: [] for name in pick}
            host = {name: [] for name in pick}
            for _ in range(opts.rounds):
                for name, recipe in pick.items():
                    kernel[name].append(timer.time(recipe, sets, warmup=3, repeats=opts.repeats).median_us)
                    host[name].append(host_us(lambda: recipe(sets[0])))
            outs = {}
            for name, recipe in pick.items():
                a = sets[0]._replace(output=torch.full_like(sets[0].output, float("nan")))
                recipe(a)
                outs[name] = a.output.float()
            torch.cuda.synchronize()
            one, two = outs["one_launch"], outs["two_launches"]
            diff = (one - two).abs()
            out["shapes"].append({
                "layout": str(layout), "kv": str(kv or "bf16"), "rows": rows,
                "grid": list(gluon_sm90._decode_plan(sets[0]).grid),
                "kernel_us": {n: round(statistics.median(v), 2) for n, v in kernel.items()},
                "host_us": {n: round(statistics.median(v), 2) for n, v in host.items()},
                "identical_share": float((one == two).float().mean()), "max_abs_diff": float(diff.max()),
                "nan": bool(one.isnan().any() or two.isnan().any())})
            print(json.dumps(out["shapes"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
