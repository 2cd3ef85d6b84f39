"""Compile every kernel a default `routescope sweep` launches, in parallel processes, into Triton's cache first.

A sweep compiles each (layout, top-k, rows class) variant of both in-tree kernels one after the other, in its
one process; on a fresh machine that can cost more than the timing. Here ``--procs`` processes each launch
one call of both kernels at their share of the grid (the sweep's defaults: ``dispatcher.sweep.grid``), so the
sweep then loads every kernel from the cache (``TRITON_CACHE_DIR``). On a GPU machine, from the repository root:

    python3 scripts/gpu/warm.py [--procs 12]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def jobs() -> list[tuple[str, int, int]]:
    from dispatcher.sweep.grid import DEFAULT_LAYOUTS, GPU_ROWS, GPU_TOPK

    return [(lay, k, r) for lay in DEFAULT_LAYOUTS for k in GPU_TOPK for r in GPU_ROWS]


def child(index: int, procs: int) -> None:
    import torch

    from dispatcher.kernels.registry import default_registry
    from dispatcher.sweep.grid import parse_layouts, pool_slots
    from dispatcher.sweep.inputs import make_pool, make_sets
    from dispatcher.types import Kernel

    device = torch.device("cuda")
    registry = default_registry()
    impls = [registry.resolve(k, "cuda") for k in (Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE)]
    pools = {}
    for lay, topk, rows in jobs()[index::procs]:
        layout = parse_layouts(lay)[0]
        pool = pools.get(lay)
        if pool is None:
            pool = pools[lay] = make_pool(pool_slots(8 << 20, layout, 2), layout.head_dim, dtype=torch.bfloat16,
                                          device=device)
        args = make_sets(rows, topk, 16, layout, pool.shape[0], dtype=torch.bfloat16, device=device, pool=pool)[0]
        for impl in impls:
            impl.launch(args)
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=12)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child is not None:
        child(opts.child, opts.procs)
        return
    t0 = time.perf_counter()
    running = [subprocess.Popen([sys.executable, __file__, "--procs", str(opts.procs), "--child", str(i)])
               for i in range(opts.procs)]
    codes = [p.wait() for p in running]
    print(f"warm: {len(jobs())} points in {opts.procs} processes, {time.perf_counter() - t0:.1f} s, exit codes {codes}")
    if any(codes):
        sys.exit(1)


if __name__ == "__main__":
    main()
