"""In-tree ragged sparse MLA prefill in Triton, one program per query row x 16-head block, no split-K; and the
tile loop the split-K decode (``triton_decode``) shares.

Computes the contract of docs/kernels.md (as ``torch_ref.ragged_prefill``): scores over the row's valid slots,
online softmax in fp32 (base 2), V the first ``lanes`` lanes of each kv row, the sink as extra mass with no value,
rows without a valid slot written as 0. The softmax state (running max and sum, the accumulators) lives in the
program's registers for its 16 heads.

Tiles of ``BLOCK_N`` kv slots: their slot numbers loaded and checked (-1 and out-of-range slots masked, offsets
int64), the kv rows gathered by masked loads that Triton pipelines ``num_stages`` deep (``TileConfig``). The head
dim is split into a power-of-two block ``DA`` (512 for every production layout) and a masked remainder block (the
64 rope lanes of 512+64), so no lane is loaded twice and no power-of-two padding of 576 is paid. The power-of-two
block is further cut into ``chunks`` column blocks, each its own MMA: with 16 heads as the MMA's M the score tile
S = q·Kᵀ is only 16 × BLOCK_N, so one 512-deep product is a single serial chain of accumulating MMAs per
fragment, where four 128-deep products are four independent chains the warp scheduler can overlap, and their sum
is the same S. The P·V product is cut the same way, so each kv chunk is loaded once and used by both products.

``launch(redo=flags)`` computes only the items (row, head block) the Hopper prefill flagged under its reference
max (``gluon_sm90_ws.redo_flagged``): ``_redo_kernel``, whose programs each scan a span of flags.

Limits: q fp16, bf16 or fp32 (fp32 products in full precision); kv in q's dtype or an fp8 format the device reads
(``fp8_kv_dtypes``, converted exactly); D >= 16; CUDA and ROCm GPUs, and Triton's CPU interpreter (the tests).
torch serves the rest (``triton_supports``). Figures: docs/kernels.md, "Triton kernel design figures", and docs/benchmarks.md,
"fp8 kv pools".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .common import KernelArgs, device_key, empty_call, sm_count
from .fp8_ptx import kv_load, kv_operand
from .launcher import Step, current_stream
from .launcher import launch as run
from .plan import clock_for, index_operands, launch_key, planned, stamp_operands
from .triton_stamps import STAMP_ARGS, stamp_end, stamp_start
from .torch_ref import ragged_prefill as torch_ragged_prefill

HEAD_BLOCK = 16  # heads per program, as vLLM's in-tree grid (rows, ceil(H / 16)); also tl.dot's minimum M
LOG2E = 1.4426950408889634
SUPPORTED = frozenset({torch.float16, torch.bfloat16, torch.float32})
# fp8 kv pools the kernels read beside a 16/32-bit q: each tile converted to q's dtype as it loads (exact: every
# fp8 value is a bf16, fp16 and fp32 value), so the math is the reference's on the same fp8 values, unscaled.
# NVIDIA GPUs convert the OCP formats; ROCm's gfx942 the fnuz ones (gfx950's OCP formats go to torch until
# checked there); Triton's CPU interpreter all four.
FP8_OCP = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
FP8_FNUZ = tuple(getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n))
MIN_CHUNK = 16  # tl.dot's minimum K: a chunk narrower than this is not cut
_FLAGS = ["ragged", "has_len", "has_sink", "lanes", "width"]  # runtime values: no recompile per flag


class TileConfig(NamedTuple):
    """Launch shape of the tile loop: kv slots per tile, warps, pipeline stages, MMA chains, register cap."""

    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2
    chunks: int = 1  # independent MMA chains the power-of-two head block is cut into: 1, 2 or 4
    maxnreg: int | None = None  # register cap per thread: more programs resident, some spills

    def launch_options(self) -> dict:
        """Keyword options for a Triton launch (maxnreg only when set: the interpreter rejects it)."""
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg:
            opts["maxnreg"] = self.maxnreg
        return opts


# The fastest config of those measured on an H200 at 16,384 rows, 512+64 (docs/kernels.md, "Triton kernel design
# figures").
PREFILL_CONFIG = TileConfig(64, 4, 2, 4)
# Both kernels' config for an fp8 pool read through fp8_ptx: the fastest prefill and 16-row decode with either
# format, where 64-slot tiles in 4 chains spill (docs/kernels.md, "Triton kernel design figures").
FP8_CONFIG = TileConfig(32, 4, 2, 4)


def config_for(config: TileConfig | None, default: TileConfig, kv8: int) -> TileConfig:
    """The tile config a launch uses: the one asked for, else FP8_CONFIG for a PTX-converted pool, else ``default``."""
    return config or (FP8_CONFIG if kv8 else default)


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


def chunks_for(block_a: int, wanted: int) -> int:
    """The chunk count a launch uses: ``wanted`` (1, 2 or 4) halved until each chunk is >= 16 lanes."""
    n = 4 if wanted >= 4 else 2 if wanted >= 2 else 1
    while n > 1 and block_a // n < MIN_CHUNK:
        n //= 2
    return n


def count_block(width: int) -> int:
    """Index block for counting a dense row's indices >= 0: the whole row in one load up to 2048."""
    return min(max(16, next_pow2(width)), 2048)


