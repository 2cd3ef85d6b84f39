"""The Hopper prefill computing its flagged items again in its own kernel, against Triton's redo launch after it.

On a GPU machine, from the repository root (``bash scripts/gpu/h200_check.sh redo-ab`` runs it):

    python3 scripts/gpu/prefill_redo_ab.py [--rows 2,16,132,1024,16384] [--rounds 3]

Both variants are the default prefill recipe of a call whose prefill keeps a reference max (top-k 2048), with
``gluon_sm90_ws.redo_in_kernel`` forced each way. Per row count they take turns, ``rounds`` times, each timed by
CUPTI's kernel time under the sweep's protocol (``dispatcher.sweep.timing``) and, under 1,000 rows, by the
host's wall time of issuing 20 calls. Then the redo itself: rows 3 and 7 of a 64-row call score far above
their reference in head 0 (as ``test_triton_gpu``'s redo test builds them), so their items are flagged and
computed again; per layout and dtype (and an e4m3 pool), each variant's worst relative error against the torch
reference, the rows bit-identical between the two, and the flags left set after the call. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90_ws  # noqa: E402
from dispatcher.kernels.plan import forget  # noqa: E402
from dispatcher.sweep.grid import Layout  # noqa: E402


@contextmanager
def redo_here(on: bool):
    """``gluon_sm90_ws.redo_in_kernel`` answering ``on`` for every call, and plans made afresh."""
    keep = gluon_sm90_ws.redo_in_kernel
    gluon_sm90_ws.redo_in_kernel = lambda args: on
    forget()
    try:
        yield
    finally:
        gluon_sm90_ws.redo_in_kernel = keep
        forget()


def variants(args) -> dict:
    """{"redo_in_kernel": ..., "redo_launch": ...}: the default prefill recipe of ``args`` each way, or {} where its
    prefill keeps the exact max (no flags, nothing to compute again)."""
    if not gluon_sm90_ws.prefill_reference(args):
        return {}
    out = {}
    for name, on in (("redo_in_kernel", True), ("redo_launch", False)):
        with redo_here(on):
            out[name] = gluon_sm90_ws.prefill_recipe(args)
    return out


def flagged_call(layout: Layout, dtype: torch.dtype, kv_dtype: torch.dtype | None, device: torch.device):
    """64 rows at top-k 2048 whose rows 3 and 7 hold 64 kv rows of c x q (head 0) in tile 16: flagged items."""
    from dispatcher.sweep.correctness import build

    a = build(64, layout=layout, dtype=dtype, device=device, kv_len=8192, pad=False, bad_slots=False)
    c = 6.0 if dtype == torch.bfloat16 else 1.0  # past what P holds in either dtype
    idx, extra = a.index.indices.clone(), []
    for k, r in enumerate((3, 7)):
        idx[r, 1024:1088] = 8192 + 64 * k + torch.arange(64, device=device, dtype=idx.dtype)
        extra.append((c * a.q[r, 0].float()).to(dtype).expand(64, 1, -1))
    kv = torch.cat([a.kv] + extra)
    return a._replace(kv=kv.to(kv_dtype) if kv_dtype else kv, index=a.index._replace(indices=idx))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="2,16,132,1024,16384")
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    from dispatcher.kernels.scratch import scratch
    from dispatcher.kernels.torch_ref import ragged_prefill
    from dispatcher.sweep.inputs import make_sets
    from dispatcher.sweep.timing import KernelTimer

    dev = torch.device("cuda")
    timer = KernelTimer(dev)
    out = {"device": torch.cuda.get_device_name(), "timing": [], "redo": []}
    for rows in (int(r) for r in opts.rows.split(",")):
        sets = make_sets(rows, 2048, 16, Layout(512, 64), max(8192, rows), dtype=torch.bfloat16, device=dev)
        pick = variants(sets[0])
        kernel = {name: [] for name in pick}
        host = {name: [] for name in pick}
        for _ in range(opts.rounds):
            for name, recipe in pick.items():
                kernel[name].append(timer.time(recipe, sets, warmup=2, repeats=20 if rows > 1000 else 100).median_us)
                if rows < 1000:
                    for _ in range(3):
                        recipe(sets[0])
                    torch.cuda.synchronize()
                    t0 = time.perf_counter_ns()
                    for _ in range(20):
                        recipe(sets[0])
                    host[name].append((time.perf_counter_ns() - t0) / 20e3)
                    torch.cuda.synchronize()
        row = {"rows": rows, **{f"kernel_us_{n}": round(statistics.median(v), 2) for n, v in kernel.items()}}
        row.update({f"host_us_{n}": round(statistics.median(v), 2) for n, v in host.items() if v})
        out["timing"].append(row)
        print(json.dumps(out["timing"][-1]), file=sys.stderr, flush=True)
    stream = torch.cuda.current_stream().cuda_stream
    for layout, dtype, kv in ((Layout(512, 64), torch.bfloat16, None), (Layout(512, 64), torch.float16, None),
                              (Layout(512, 0), torch.bfloat16, None), (Layout(512, 64), torch.bfloat16,
                                                                      torch.float8_e4m3fn)):
        a = flagged_call(layout, dtype, kv, dev)
        ref = a._replace(output=torch.empty(a.output.shape, dtype=torch.float32, device=dev))
        ragged_prefill(ref)
        got, row = {}, {"layout": str(layout), "dtype": str(dtype), "kv": str(kv or dtype)}
        for name, recipe in variants(a).items():
            o = a._replace(output=torch.full_like(a.output, float("nan")))
            recipe(o)
            torch.cuda.synchronize()
            got[name] = o.output.float()
            err = [((got[name][r] - ref.output[r]).norm() / ref.output[r].norm().clamp_min(1e-6)).item()
                   for r in range(64)]
            flags = scratch().get("redo_flags", 1, torch.int32, dev, stream, zeroed=True)
            row[name] = {"max_rel_err": max(err), "finite": bool(torch.isfinite(got[name]).all()),
                         "flags_left": int(flags.abs().sum())}
        row["identical_rows"] = sum(torch.equal(got["redo_in_kernel"][r], got["redo_launch"][r]) for r in range(64))
        out["redo"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
