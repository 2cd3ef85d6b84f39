"""In-tree ragged sparse MLA prefill in Triton: one program per query row x 16-head block, no split-K.

Same math as ``torch_ref.ragged_prefill`` (DESIGN.md §3): scores over the row's valid slots,
online softmax in fp32 (base 2), V the first ``lanes`` lanes of each kv row, the sink as extra
mass with no value, rows without a valid slot written as 0. The head dim is split into a
power-of-two block ``DA`` (512 for every production layout) and a masked remainder block
(the 64 rope lanes of 512+64), so no lane is loaded twice and no power-of-two padding of 576
is paid. Shared pieces (row bounds, the tile loop, host-side argument packing) live here and
are reused by the split-K decode kernel in ``triton_decode``.

Two tile orientations exist: heads as the MMA's M (``attend``, mma.sync with M=16) and slots as
M (``attend_t``, which lets Hopper use wgmma). On an H200 the first won every config tried
(8.4 ms against 12.0 ms at 16,384 rows; docs/benchmarks.md), so it is the default.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .common import KernelArgs
from .torch_ref import ragged_prefill as torch_ragged_prefill

HEAD_BLOCK = 16  # heads per program, as vLLM's in-tree grid (rows, ceil(H / 16)); also tl.dot's minimum M
LOG2E = 1.4426950408889634
SUPPORTED = frozenset({torch.float16, torch.bfloat16, torch.float32})
_FLAGS = ["ragged", "has_len", "has_sink", "lanes", "width"]  # runtime values: no recompile per flag


class TileConfig(NamedTuple):
    """Launch shape of the tile loop: kv slots per tile, warps, software-pipeline stages."""

    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2
    swap: bool = False  # slots/lanes as the MMA's M (attend_t) instead of heads (attend)
    maxnreg: int | None = None  # register cap per thread: more programs resident, some spills

    def launch_options(self) -> dict:
        """Keyword options for a Triton launch (maxnreg only when set: the interpreter rejects it)."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg:
            opts["maxnreg"] = self.maxnreg
        return opts


# Picked on an H200 by scripts/gpu/h200_run.py over 19 tile configs in three runs (docs/benchmarks.md).
PREFILL_CONFIG = TileConfig(64, 4, 2)


class Packed(NamedTuple):
    """Host-side facts a launch needs: tensors (dummies where absent), strides, flags, blocks."""

    idx: torch.Tensor
    idx_s0: int
    idx_s1: int
    width: int
    length: torch.Tensor
    len_s0: int
    indptr: torch.Tensor
    sink: torch.Tensor
    ragged: int
    has_len: int
    has_sink: int
    skv: int
    sm_scale2: float
    block_a: int
    block_b: int
    has_b: bool
    lanes: int
    v_b: bool
    ieee: bool


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def split_head_dim(head_dim: int) -> tuple[int, int]:
    """(DA, BLOCK_B): the largest power of two <= D, and a >= 16 power-of-two block for the rest (0 if none)."""
    da = 1 << (head_dim.bit_length() - 1)
    rest = head_dim - da
    return da, (max(16, next_pow2(rest)) if rest else 0)


def count_block(width: int) -> int:
    """Index block for counting a dense row's indices >= 0: the whole row in one load up to 2048."""
    return min(max(16, next_pow2(width)), 2048)


def triton_supports(args: KernelArgs) -> bool:
    """Triton runs the call when q and kv share a 16/32-bit float dtype and D >= 16; else torch does."""
    q, kv = args.q, args.kv
    return q.dtype in SUPPORTED and kv.dtype == q.dtype and q.shape[2] >= 16