def fp8_kv_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """The fp8 kv dtypes the kernels read on ``device`` (see FP8_OCP)."""
    if device.type == "cpu":  # TRITON_INTERPRET=1
        return FP8_OCP + FP8_FNUZ
    return FP8_FNUZ if torch.version.hip else FP8_OCP


def triton_supports(args: KernelArgs) -> bool:
    """Triton runs the call when q is a 16/32-bit float, kv the same dtype or a readable fp8 one (``fp8_kv_dtypes``),
    and D >= 16; else torch does."""
    q, kv = args.q, args.kv
    return (q.dtype in SUPPORTED and (kv.dtype == q.dtype or kv.dtype in fp8_kv_dtypes(kv.device))
            and q.shape[2] >= 16)


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
               CNT_BLOCK: tl.constexpr, LENGTH: tl.constexpr = True):
    """(int64 element offset of the row's first index, the row's length in positions).

    With LENGTH False, the row's positions (int64: the dense width, or its ragged segment) in place of its length:
    the Gluon kernels' span of a row (they find the length apart, under the first gathers: ``_row_len``)."""
    row64 = row.to(tl.int64)
    base = row64 * idx_s0
    seg = width.to(tl.int64)
    if ragged != 0:
        start = tl.load(indptr_ptr + row64).to(tl.int64)
        base = start * idx_s1
        seg = tl.load(indptr_ptr + row64 + 1).to(tl.int64) - start
    if not LENGTH:
        return base, seg
    else:
        n = seg
        if has_len != 0:
            n = tl.minimum(tl.load(len_ptr + row64 * len_s0).to(tl.int64), seg)
        elif ragged == 0:  # dense without topk_length: the count of indices >= 0
            cnt = tl.zeros([CNT_BLOCK], tl.int32)
            for j0 in range(0, width, CNT_BLOCK):
                offs = j0 + tl.arange(0, CNT_BLOCK)
                v = tl.load(idx_ptr + base + offs.to(tl.int64) * idx_s1, mask=offs < width, other=-1)
                cnt += (v >= 0).to(tl.int32)
            n = tl.sum(cnt, axis=0).to(tl.int64)
        return base, tl.maximum(n, 0).to(tl.int32)


@triton.jit
def mm(a, b, IEEE: tl.constexpr):
    """a @ b on the tensor cores; fp32 operands in full precision (IEEE) rather than tf32."""
    if IEEE:
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def softmax_step(s, valid, m, l, sm_scale2):
    """One tile of the online softmax (base 2): (m_new, alpha to rescale the running sums by, p, l_new)."""
    s = tl.where(valid[None, :], s * sm_scale2, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, alpha, p, l * alpha + tl.sum(p, axis=1)


@triton.jit
def finish_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink):
    """The factor each head's accumulator is multiplied by at the end: the sink's mass joined, 1/l, 0 if empty.

    The sink joins the max and adds mass with no value; absent, it loads as -inf and changes nothing.
    """
    sink = tl.load(sink_ptr + offs_h * sink_s0, mask=hmask & ((offs_h * 0 + has_sink) != 0), other=float("-inf"))
    sink = sink.to(tl.float32) * 1.4426950408889634
    m_fin = tl.maximum(m, sink)
    m_safe = tl.where(m_fin == float("-inf"), 0.0, m_fin)
    alpha = tl.exp2(m - m_safe)
    l = l * alpha + tl.exp2(sink - m_safe)
    return tl.where(l > 0.0, alpha / tl.where(l > 0.0, l, 1.0), 0.0)


