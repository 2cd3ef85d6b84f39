"""Split-K sparse decode in plain torch: the top-k split into partials, then one reduce.

The same function as the ragged prefill (the contract of docs/kernels.md), computed the way a decode kernel does
it: each split keeps its own running max and sum; the reduce rescales and adds the sink. It stands in for
``intree.sparse_decode`` where no Triton kernel runs, and documents the algorithm.
"""

from __future__ import annotations

import math

import torch

from .common import KernelArgs
from .torch_ref import DEFAULT_WORKSPACE_BYTES, attend_rows, chunks, gather

DEFAULT_SPLIT = 256  # top-k slots per split


def sparse_decode(
    args: KernelArgs,
    *,
    split: int = DEFAULT_SPLIT,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
) -> None:
    """Write attention for every query row into ``args.output`` (in place), ``split`` slots a partial."""
    out, sink = args.output, args.attn_sink
    for rows, slots, valid in chunks(args, workspace_bytes):
        k = slots.shape[1]
        accs, ms, ls = [], [], []
        for s in range(max(1, math.ceil(k / split))):
            sl = slice(s * split, min(k, (s + 1) * split))
            acc, m, l = attend_rows(args.q[rows], gather(args, slots[:, sl]), valid[:, sl], args.scale, None,
                                    out.shape[2])
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
        res = torch.where((l_tot == 0)[..., None], torch.zeros_like(res), res)  # no valid slot: 0; NaN stays NaN
        out[rows] = res.to(out.dtype)