def pack(args: KernelArgs) -> Packed:
    """Flatten a call's optional operands into what the kernels take; dummies keep pointer args typed."""
    q, kv, index, out = args.q, args.kv, args.index, args.output
    dummy = q
    if index.ragged:
        idx = index.ragged_indices
        idx_s0, idx_s1, width = 0, idx.stride(0), 0
        indptr = index.ragged_indptr
    else:
        idx = index.indices
        idx_s0, idx_s1, width = idx.stride(0), idx.stride(1), int(idx.shape[1])
        indptr = dummy
    length = index.topk_length if index.topk_length is not None else dummy
    sink = args.attn_sink if args.attn_sink is not None else dummy
    da, block_b = split_head_dim(q.shape[2])
    lanes = int(out.shape[2])
    return Packed(
        idx, idx_s0, idx_s1, width, length,
        length.stride(0) if index.topk_length is not None else 0, indptr, sink,
        int(index.ragged), int(index.topk_length is not None), int(args.attn_sink is not None),
        int(kv.shape[0]), float(args.scale) * LOG2E, da, max(block_b, 16), block_b > 0, lanes,
        lanes > da, q.dtype == torch.float32,
    )


@triton.jit
def row_bounds(idx_ptr, idx_s0, idx_s1, width, len_ptr, len_s0, indptr_ptr, row, ragged, has_len,
               CNT_BLOCK: tl.constexpr):
    """(int64 element offset of the row's first index, the row's length in positions)."""
    row64 = row.to(tl.int64)
    base = row64 * idx_s0
    seg = width.to(tl.int64)
    if ragged != 0:
        start = tl.load(indptr_ptr + row64).to(tl.int64)
        base = start * idx_s1
        seg = tl.load(indptr_ptr + row64 + 1).to(tl.int64) - start
    n = seg
    if has_len != 0:
        n = tl.minimum(tl.load(len_ptr + row64 * len_s0).to(tl.int64), seg)
    elif ragged == 0:  # dense without topk_length: the count of indices >= 0
        cnt = tl.zeros([CNT_BLOCK], tl.int64)
        for j0 in range(0, width, CNT_BLOCK):
            offs = j0 + tl.arange(0, CNT_BLOCK)
            v = tl.load(idx_ptr + base + offs.to(tl.int64) * idx_s1, mask=offs < width, other=-1)
            cnt += (v >= 0).to(tl.int64)
        n = tl.sum(cnt, axis=0)
    return base, tl.maximum(n, 0).to(tl.int32)