@triton.jit
def attend(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, base, idx_s1, skv, H, sm_scale2,
           q_s0, q_s1, q_s2, kv_s0, kv_s2,
           D: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, BLOCK_B: tl.constexpr, HAS_B: tl.constexpr,
           V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr, IEEE: tl.constexpr, KV8: tl.constexpr = 0):
    """Online softmax over positions [lo, hi) of one row for HB heads.

    Returns (m, l, acc0, acc1, acc2, acc3, acc_b), base 2: acc<i> holds lanes [i·CH, (i+1)·CH)
    for i < NCH (the others are unused zeros), acc_b the lanes past NCH·CH.
    """
    offs_h = h0 + tl.arange(0, HB)
    hmask = offs_h < H
    offs_c = tl.arange(0, CH)
    offs_b = NCH * CH + tl.arange(0, BLOCK_B)
    bmask = offs_b < D
    q_row = q_ptr + row.to(tl.int64) * q_s0 + offs_h[:, None] * q_s1
    q0 = tl.load(q_row + offs_c[None, :] * q_s2, mask=hmask[:, None], other=0.0)
    q1 = q0
    q2 = q0
    q3 = q0
    if NCH > 1:
        q1 = tl.load(q_row + (CH + offs_c)[None, :] * q_s2, mask=hmask[:, None], other=0.0)
    if NCH > 2:
        q2 = tl.load(q_row + (2 * CH + offs_c)[None, :] * q_s2, mask=hmask[:, None], other=0.0)
        q3 = tl.load(q_row + (3 * CH + offs_c)[None, :] * q_s2, mask=hmask[:, None], other=0.0)
    qb = tl.zeros([HB, BLOCK_B], q0.dtype)
    if HAS_B:
        qb = tl.load(q_row + offs_b[None, :] * q_s2, mask=hmask[:, None] & bmask[None, :], other=0.0)
    m = tl.full([HB], float("-inf"), tl.float32)
    l = tl.zeros([HB], tl.float32)
    acc0 = tl.zeros([HB, CH], tl.float32)
    acc1 = tl.zeros([HB, CH], tl.float32)
    acc2 = tl.zeros([HB, CH], tl.float32)
    acc3 = tl.zeros([HB, CH], tl.float32)
    acc_b = tl.zeros([HB, BLOCK_B], tl.float32)
    for j0 in range(lo, hi, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        in_row = offs_n < hi
        slot = tl.load(idx_ptr + base + offs_n.to(tl.int64) * idx_s1, mask=in_row, other=-1).to(tl.int64)
        valid = in_row & (slot >= 0) & (slot < skv)
        krow = kv_ptr + tl.where(valid, slot, 0) * kv_s0
        # kv tiles in q's dtype: a no-op for a 16/32-bit pool, an exact conversion for an fp8 one (fp8_ptx)
        k0 = kv_load(krow[:, None] + offs_c[None, :] * kv_s2, valid[:, None], q0.dtype, KV8)
        s = mm(q0, tl.trans(k0), IEEE)
        # Each chunk's product is its own accumulation chain; summing them last keeps them independent.
        if NCH > 1:
            k1 = kv_load(krow[:, None] + (CH + offs_c)[None, :] * kv_s2, valid[:, None], q0.dtype, KV8)
            s1 = mm(q1, tl.trans(k1), IEEE)
        if NCH > 2:
            k2 = kv_load(krow[:, None] + (2 * CH + offs_c)[None, :] * kv_s2, valid[:, None], q0.dtype, KV8)
            k3 = kv_load(krow[:, None] + (3 * CH + offs_c)[None, :] * kv_s2, valid[:, None], q0.dtype, KV8)
            s = s + mm(q2, tl.trans(k2), IEEE)
            s1 = s1 + mm(q3, tl.trans(k3), IEEE)
        if NCH > 1:
            s = s + s1
        kb = tl.zeros([BLOCK_N, BLOCK_B], k0.dtype)
        if HAS_B:
            kb = kv_load(krow[:, None] + offs_b[None, :] * kv_s2, valid[:, None] & bmask[None, :], q0.dtype, KV8)
            s += mm(qb, tl.trans(kb), IEEE)
        m_new, alpha, p, l = softmax_step(s, valid, m, l, sm_scale2)
        pv = p.to(k0.dtype)
        acc0 = acc0 * alpha[:, None] + mm(pv, k0, IEEE)
        if NCH > 1:
            acc1 = acc1 * alpha[:, None] + mm(pv, k1, IEEE)
        if NCH > 2:
            acc2 = acc2 * alpha[:, None] + mm(pv, k2, IEEE)
            acc3 = acc3 * alpha[:, None] + mm(pv, k3, IEEE)
        if V_B:
            acc_b = acc_b * alpha[:, None] + mm(pv, kb, IEEE)
        m = m_new
    return m, l, acc0, acc1, acc2, acc3, acc_b


@triton.jit
def store_rows(o_row, o_s2, scale, hmask, lanes, acc0, acc1, acc2, acc3, acc_b,
               CH: tl.constexpr, NCH: tl.constexpr, BLOCK_B: tl.constexpr, V_B: tl.constexpr):
    """Write acc<i> · scale[:, None] into lanes < ``lanes`` of HB output rows, cast to the pointer's type."""
    ty = o_row.dtype.element_ty
    offs_c = tl.arange(0, CH)
    w = scale[:, None]
    tl.store(o_row + offs_c[None, :] * o_s2, (acc0 * w).to(ty), mask=hmask[:, None] & (offs_c[None, :] < lanes))
    if NCH > 1:
        o1 = CH + offs_c
        tl.store(o_row + o1[None, :] * o_s2, (acc1 * w).to(ty), mask=hmask[:, None] & (o1[None, :] < lanes))
    if NCH > 2:
        o2 = 2 * CH + offs_c
        o3 = 3 * CH + offs_c
        tl.store(o_row + o2[None, :] * o_s2, (acc2 * w).to(ty), mask=hmask[:, None] & (o2[None, :] < lanes))
        tl.store(o_row + o3[None, :] * o_s2, (acc3 * w).to(ty), mask=hmask[:, None] & (o3[None, :] < lanes))
    if V_B:
        ob = NCH * CH + tl.arange(0, BLOCK_B)
        tl.store(o_row + ob[None, :] * o_s2, (acc_b * w).to(ty), mask=hmask[:, None] & (ob[None, :] < lanes))


@triton.jit
def prefill_item(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, row, hb,
                 skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                 q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                 D: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, BLOCK_B: tl.constexpr,
                 HAS_B: tl.constexpr, V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr,
                 IEEE: tl.constexpr, CNT_BLOCK: tl.constexpr, KV8: tl.constexpr):
    """One item: query row ``row``, heads [hb·HB, hb·HB + HB), into the output."""
    h0 = hb * HB
    base, n = row_bounds(idx_ptr, idx_s0, idx_s1, width, len_ptr, len_s0, indptr_ptr, row, ragged, has_len,
                         CNT_BLOCK)
    m, l, acc0, acc1, acc2, acc3, acc_b = attend(
        q_ptr, kv_ptr, idx_ptr, row, h0, 0, n, base, idx_s1, skv, H, sm_scale2, q_s0, q_s1, q_s2, kv_s0, kv_s2,
        D, CH, NCH, BLOCK_B, HAS_B, V_B, BLOCK_N, HB, IEEE, KV8)
    offs_h = h0 + tl.arange(0, HB)
    hmask = offs_h < H
    scale = finish_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
    o_row = out_ptr + row.to(tl.int64) * o_s0 + offs_h[:, None] * o_s1
    store_rows(o_row, o_s2, scale, hmask, lanes, acc0, acc1, acc2, acc3, acc_b, CH, NCH, BLOCK_B, V_B)


@triton.jit(do_not_specialize=_FLAGS + STAMP_ARGS)
def _prefill_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr,
                    skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                    q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                    stamp_ptr, count_ptr, stamp_first, stamp_last,
                    D: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, BLOCK_B: tl.constexpr,
                    HAS_B: tl.constexpr, V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr,
                    IEEE: tl.constexpr, CNT_BLOCK: tl.constexpr, KV8: tl.constexpr = 0, CLOCK: tl.constexpr = 0):
    stamp_start(stamp_ptr, stamp_first, CLOCK)
    prefill_item(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, tl.program_id(0), tl.program_id(1),
                 skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                 q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                 D, CH, NCH, BLOCK_B, HAS_B, V_B, BLOCK_N, HB, IEEE, CNT_BLOCK, KV8)
    stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK)


