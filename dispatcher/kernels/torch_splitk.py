"""Split-K sparse decode in plain torch: the top-k split into partials, then one reduce.

The same function as the ragged prefill, computed the way a decode kernel does it (each
split keeps its own running max and sum; the reduce rescales and adds the sink). It stands
in for ``intree.sparse_decode`` where no Triton kernel runs, and documents the algorithm.
"""

from __future__ import annotations

import math

import torch

from .common import KernelArgs, index_width, row_slots
from .torch_ref import DEFAULT_WORKSPACE_BYTES, attend_rows, chunk_rows

DEFAULT_SPLIT = 256  # top-k slots per split


def sparse_decode(
    args: KernelArgs,
    *,
    split: int = DEFAULT_SPLIT,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
) -> None:
    q, kv, out = args.q, args.kv, args.output
    rows, heads, head_dim = q.shape
    if rows == 0:
        return
    skv = kv.shape[0]
    lanes = out.shape[2]
    kv2 = kv.reshape(skv, head_dim)
    width = index_width(args.index)
    step = chunk_rows(width, head_dim, heads, workspace_bytes)
    sink = args.attn_sink
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        slots, valid = row_slots(args.index, r0, r1, skv)
        c, k = slots.shape
        nsplit = max(1, math.ceil(k / split))
        accs, ms, ls = [], [], []
        for s in range(nsplit):
            sl = slice(s * split, min(k, (s + 1) * split))
            gathered = kv2[slots[:, sl].reshape(-1)].reshape(c, -1, head_dim).float()
            acc, m, l = attend_rows(q[r0:r1], gathered, valid[:, sl], args.scale, None, lanes)
            accs.append(acc)
            ms.append(m)
            ls.append(l)
        m_all = torch.stack(ms)  # [S, C, H]
        big = m_all.amax(dim=0)
        if sink is not None:
            big = torch.maximum(big, sink.float()[None, :])
        big_safe = torch.where(torch.isfinite(big), big, torch.zeros_like(big))
        alpha = torch.exp(m_all - big_safe[None])  # exp(-inf) = 0 for empty splits
        alpha = torch.where(m_all == float("-inf"), torch.zeros_like(alpha), alpha)  # a NaN split stays NaN
        l_tot = (torch.stack(ls) * alpha).sum(dim=0)
        acc_tot = (torch.stack(accs) * alpha[..., None]).sum(dim=0)
        if sink is not None:
            l_tot = l_tot + torch.exp(sink.float()[None, :] - big_safe)
        res = acc_tot / l_tot.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
        res = torch.where((l_tot == 0)[..., None], torch.zeros_like(res), res)
        out[r0:r1] = res.to(out.dtype)