@triton.jit
def attend(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, base, idx_s1, skv, H, sm_scale2,
           q_s0, q_s1, q_s2, kv_s0, kv_s2,
           D: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, HAS_B: tl.constexpr,
           V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr, IEEE: tl.constexpr):
    """Online softmax over positions [lo, hi) of one row for HB heads: (m, l, acc_a, acc_b), base 2."""
    offs_h = h0 + tl.arange(0, HB)
    hmask = offs_h < H
    offs_a = tl.arange(0, BLOCK_A)
    offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
    bmask = offs_b < D
    q_row = q_ptr + row.to(tl.int64) * q_s0 + offs_h[:, None] * q_s1
    qa = tl.load(q_row + offs_a[None, :] * q_s2, mask=hmask[:, None], other=0.0)
    qb = tl.zeros([HB, BLOCK_B], qa.dtype)
    if HAS_B:
        qb = tl.load(q_row + offs_b[None, :] * q_s2, mask=hmask[:, None] & bmask[None, :], other=0.0)
    m = tl.full([HB], float("-inf"), tl.float32)
    l = tl.zeros([HB], tl.float32)
    acc_a = tl.zeros([HB, BLOCK_A], tl.float32)
    acc_b = tl.zeros([HB, BLOCK_B], tl.float32)
    for j0 in range(lo, hi, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        in_row = offs_n < hi
        slot = tl.load(idx_ptr + base + offs_n.to(tl.int64) * idx_s1, mask=in_row, other=-1).to(tl.int64)
        valid = in_row & (slot >= 0) & (slot < skv)
        krow = kv_ptr + tl.where(valid, slot, 0) * kv_s0
        ka = tl.load(krow[:, None] + offs_a[None, :] * kv_s2, mask=valid[:, None], other=0.0)
        if IEEE:
            s = tl.dot(qa, tl.trans(ka), input_precision="ieee")
        else:
            s = tl.dot(qa, tl.trans(ka))
        kb = tl.zeros([BLOCK_N, BLOCK_B], ka.dtype)
        if HAS_B:
            kb = tl.load(krow[:, None] + offs_b[None, :] * kv_s2, mask=valid[:, None] & bmask[None, :], other=0.0)
            if IEEE:
                s += tl.dot(qb, tl.trans(kb), input_precision="ieee")
            else:
                s += tl.dot(qb, tl.trans(kb))
        s = tl.where(valid[None, :], s * sm_scale2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        pv = p.to(ka.dtype)
        if IEEE:
            acc_a = acc_a * alpha[:, None] + tl.dot(pv, ka, input_precision="ieee")
        else:
            acc_a = acc_a * alpha[:, None] + tl.dot(pv, ka)
        if V_B:
            if IEEE:
                acc_b = acc_b * alpha[:, None] + tl.dot(pv, kb, input_precision="ieee")
            else:
                acc_b = acc_b * alpha[:, None] + tl.dot(pv, kb)
        m = m_new
    return m, l, acc_a, acc_b


@triton.jit
def attend_t(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, base, idx_s1, skv, H, sm_scale2,
             q_s0, q_s1, q_s2, kv_s0, kv_s2,
             D: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, HAS_B: tl.constexpr,
             V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr, IEEE: tl.constexpr):
    """``attend`` with slots and lanes as the large MMA dimension (S^T = K q^T, O^T = V^T P^T).

    With only 16 heads, heads-as-M gives tensor-core tiles of M=16, which on Hopper means
    register-staged mma.sync operands; slots-as-M (64+) lets Hopper's wgmma read the kv tile
    straight from shared memory.
    """
    offs_h = h0 + tl.arange(0, HB)
    hmask = offs_h < H
    offs_a = tl.arange(0, BLOCK_A)
    offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
    bmask = offs_b < D
    q_row = q_ptr + row.to(tl.int64) * q_s0 + offs_h[None, :] * q_s1
    qa = tl.load(q_row + offs_a[:, None] * q_s2, mask=hmask[None, :], other=0.0)  # [BLOCK_A, HB]
    qb = tl.zeros([BLOCK_B, HB], qa.dtype)
    if HAS_B:
        qb = tl.load(q_row + offs_b[:, None] * q_s2, mask=hmask[None, :] & bmask[:, None], other=0.0)
    m = tl.full([HB], float("-inf"), tl.float32)
    l = tl.zeros([HB], tl.float32)
    acc_a = tl.zeros([BLOCK_A, HB], tl.float32)
    acc_b = tl.zeros([BLOCK_B, HB], tl.float32)
    for j0 in range(lo, hi, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        in_row = offs_n < hi
        slot = tl.load(idx_ptr + base + offs_n.to(tl.int64) * idx_s1, mask=in_row, other=-1).to(tl.int64)
        valid = in_row & (slot >= 0) & (slot < skv)
        krow = kv_ptr + tl.where(valid, slot, 0) * kv_s0
        ka = tl.load(krow[:, None] + offs_a[None, :] * kv_s2, mask=valid[:, None], other=0.0)
        if IEEE:
            s = tl.dot(ka, qa, input_precision="ieee")
        else:
            s = tl.dot(ka, qa)
        kb = tl.zeros([BLOCK_N, BLOCK_B], ka.dtype)
        if HAS_B:
            kb = tl.load(krow[:, None] + offs_b[None, :] * kv_s2, mask=valid[:, None] & bmask[None, :], other=0.0)
            if IEEE:
                s += tl.dot(kb, qb, input_precision="ieee")
            else:
                s += tl.dot(kb, qb)
        s = tl.where(valid[:, None], s * sm_scale2, float("-inf"))  # [BLOCK_N, HB]
        m_new = tl.maximum(m, tl.max(s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[None, :])
        l = l * alpha + tl.sum(p, axis=0)
        pv = p.to(ka.dtype)
        if IEEE:
            acc_a = acc_a * alpha[None, :] + tl.dot(tl.trans(ka), pv, input_precision="ieee")
        else:
            acc_a = acc_a * alpha[None, :] + tl.dot(tl.trans(ka), pv)
        if V_B:
            if IEEE:
                acc_b = acc_b * alpha[None, :] + tl.dot(tl.trans(kb), pv, input_precision="ieee")
            else:
                acc_b = acc_b * alpha[None, :] + tl.dot(tl.trans(kb), pv)
        m = m_new
    return m, l, tl.trans(acc_a), tl.trans(acc_b)


@triton.jit(do_not_specialize=_FLAGS)
def _prefill_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr,
                    skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                    q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                    D: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, HAS_B: tl.constexpr,
                    V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr, IEEE: tl.constexpr,
                    CNT_BLOCK: tl.constexpr, SWAP: tl.constexpr):
    row = tl.program_id(0)
    h0 = tl.program_id(1) * HB
    base, n = row_bounds(idx_ptr, idx_s0, idx_s1, width, len_ptr, len_s0, indptr_ptr, row, ragged, has_len,
                         CNT_BLOCK)
    if SWAP:
        m, l, acc_a, acc_b = attend_t(q_ptr, kv_ptr, idx_ptr, row, h0, 0, n, base, idx_s1, skv, H, sm_scale2,
                                q_s0, q_s1, q_s2, kv_s0, kv_s2, D, BLOCK_A, BLOCK_B, HAS_B, V_B, BLOCK_N, HB, IEEE)
    else:
        m, l, acc_a, acc_b = attend(q_ptr, kv_ptr, idx_ptr, row, h0, 0, n, base, idx_s1, skv, H, sm_scale2,
                                q_s0, q_s1, q_s2, kv_s0, kv_s2, D, BLOCK_A, BLOCK_B, HAS_B, V_B, BLOCK_N, HB, IEEE)
    offs_h = h0 + tl.arange(0, HB)
    hmask = offs_h < H
    # The sink joins the max and adds mass with no value; absent, it loads as -inf and changes nothing.
    sink = tl.load(sink_ptr + offs_h * sink_s0, mask=hmask & ((offs_h * 0 + has_sink) != 0), other=float("-inf"))
    sink = sink.to(tl.float32) * 1.4426950408889634
    m_fin = tl.maximum(m, sink)
    m_safe = tl.where(m_fin == float("-inf"), 0.0, m_fin)
    alpha = tl.exp2(m - m_safe)
    l = l * alpha + tl.exp2(sink - m_safe)
    acc_a = acc_a * alpha[:, None]
    acc_b = acc_b * alpha[:, None]
    inv = tl.where(l > 0.0, 1.0 / tl.where(l > 0.0, l, 1.0), 0.0)
    o_row = out_ptr + row.to(tl.int64) * o_s0 + offs_h[:, None] * o_s1
    offs_a = tl.arange(0, BLOCK_A)
    tl.store(o_row + offs_a[None, :] * o_s2, (acc_a * inv[:, None]).to(out_ptr.dtype.element_ty),
             mask=hmask[:, None] & (offs_a[None, :] < lanes))
    if V_B:
        offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
        tl.store(o_row + offs_b[None, :] * o_s2, (acc_b * inv[:, None]).to(out_ptr.dtype.element_ty),
                 mask=hmask[:, None] & (offs_b[None, :] < lanes))


def launch(args: KernelArgs, *, config: TileConfig | None = None) -> None:
    """Write the ragged prefill into ``args.output`` in place; torch serves dtypes Triton does not."""
    q, kv, out = args.q, args.kv, args.output
    rows, heads, head_dim = q.shape
    if rows == 0 or heads == 0 or out.shape[2] == 0:
        return
    if not triton_supports(args):
        torch_ragged_prefill(args)
        return
    cfg = config or PREFILL_CONFIG
    p = pack(args)
    grid = (rows, triton.cdiv(heads, HEAD_BLOCK))
    _prefill_kernel[grid](
        q, kv, p.idx, p.length, p.indptr, p.sink, out,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.has_sink, p.lanes,
        q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.stride(2), p.idx_s0, p.idx_s1, p.len_s0,
        p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2),
        D=head_dim, BLOCK_A=p.block_a, BLOCK_B=p.block_b, HAS_B=p.has_b, V_B=p.v_b, BLOCK_N=cfg.block_n,
        HB=HEAD_BLOCK, IEEE=p.ieee, CNT_BLOCK=count_block(p.width), SWAP=cfg.swap, **cfg.launch_options(),
    )
