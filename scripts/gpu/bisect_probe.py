"""The warp-specialised prefill of an older tree, timed beside today's (S31-3, S31-4: what slowed the exact max).

Times ``gluon_sm90_ws.launch_prefill_ws`` of the ``dispatcher`` package in the current directory: 512+64, bf16,
H = 16, 16,384 rows, top-k 128 and 2048, the median of 20 CUDA event pairs, each after an L2 flush and a GPU hold
(at 0.6-5 ms a call the pair's own 3-4 µs is under 1%). With the inputs built here from plain torch, so any tree
whose launcher takes ``KernelArgs`` runs on the same operands; where the tree's launcher has ``redo``, both of its
paths are timed. Unpack each tree into an untracked folder of the repository root, so it travels to the device:

    git archive C dispatcher | (mkdir -p bisect/C && tar -x -C bisect/C)
    (cd bisect/C && OUT=$OUT python3 ../../scripts/gpu/bisect_probe.py C); OUT=$OUT python3 scripts/gpu/bisect_probe.py head

Prints one line a variant and writes $OUT/bisect_LABEL.json.
"""

import json
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from dispatcher.kernels import gluon_sm90_ws  # noqa: E402
from dispatcher.kernels.common import KernelArgs, SparseIndex  # noqa: E402

label, dev = sys.argv[1], torch.device("cuda")
flush = torch.empty(64 << 20, dtype=torch.int32, device=dev)
g = torch.Generator(device=dev).manual_seed(0)
out = []
variants = [("default", {})]
if "redo" in gluon_sm90_ws.launch_prefill_ws.__code__.co_varnames:
    variants = [("reference", {"redo": True}), ("exact", {"redo": False})]
for topk in (128, 2048):
    rows, kv_len, d = 16384, 16384, 576
    q = torch.randn((rows, 16, d), device=dev, generator=g).to(torch.bfloat16)
    kv = torch.randn((kv_len, 1, d), device=dev, generator=g).to(torch.bfloat16)
    idx = torch.empty((rows, topk), dtype=torch.int32, device=dev)
    for r0 in range(0, rows, 4096):
        idx[r0:r0 + 4096] = torch.rand((4096, kv_len), device=dev, generator=g).topk(topk, dim=1).indices.int()
    o = torch.empty((rows, 16, 512), device=dev, dtype=torch.bfloat16)
    a = KernelArgs(q, kv, SparseIndex(idx, None), 1 / math.sqrt(d), None, o)
    for name, kw in variants:
        for _ in range(3):
            gluon_sm90_ws.launch_prefill_ws(a, **kw)
        torch.cuda.synchronize()
        ts = []
        for _ in range(20):
            flush.zero_()
            torch.cuda._sleep(2_000_000)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            gluon_sm90_ws.launch_prefill_ws(a, **kw)
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1000)
        med = statistics.median(ts)
        digest = float(o.double().abs().sum())
        print(f"{label:10} {name:9} top-k {topk:5}: {med:8.1f} us (min {min(ts):.1f}, max {max(ts):.1f}) "
              f"|out| {digest:.6e}", flush=True)
        out.append(dict(label=label, variant=name, topk=topk, median_us=med, min_us=min(ts), abs_sum=digest))
with open(os.path.join(os.environ["OUT"], f"bisect_{label}.json"), "w") as f:
    json.dump(out, f, indent=1)
