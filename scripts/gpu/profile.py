r"""Launch the target shapes once each between cudaProfilerStart/Stop, for Nsight Compute to read.

Run under ncu on a GPU machine, from the repository root (``RUN_NCU=1 bash scripts/gpu/h200_run.sh`` does the
first form):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        python3 scripts/gpu/profile.py [triton|dispatcher|layouts|fp8]

bf16, H = 16, top-k 2048, 512+64 unless said. ``triton`` (the default): Triton's prefill at 16,384 rows, then
its split-K decode at 16 and at 2 rows. ``dispatcher``: the same shapes through the implementations the
dispatcher runs on this GPU (the Hopper Gluon kernels on an H200). ``layouts``: the dispatcher's prefill at
16,384 rows in 448+64, 512+0 and 512+64. ``fp8``: the dispatcher's prefill at 16,384 rows on a bf16 pool, then
on an e4m3fn pool with bf16 q and with fp16 q (what the in-stage conversion adds; docs/benchmarks.md,
"fp8 kv pools"). Each call is compiled and warmed outside the profiled range.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import triton_decode, triton_prefill  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from h200_run import preferred  # noqa: E402

V32 = Layout(512, 64)
BF16 = (torch.bfloat16, None)


def plan(mode: str) -> list[tuple[int, object, Layout, tuple]]:
    """(rows, launch, layout, (q dtype, kv dtype or None for q's)) for each call to profile, in order."""
    if mode == "triton":
        return [(16384, triton_prefill.launch, V32, BF16), (16, triton_decode.launch, V32, BF16),
                (2, triton_decode.launch, V32, BF16)]
    if mode == "dispatcher":
        return [(16384, preferred("prefill"), V32, BF16), (16, preferred("decode"), V32, BF16),
                (2, preferred("decode"), V32, BF16)]
    if mode == "layouts":
        return [(16384, preferred("prefill"), lay, BF16) for lay in (Layout(448, 64), Layout(512, 0), V32)]
    if mode == "fp8":
        return [(16384, preferred("prefill"), V32, dt) for dt in
                (BF16, (torch.bfloat16, torch.float8_e4m3fn), (torch.float16, torch.float8_e4m3fn))]
    raise SystemExit(f"unknown mode {mode!r}: triton, dispatcher, layouts or fp8")


def main(argv: list[str]) -> None:
    dev = torch.device("cuda")
    calls = []
    for rows, launch, layout, (q_dtype, kv_dtype) in plan(argv[0] if argv else "triton"):
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
    main(sys.argv[1:])