@triton.jit(do_not_specialize=_FLAGS + ["n_items", "n_hb", "span"] + STAMP_ARGS)
def _redo_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr,
                 skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                 q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                 stamp_ptr, count_ptr, stamp_first, stamp_last, redo_ptr, n_items, n_hb, span,
                 D: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, BLOCK_B: tl.constexpr,
                 HAS_B: tl.constexpr, V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr,
                 IEEE: tl.constexpr, CNT_BLOCK: tl.constexpr, SPAN: tl.constexpr, KV8: tl.constexpr = 0,
                 CLOCK: tl.constexpr = 0):
    """The items flagged in ``redo_ptr`` (row-major over (row, head block)), each program ``span`` (<= SPAN) of
    them: one load of their flags, and in the rare span with one set, each flagged item in turn. The program then
    zeroes its span, so the flags are ready for the next call without a memset launch."""
    first = tl.program_id(0) * span
    offs = first + tl.arange(0, SPAN)
    mine = (tl.arange(0, SPAN) < span) & (offs < n_items)
    if tl.max(tl.load(redo_ptr + offs, mask=mine, other=0), axis=0) != 0:
        for w in range(first, tl.minimum(first + span, n_items)):
            if tl.load(redo_ptr + w) != 0:
                prefill_item(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, w // n_hb, w % n_hb,
                             skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                             q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                             D, CH, NCH, BLOCK_B, HAS_B, V_B, BLOCK_N, HB, IEEE, CNT_BLOCK, KV8)
        tl.store(redo_ptr + offs, tl.zeros([SPAN], tl.int32), mask=mine)
    stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK)


