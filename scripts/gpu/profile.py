"""Launch the target shapes once each between cudaProfilerStart/Stop, for Nsight Compute to read.

Run under ncu with --profile-from-start off (scripts/gpu/h200_run.sh does, with RUN_NCU=1): the
prefill at 16384 rows, then the split-K decode at 16 and at 2 rows (bf16, H=16, 512+64, top-k 2048).
With the argument ``layouts``: the prefill and the one-split decode at 16384 rows in 512+64 and in
512+0 instead (why the D=512 prefill is slower than the D=576 one, docs/benchmarks.md). With ``sm90``:
the Hopper Gluon kernels' prefill at 16384 rows and decode at 16 rows. With ``ws-layouts``: the
two warp-specialised prefills (session 4's gluon_sm90_ws_d512, then gluon_sm90_ws) at 16384 rows, 512+0 then 512+64.
With ``ws-prefill``: the registry's prefill at 512+64 (``gluon_sm90_ws``) alone, 16384 rows; the environment's
``RS_ABLATE`` (comma-separated ``gluon_sm90_ws_parts`` flags, e.g. ``NO_GATHER``) leaves parts out first, as
``ablate_probe.py`` does (give such a process its own ``TRITON_CACHE_DIR``). With ``ws-fp8`` (session 26):
``gluon_sm90_ws`` at 512+64, 16384 rows, on a bf16 pool, then on an e4m3fn pool with bf16 q and with fp16 q
(what the in-stage conversion adds to the shared-memory pipe).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import triton_decode, triton_prefill  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402


def main() -> None:
    dev = torch.device("cuda")
    calls = []
    plan = [(16384, triton_prefill.launch, Layout(512, 64)), (16, triton_decode.launch, Layout(512, 64)),
            (2, triton_decode.launch, Layout(512, 64))]
    if sys.argv[1:] == ["sm90"]:
        from dispatcher.kernels import gluon_sm90

        plan = [(16384, gluon_sm90.launch_prefill, Layout(512, 64)), (16, gluon_sm90.launch_decode, Layout(512, 64))]
    if sys.argv[1:] == ["ws-layouts"]:  # the two warp-specialised prefills, both layouts
        from dispatcher.kernels import gluon_sm90_ws, gluon_sm90_ws_d512

        plan = [(16384, launch, layout) for layout in (Layout(512, 0), Layout(512, 64))
                for launch in (gluon_sm90_ws_d512.launch_prefill_ws, gluon_sm90_ws.launch_prefill_ws)]
    if sys.argv[1:] == ["ws-prefill"]:  # the 512+64 prefill alone (session 16's source-level profile)
        from kernel_lab import ws_flags_on

        from dispatcher.kernels import gluon_sm90

        ws_flags_on(filter(None, os.environ.get("RS_ABLATE", "").split(",")))
        plan = [(16384, gluon_sm90.launch_prefill, Layout(512, 64))]
    dtypes = {}  # plan index: (q dtype, kv dtype) where not bf16 throughout
    if sys.argv[1:] == ["ws-fp8"]:
        from dispatcher.kernels import gluon_sm90_ws

        plan = [(16384, gluon_sm90_ws.launch_prefill_ws, Layout(512, 64))] * 3
        dtypes = {1: (torch.bfloat16, torch.float8_e4m3fn), 2: (torch.float16, torch.float8_e4m3fn)}
    if sys.argv[1:] == ["layouts"]:
        plan = [(16384, launch, layout) for layout in (Layout(512, 64), Layout(512, 0))
                for launch in (triton_prefill.launch, triton_decode.launch)]
    for i, (rows, launch, layout) in enumerate(plan):
        q_dtype, kv_dtype = dtypes.get(i, (torch.bfloat16, None))
        args = make_sets(rows, 2048, 16, layout, default_kv_len(rows, 2048), dtype=q_dtype, device=dev,
                         kv_dtype=kv_dtype)[0]
        for _ in range(2):  # compile and warm outside the profiled range
            launch(args)
        calls.append((launch, args))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for launch, args in calls:
        launch(args)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
