"""Random operands for one sweep point, several sets of them, so repeated calls do not hit a warm cache."""

from __future__ import annotations

import math

import torch

from ..kernels.common import KernelArgs, SparseIndex
from .grid import Layout

L2_FLUSH_BYTES = 256 << 20  # several times any current GPU's L2
MAX_SETS = 4


def topk_indices(rows: int, topk: int, kv_len: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """[rows, topk] int32 distinct random slots per row (-1 padded when the pool is smaller than top-k)."""
    k = min(topk, kv_len)
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=device)
    step = max(1, (1 << 26) // max(1, kv_len))  # bound the random matrix to ~256 MB
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        noise = torch.rand((r1 - r0, kv_len), device=device, generator=gen)
        out[r0:r1, :k] = noise.topk(k, dim=1).indices.to(torch.int32)
    return out


def call_bytes(rows: int, topk: int, heads: int, layout: Layout, kv_len: int, itemsize: int,
               kv_itemsize: int | None = None) -> int:
    """Bytes one call touches at least once: q, output, indices and the kv rows it gathers (capped by the pool)."""
    d = layout.head_dim
    kv_rows = min(kv_len, rows * topk)
    kv_item = itemsize if kv_itemsize is None else kv_itemsize
    return rows * heads * (d + layout.nope) * itemsize + rows * topk * 4 + kv_rows * d * kv_item


def make_sets(rows: int, topk: int, heads: int, layout: Layout, kv_len: int, *, dtype: torch.dtype,
              device: torch.device, seed: int = 0, scale: float | None = None,
              kv_dtype: torch.dtype | None = None) -> list[KernelArgs]:
    """Enough independent input sets that cycling through them touches more bytes than the L2 flush buffer.

    ``kv_dtype``: the pool's dtype when it is not q's (an fp8 pool: the same normal values, rounded to it).
    """
    kv_dtype = kv_dtype or dtype
    per = call_bytes(rows, topk, heads, layout, kv_len, dtype.itemsize, kv_dtype.itemsize)
    n = 1 if device.type == "cpu" else max(1, min(MAX_SETS, math.ceil(L2_FLUSH_BYTES / max(1, per))))
    gen = torch.Generator(device=device).manual_seed(seed)
    d = layout.head_dim
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    sets = []
    for _ in range(n):
        q = torch.randn((rows, heads, d), device=device, generator=gen, dtype=torch.float32).to(dtype)
        kv = torch.randn((kv_len, 1, d), device=device, generator=gen, dtype=torch.float32).to(kv_dtype)
        idx = topk_indices(rows, topk, kv_len, device, gen)
        out = torch.empty((rows, heads, layout.nope), device=device, dtype=dtype)
        sets.append(KernelArgs(q, kv, SparseIndex(idx, None), sc, None, out))
    return sets