REDO_SPAN = 64  # the most flags one redo program scans


def redo_span(items: int, sms: int) -> int:
    """Items per redo program: as many as keep the grid near two programs per multiprocessor (about what the
    prefill's own grid runs at once, so even with every item flagged the redo is no less parallel), at most
    ``REDO_SPAN``. With a program per item, each reading its flag, the 16,384-row prefill takes 37-42 µs longer
    (docs/kernels.md, "Prefill kernel design figures")."""
    return max(1, min(REDO_SPAN, triton.cdiv(items, 2 * sms)))


def tile_constants(p: Packed, head_dim: int, cfg: TileConfig) -> dict:
    """The constexpr arguments both kernels' tile loops take, for one call and config."""
    nch = chunks_for(p.block_a, cfg.chunks)
    return dict(D=head_dim, CH=p.block_a // nch, NCH=nch, BLOCK_B=p.block_b, HAS_B=p.has_b, V_B=p.v_b,
                BLOCK_N=cfg.block_n, HB=HEAD_BLOCK, IEEE=p.ieee)


class TileLaunch(NamedTuple):
    """What a Triton tile-loop launch (the prefill's, the decode's partials) computes on the host for a call."""

    p: Packed
    pool: torch.Tensor  # the kv pool as the kernel reads it: itself, or an fp8 pool's bytes (fp8_ptx)
    cfg: TileConfig
    consts: dict  # the constexprs and launch options (num_warps, num_stages, maxnreg)


