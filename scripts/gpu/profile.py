"""Launch the target shapes once each between cudaProfilerStart/Stop, for Nsight Compute to read.

Run under ncu with --profile-from-start off (scripts/gpu/h200_run.sh does, with RUN_NCU=1): the
prefill at 16384 rows, then the split-K decode at 16 and at 2 rows (bf16, H=16, 512+64, top-k 2048).
"""

from __future__ import annotations

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
    for rows, launch in ((16384, triton_prefill.launch), (16, triton_decode.launch), (2, triton_decode.launch)):
        args = make_sets(rows, 2048, 16, Layout(512, 64), default_kv_len(rows, 2048), dtype=torch.bfloat16,
                         device=dev)[0]
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
