"""Where the Hopper kernels' time goes, read from the production kernels by changing only their inputs.

Each target shape is timed (the sweep's GpuTimer: L2 flush and GPU hold before every call) with
four index patterns that leave the kernel untouched but move the bottleneck:

- ``random``: the benchmark's inputs (distinct random slots per row, a pool as large as the prompt);
- ``invalid``: every index -1, so each cp.async copies nothing and zero-fills shared memory: the
  products, the softmax and the hand-overs run as usual with no L2 or HBM traffic;
- ``hot64``: every tile reads the same 64 kv rows: the gathers hit in L2 at its best rate;
- ``shared``: every row reads slots 0..top-k-1 in order: contiguous rows, one 2.4 MB working set.

Differences between them place the time (gather-bound, product-bound, or neither). The split-K
decode is also timed as its two launches apart (the partial pass alone, the reduce alone) and
against an empty kernel, the launch floor. Writes $OUT/ws_probe.json.

    python3 scripts/gpu/ws_probe.py [--repeats N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, triton_decode  # noqa: E402
from dispatcher.kernels.triton_prefill import pack  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import GpuTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")


@triton.jit
def _empty(x_ptr):
    if tl.program_id(0) == -1:
        tl.store(x_ptr, 0)


def patterned(sets, pattern: str):
    """The same calls with the index pattern replaced (the kernel and every other input unchanged)."""
    if pattern == "random":
        return sets
    out = []
    for a in sets:
        idx = a.index.indices
        rows, width = idx.shape
        pos = torch.arange(width, device=DEV, dtype=torch.int32)
        if pattern == "invalid":
            new = torch.full_like(idx, -1)
        elif pattern == "hot64":
            new = (pos % 64).expand(rows, width).contiguous()
        else:  # shared
            new = (pos % a.kv.shape[0]).expand(rows, width).contiguous()
        out.append(a._replace(index=a.index._replace(indices=new)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=60)
    opt = ap.parse_args()
    out, log = lab_output()
    rec: list[dict] = []

    def timed(group: str, name: str, fn, sets, reps: int) -> None:
        fn(sets[0])
        torch.cuda.synchronize()
        t = GpuTimer(DEV).time(fn, sets, warmup=3, repeats=reps)
        rec.append(dict(group=group, name=name, median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us))
        log(f"{group:24} {name:34} {t.median_us:9.1f} us (p20 {t.p20_us:.1f}, p80 {t.p80_us:.1f})")

    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    warm_clocks(DEV, 2.0)
    x = torch.zeros(1, device=DEV)
    timed("floor", "empty kernel", lambda a: _empty[(1,)](x), [None], opt.repeats)
    timed("floor", "empty kernel, 132 programs", lambda a: _empty[(132,)](x), [None], opt.repeats)

    for rows, lay in ((16384, Layout(512, 64)), (16384, Layout(512, 0)), (2, Layout(512, 64)),
                      (16, Layout(512, 64))):
        sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
        kernel = "prefill" if rows > 1024 else "decode"
        fn = gluon_sm90.launch_prefill if kernel == "prefill" else gluon_sm90.launch_decode
        reps = 12 if rows > 1024 else opt.repeats
        group = f"{kernel} {rows} {lay.nope}+{lay.rope}"
        for pattern in ("random", "invalid", "hot64", "shared"):
            timed(group, pattern, fn, patterned(sets, pattern), reps)
        if kernel == "decode":  # the two launches apart
            a = sets[0]
            p = pack(a)
            splits = triton_decode.choose_splits(rows, 1, p.width, 64, triton_decode.sm_count(DEV),
                                                 per_sm=gluon_sm90.DECODE_PER_SM[2])
            po = torch.empty((rows, splits, 16, p.lanes), dtype=gluon_sm90.partial_dtype(a.q.dtype), device=DEV)
            pl = torch.empty((rows, splits, 16), dtype=torch.float32, device=DEV)
            timed(group, f"partials only ({splits} splits)",
                  lambda b: gluon_sm90.launch_partials(b, po, pl, splits, config=gluon_sm90.DECODE_SM90, pdl=False),
                  sets, opt.repeats)
            timed(group, "reduce only", lambda b: triton_decode.reduce_partials(po, pl, p, a.output, splits, False),
                  sets, opt.repeats)
        del sets
        torch.cuda.empty_cache()
    save_results(out, "ws_probe", results=rec)
    log("done")


if __name__ == "__main__":
    main()