def tile_launch(args: KernelArgs, config: TileConfig | None, default: TileConfig, kv8: int | None) -> TileLaunch:
    """The host-side facts of a tile-loop launch of this call: ``config``, else the kernel's ``default`` (FP8_CONFIG
    for a PTX-converted pool); ``kv8`` overrides the fp8 conversion (``fp8_ptx.kv_operand``)."""
    pool, mode = kv_operand(args.kv, args.q.dtype, kv8)
    cfg = config_for(config, default, mode)
    p = pack(args)
    consts = dict(CNT_BLOCK=count_block(p.width), KV8=mode, **tile_constants(p, int(args.q.shape[2]), cfg),
                  **cfg.launch_options())
    return TileLaunch(p, pool, cfg, consts)


class PrefillPlan(NamedTuple):
    """What a Triton prefill (or redo) launch of one call signature works out on the host (``plan.planned``)."""

    device: int  # CUDA device index, -1 under the interpreter
    clock: int  # the stamps' clock (triton_stamps), -1: this device's kernels do not stamp
    grid: tuple[int, int]
    scalars: tuple  # skv, width, H
    flags: tuple  # ragged ... o_s2: everything after the scale
    consts: dict  # constexprs and launch options
    as_bytes: bool  # the pool goes in as its bytes (an fp8 pool converted by PTX)
    redo: tuple  # (grid, n_items, n_hb, span) of the redo kernel
    key: tuple  # everything the JIT specialises on: the compiled handle's key (launcher.Launcher)


def _plan(args: KernelArgs, config: TileConfig | None, kv8: int | None) -> PrefillPlan:
    q, kv, out = args.q, args.kv, args.output
    rows, heads, _ = q.shape
    tiles = tile_launch(args, config, PREFILL_CONFIG, kv8)
    p = tiles.p
    clock = clock_for(q.device)
    grid = (rows, triton.cdiv(heads, HEAD_BLOCK))
    items = grid[0] * grid[1]
    span = redo_span(items, sm_count(q.device))
    device = device_key(q.device) if q.is_cuda else -1
    scalars = (p.skv, p.width, heads)
    flags = (p.ragged, p.has_len, p.has_sink, p.lanes, q.stride(0), q.stride(1), q.stride(2), kv.stride(0),
             kv.stride(2), p.idx_s0, p.idx_s1, p.len_s0, p.sink.stride(0) if p.has_sink else 0, out.stride(0),
             out.stride(1), out.stride(2))
    consts = {**tiles.consts, "CLOCK": max(clock, 0)}
    key = launch_key(device, (q, tiles.pool, p.idx, p.length, p.indptr, p.sink, out), scalars + flags, consts)
    return PrefillPlan(device, clock, grid, scalars, flags, consts, tiles.pool is not kv,
                       ((triton.cdiv(items, span),), items, grid[1], span), key)


def on_torch(torch_fn: Callable[[KernelArgs], None], args: KernelArgs) -> str:
    """Run a call Triton does not take (``triton_supports``) on ``torch_fn``; what ran: "torch"."""
    torch_fn(args)
    return "torch"


def _nothing(args: KernelArgs) -> None:
    return None


def no_kernel_recipe(args: KernelArgs,
                     torch_fn: Callable[[KernelArgs], None]) -> Callable[[KernelArgs], str | None] | None:
    """The recipe of a Triton launch's call signature where no Triton kernel runs: an empty call does nothing, a call
    Triton does not take runs ``torch_fn`` (``on_torch``); None where a kernel takes the call."""
    if empty_call(args):
        return _nothing
    if not triton_supports(args):
        return partial(on_torch, torch_fn)
    return None


