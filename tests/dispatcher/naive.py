"""An independent, deliberately slow reference: one query row and one head at a time, in float64.

Written from the math contract of docs/kernels.md, not from the implementation: it shares no code with it.
"""

from __future__ import annotations

import math

import torch


def naive_sparse_mla(q, kv, indices, topk_length, scale, attn_sink, lanes, ragged_indices=None, ragged_indptr=None):
    sq, heads, _ = q.shape
    skv = kv.shape[0]
    out = torch.zeros(sq, heads, lanes, dtype=torch.float64)
    qd = q.double()
    kvd = kv[:, 0, :].double()
    for i in range(sq):
        if ragged_indptr is not None:
            a, b = int(ragged_indptr[i]), int(ragged_indptr[i + 1])
            row = [int(s) for s in ragged_indices[a:b]]
        else:
            row = [int(s) for s in indices[i]]
        if topk_length is not None:
            length = int(topk_length[i])
        elif ragged_indptr is not None:
            length = len(row)
        else:
            length = sum(1 for s in row if s >= 0)
        slots = [s for j, s in enumerate(row) if j < length and 0 <= s < skv]
        for h in range(heads):
            scores = [scale * float(qd[i, h] @ kvd[s]) for s in slots]
            m = max(scores) if scores else -math.inf
            if attn_sink is not None:
                m = max(m, float(attn_sink[h]))
            if m == -math.inf:
                continue
            weights = [math.exp(x - m) for x in scores]
            denom = sum(weights) + (math.exp(float(attn_sink[h]) - m) if attn_sink is not None else 0.0)
            acc = torch.zeros(lanes, dtype=torch.float64)
            for w, s in zip(weights, slots):
                acc += w * kvd[s, :lanes]
            out[i, h] = acc / denom
    return out
