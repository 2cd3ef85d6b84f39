"""Random operands for one sweep point, several sets of them, so repeated calls do not hit a warm cache.

Two ways to hold the kv pool: each set its own small pool (``make_sets`` without ``pool``: the sweep's per-point
default, timed with L2 flushed before each call), or one pool shared by every set, as a server's kv cache is
(``make_pool``, then ``make_sets(pool=...)``): the sets differ in queries and indices, so each call gathers other
rows of the same pool, and whether those rows sit in L2 is the pool's size's doing, not the harness's.
"""

from __future__ import annotations

import math

import torch

from ..kernels.common import KernelArgs, SparseIndex
from .grid import Layout

L2_FLUSH_BYTES = 256 << 20  # several times any current GPU's L2
MAX_SETS = 4
MAX_SHARED_SETS = 64  # with a shared pool a set is only q, indices and output: small calls can cycle many
SHARED_SET_BYTES = 2 << 30  # at most this much of those, all sets together
EXACT_SLOTS = 1 << 17  # up to this many slots, a row's indices are an exact random draw (top-k of noise)


def topk_indices(rows: int, topk: int, kv_len: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """[rows, topk] int32 distinct random slots per row (-1 padded when the pool is smaller than top-k).

    Past ``EXACT_SLOTS`` slots a row draws one slot from each of top-k equal strides of the pool, in random
    order: still distinct and spread over the whole pool, without a [rows, slots] noise matrix per row.
    """
    k = min(topk, kv_len)
    if kv_len > EXACT_SLOTS:
        return _strided_indices(rows, k, kv_len, device, gen)
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=device)
    step = max(1, (1 << 26) // max(1, kv_len))  # bound the random matrix to ~256 MB
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        noise = torch.rand((r1 - r0, kv_len), device=device, generator=gen)
        out[r0:r1, :k] = noise.topk(k, dim=1).indices.to(torch.int32)
    return out


def _strided_indices(rows: int, k: int, kv_len: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    stride = kv_len // k
    base = torch.arange(k, device=device, dtype=torch.int64) * stride
    picked = base + torch.randint(0, stride, (rows, k), device=device, generator=gen)
    order = torch.rand((rows, k), device=device, generator=gen).argsort(dim=1)
    return picked.gather(1, order).to(torch.int32)


def make_pool(kv_len: int, head_dim: int, *, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    """A [kv_len, 1, head_dim] pool of normal values in ``dtype`` (an fp8 pool: rounded to it), made in chunks."""
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    pool = torch.empty((kv_len, 1, head_dim), device=device, dtype=dtype)
    step = max(1, (1 << 27) // head_dim)  # 512 MiB of float32 noise at a time
    for r0 in range(0, kv_len, step):
        r1 = min(kv_len, r0 + step)
        pool[r0:r1] = torch.randn((r1 - r0, 1, head_dim), device=device, generator=gen, dtype=torch.float32).to(dtype)
    return pool


def call_bytes(rows: int, topk: int, heads: int, layout: Layout, kv_len: int, itemsize: int,
               kv_itemsize: int | None = None) -> int:
    """Bytes one call touches at least once: q, output, indices and the kv rows it gathers (capped by the pool)."""
    d = layout.head_dim
    kv_rows = min(kv_len, rows * topk)
    kv_item = itemsize if kv_itemsize is None else kv_itemsize
    return rows * heads * (d + layout.nope) * itemsize + rows * topk * 4 + kv_rows * d * kv_item


def shared_sets(rows: int, topk: int, heads: int, layout: Layout, kv_len: int, itemsize: int,
                kv_itemsize: int) -> int:
    """How many sets cycle over a shared pool: enough that their calls gather more than the L2 flush buffer
    between two calls of one set, within ``MAX_SHARED_SETS`` and ``SHARED_SET_BYTES``."""
    per = call_bytes(rows, topk, heads, layout, kv_len, itemsize, kv_itemsize)
    own = rows * heads * (layout.head_dim + layout.nope) * itemsize + rows * topk * 4
    n = math.ceil(L2_FLUSH_BYTES / max(1, per))
    return max(1, min(MAX_SHARED_SETS, n, SHARED_SET_BYTES // max(1, own)))


def make_sets(rows: int, topk: int, heads: int, layout: Layout, kv_len: int, *, dtype: torch.dtype,
              device: torch.device, seed: int = 0, scale: float | None = None,
              kv_dtype: torch.dtype | None = None, pool: torch.Tensor | None = None) -> list[KernelArgs]:
    """Enough independent input sets that cycling through them touches more bytes than the L2 flush buffer.

    ``kv_dtype``: the pool's dtype when it is not q's (an fp8 pool: the same normal values, rounded to it).
    ``pool``: one kv pool (``make_pool``) every set gathers from; ``kv_len`` is then its slot count.
    """
    kv_dtype = kv_dtype or dtype
    if pool is not None:
        kv_len, kv_dtype = pool.shape[0], pool.dtype
        n = 1 if device.type == "cpu" else shared_sets(rows, topk, heads, layout, kv_len, dtype.itemsize,
                                                        kv_dtype.itemsize)
    else:
        per = call_bytes(rows, topk, heads, layout, kv_len, dtype.itemsize, kv_dtype.itemsize)
        n = 1 if device.type == "cpu" else max(1, min(MAX_SETS, math.ceil(L2_FLUSH_BYTES / max(1, per))))
    gen = torch.Generator(device=device).manual_seed(seed)
    d = layout.head_dim
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    sets = []
    for _ in range(n):
        q = torch.randn((rows, heads, d), device=device, generator=gen, dtype=torch.float32).to(dtype)
        if pool is None:
            kv = torch.randn((kv_len, 1, d), device=device, generator=gen, dtype=torch.float32).to(kv_dtype)
        else:
            kv = pool
        idx = topk_indices(rows, topk, kv_len, device, gen)
        out = torch.empty((rows, heads, layout.nope), device=device, dtype=dtype)
        sets.append(KernelArgs(q, kv, SparseIndex(idx, None), sc, None, out))
    return sets