def recipe(args: KernelArgs) -> Callable[[KernelArgs], str | None]:
    """The default launch of calls of ``args``'s signature, worked out once (``plan.planned`` keeps it): a function
    of a call's operands that launches the prefill kernel, stamps included; "torch" where torch serves."""
    elsewhere = no_kernel_recipe(args, torch_ragged_prefill)
    if elsewhere is not None:
        return elsewhere
    plan = _plan(args, None, None)
    step = Step(_prefill_kernel, plan.key, plan.grid, plan.consts)
    scalars, flags, as_bytes, device, clock, where = (plan.scalars, plan.flags, plan.as_bytes, plan.device, plan.clock,
                                                      args.q.device)

    def run(a: KernelArgs) -> None:
        pool = a.kv.view(torch.uint8) if as_bytes else a.kv
        times, counts, at = stamp_operands(a, where, clock)
        step((a.q, pool, *index_operands(a), a.output) + scalars + (float(a.scale) * LOG2E,) + flags
             + (times, counts, at, at), current_stream(device))

    return run


def redo_recipe(args: KernelArgs) -> Callable[..., None]:
    """The redo kernel of calls of ``args``'s signature, after the Hopper prefill: ``run(call, flags, stamps,
    stream)`` computes the flagged items again, zeroes the flags and ends a stamped call (``stamps``: table,
    counters, entry)."""
    plan = _plan(args, None, None)
    grid, items, n_hb, span = plan.redo
    step = Step(_redo_kernel, (plan.key, 0), grid, {**plan.consts, "SPAN": REDO_SPAN})
    scalars, flags, as_bytes, tail = plan.scalars, plan.flags, plan.as_bytes, (items, n_hb, span)

    def run(a: KernelArgs, redo: torch.Tensor, stamps: tuple, stream: int) -> None:
        pool = a.kv.view(torch.uint8) if as_bytes else a.kv
        step((a.q, pool, *index_operands(a), a.output) + scalars + (float(a.scale) * LOG2E,) + flags
             + (stamps[0], stamps[1], -1, stamps[2], redo) + tail, stream)

    return run


def launch(args: KernelArgs, *, config: TileConfig | None = None, kv8: int | None = None,
           redo: torch.Tensor | None = None) -> str | None:
    """Write the ragged prefill into ``args.output`` in place; torch serves dtypes Triton does not.

    ``kv8`` overrides how an fp8 pool is converted (``fp8_ptx``; tests only). ``redo``: int32, one flag per item
    (row, head block of 16), row-major: only the flagged items are written (the Hopper prefill's items to compute
    again, ``gluon_sm90_ws.redo_flagged``), by ``_redo_kernel``, whose programs each scan ``redo_span`` flags and
    zero them after; torch, where it serves, writes them all. A call with ``args.stamp`` gets its stamps: both from
    the prefill kernel, the end only from the redo kernel (the Hopper kernel before it wrote the start).
    """
    if redo is None and config is None and kv8 is None:
        return planned(args, "triton prefill", (), lambda: recipe(args))(args)
    if empty_call(args):
        return None
    q = args.q
    if redo is not None:
        items = q.shape[0] * triton.cdiv(q.shape[1], HEAD_BLOCK)
        if redo.dtype != torch.int32 or redo.numel() < items or redo.device != q.device:
            raise ValueError(f"redo: one int32 flag per item on {q.device}, {items} of them (rows x head blocks); "
                             f"got {redo.dtype} x {redo.numel()} on {redo.device}")
    if not triton_supports(args):
        return on_torch(torch_ragged_prefill, args)
    plan = planned(args, "triton_prefill", (config, kv8), lambda: _plan(args, config, kv8))
    pool = args.kv.view(torch.uint8) if plan.as_bytes else args.kv
    head = ((q, pool, *index_operands(args), args.output) + plan.scalars + (float(args.scale) * LOG2E,)
            + plan.flags)
    times, counts, at = stamp_operands(args, q.device, plan.clock)
    stream = current_stream(plan.device)
    if redo is None:
        run(_prefill_kernel, plan.key, plan.grid, head + (times, counts, at, at), plan.consts, stream)
        return
    grid, items, n_hb, span = plan.redo
    run(_redo_kernel, (plan.key, redo.data_ptr() & 15), grid, head + (times, counts, -1, at, redo, items, n_hb, span),
        {**plan.consts, "SPAN": REDO_SPAN}, stream)
