"""Sparse MLA attention for Hopper (sm_90) in Gluon: wgmma with the kv slots as M.

The Triton kernels (``triton_prefill``, ``triton_decode``) put the 16 heads of a head block on
the MMA's M and run ``mma.sync``: every kv tile is written to shared memory once, read twice
through ``ldmatrix``, and each of the 4 warps re-reads q, about 300 KB of shared-memory traffic
per 64-slot tile. Here one warpgroup turns the products around so Hopper's ``wgmma`` takes both
operands straight from shared memory, the tile and q each read once per product:

    Sᵀ [64 slots × 16 heads]  = KV [64 × D] · qᵀ [D × 16]        (A: the kv tile, B: q, resident)
    Oᵀ [512 lanes × 16 heads] += Vᵀ [512 × 64] · Pᵀ [64 × 16]    (A: the same tile, transposed view)

The tile is gathered by ``cp.async`` (16-byte copies, invalid slots zero-filled) into
128-byte-swizzled buffers, ``stages`` deep so the next tile's gather runs under this tile's
products. The online softmax runs along Sᵀ's columns (base 2, as every kernel here). The math,
arguments and edge cases are those of ``triton_prefill`` (DESIGN.md §3: sink, -1 and
out-of-range slots, topk_length, ragged indices, int64 offsets); the layouts it takes are the
production ones, a 512-lane block plus an optional 64-lane rope block (512+64, 448+64, 512+0),
fp16 or bf16, and ``supports()`` says so. The registry hands every other call to Triton.

On an H200 (docs/benchmarks.md, session 3) this beats the Triton kernels by 1% (16,384-row
prefill, 512+64), 11% (512+0) and 17-24% (16-row split-K decode). One warpgroup overlaps little
of the softmax with the tensor cores, so the prefill's default is a warp-specialised, persistent
kernel: ``gluon_sm90_ws`` at 512+64 (5.48-5.60 ms against 6.97), ``gluon_sm90_ws_d512`` at
D = 512 (4.89 against 6.62 at 512+0); ``ws_module`` picks (S4, S5). The split-K decode's
partials run this module's kernel, which is faster at 2-16 rows than the warp-specialised ones,
and are kept in q's dtype for ``triton_decode``'s reduce (``DECODE_PARTIALS_16BIT``, S8). At
D = 512 (512+0, 448+64), where three stages fit, the partials take ``_attend_pipe``: tile t - 1's
P·V runs on the tensor cores under tile t's softmax (1-3% faster, S9; ``decode_config``). At
512+64 a pipelined kernel with one rope buffer was correct but 1 µs slower at 16 rows (S17).

The split-K decode also reads fp8 pools (e4m3fn, e5m2; ``supports_decode``, ``DECODE_SM90_FP8``): the stages
hold the tiles' bytes, and each landed tile is converted by ``fp8_ptx``'s PTX into one q-dtype tile that the
products read (session 24: 9.0-9.1 µs at 2 rows, 18.6-18.7 at 16, 512+64, against 10.4 and 23.0 through
Triton). The default prefill reads them too (``supports_prefill``): ``gluon_sm90_ws`` lands each tile's bytes in
the stage they are converted into (session 25: 8.8-9.0 ms at 16,384 rows, 512+64, against 12.1-12.4 through
Triton; a bf16 pool takes 5.3).

Gluon (``triton.experimental.gluon``) ships with Triton; the registry imports this module only
for CUDA devices, and ``HAVE_GLUON`` is False where Gluon is missing.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .common import KernelArgs, device_capability
from .fp8_ptx import ASM_MODES, TO, kv_operand
from .triton_prefill import HEAD_BLOCK, count_block, pack

try:  # Gluon and its Hopper ops: Triton >= 3.5 with the NVIDIA backend
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    # Triton 3.9 renamed the cp.async copy (async_copy_global_to_shared -> async_load); same arguments.
    cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # likewise (gl.barrier in 3.9)
    from .fp8_ptx import PTX_E4M3_BF16, PTX_E4M3_F16, PTX_E5M2_BF16, PTX_E5M2_F16

    HAVE_GLUON = True
except Exception:  # noqa: BLE001 - no Gluon in this Triton (or no Triton): the Triton kernels serve
    HAVE_GLUON = False

BLOCK_N = 64  # kv slots per tile: wgmma's M for one warpgroup
LANES_A = 512  # the power-of-two head block every production layout has (V is its first ``lanes`` lanes)
ROPE_LANES = (0, 64)  # the remainder blocks it takes: none (512+0) or the rope lanes (512+64, 448+64)
DTYPES = (torch.float16, torch.bfloat16)
_FLAGS = ["ragged", "has_len", "has_sink", "lanes", "splits", "width"]


class Sm90Config(NamedTuple):
    """Resident kv tiles (``stages`` - 1 gathers in flight under the products), rope buffering, score chains."""

    stages: int = 2
    rope1: bool = False  # one rope-lane buffer instead of one per stage: 3 stages fit at 512+64
    ablate: int = 0  # timing experiments only (see _attend): 0 for real work
    chains: int = 1  # independent accumulators for the scores: 1, or 2 (two 256-lane halves)
    pipe: bool = False  # tile t - 1's P·V under tile t's softmax (_attend_pipe): 3 stages, D = 512 only


PREFILL_SM90 = Sm90Config(2, chains=2)  # picked on an H200 (docs/benchmarks.md, session 3)
PREFILL_WARP_SPECIALISED = True  # the prefill's default is warp-specialised (ws_module; faster on an H200)
DECODE_SM90 = Sm90Config(2)  # the partial kernel at D = 576 (512+64)
# At D = 512 (512+0, and 448+64, whose rope lanes sit in the 512-lane block) three stages fit, and
# tile t - 1's P·V runs under tile t's softmax: kernel time at 16 rows 14.10-14.24 -> 13.95-14.05 µs,
# at 2 rows 8.38-8.45 -> 8.22-8.29 (S9-2 to S9-4; docs/benchmarks.md).
DECODE_SM90_D512 = Sm90Config(3, pipe=True)
# An fp8 pool: its stages hold bytes (36 KB a 576-lane tile), converted into one q-dtype tile per tile (S24).
DECODE_SM90_FP8 = Sm90Config(3)
DECODE_WARP_SPECIALISED = False  # warp-specialised partials: slower than this module's kernel at 2-16 rows (S4, S5)
DECODE_PER_SM = {2: 1, 3: 1}  # programs per multiprocessor that fit in shared memory (168, 225 KB each)
# The decode's partials in q's dtype (fp16/bf16), as FlashInfer keeps its split-KV states: the reduce
# reads half the bytes. Kernel time 15.4-15.5 -> 15.0-15.1 µs at 16 rows, 9.1-9.5 -> 8.8-8.9 at 2 (S8-2..S8-4);
# rel err 2.2e-3 against 1.9e-3 (each partial is a convex mix of v, so it stays in v's range).
DECODE_PARTIALS_16BIT = True


def decode_config(args: KernelArgs) -> Sm90Config:
    """The partial kernel's default for a call's layout: pipelined at D = 512, two stages at D = 576; for an fp8
    pool ``DECODE_SM90_FP8``."""
    if args.kv.dtype != args.q.dtype:
        return DECODE_SM90_FP8
    return DECODE_SM90_D512 if int(args.q.shape[2]) == LANES_A else DECODE_SM90


def supports(args: KernelArgs, *, fp8: bool = False) -> bool:
    """True for the calls this kernel takes: a CUDA sm_90 device, fp16/bf16, D of 512 or 576, lanes <= 512.

    The pool is in q's dtype, or with ``fp8`` (the split-K decode: ``supports_decode``) an fp8 format
    ``fp8_ptx`` converts beside q's.
    """
    q, kv, out = args.q, args.kv, args.output
    if not HAVE_GLUON:
        return False
    same = kv.dtype == q.dtype or (fp8 and (kv.dtype, q.dtype) in ASM_MODES)
    if q.dtype not in DTYPES or not same or q.shape[2] - LANES_A not in ROPE_LANES:
        return False
    if kv.shape[1] != 1 or kv.stride(2) != 1 or q.stride(2) != 1 or out.shape[2] > LANES_A:
        return False
    # The gather copies 16-byte vectors, which Triton emits only when it knows each kv row starts
    # 16-byte aligned: a base pointer and row stride that are multiples of 16 (it specialises on both).
    if kv.stride(0) % 16 or kv.data_ptr() % 16:
        return False
    if q.stride(0) % 16 or q.stride(1) % 16 or q.data_ptr() % 16:  # q is copied the same way
        return False
    return _on_hopper(q)  # last: it asks the driver


def supports_decode(args: KernelArgs) -> bool:
    """``supports`` for the split-K decode, whose partial kernel also reads fp8 pools (session 24)."""
    return supports(args, fp8=True)


def supports_prefill(args: KernelArgs) -> bool:
    """``supports`` for the default (warp-specialised) prefill, which also reads fp8 pools (session 25)."""
    return supports(args, fp8=PREFILL_WARP_SPECIALISED)


def _on_hopper(t: torch.Tensor) -> bool:
    """An NVIDIA GPU of compute capability 9.0 (H100, H200, H20, GH200): the wgmma these kernels need (cached)."""
    return t.device.type == "cuda" and torch.version.hip is None and device_capability(t.device) == (9, 0)


if HAVE_GLUON:

    @gluon.jit
    def _row_span(idx_ptr, idx_s0, idx_s1, width, indptr_ptr, row, ragged):
        """(int64 offset of the row's first index, the row's positions): the dense width, or the ragged segment."""
        row64 = row.to(gl.int64)
        base = row64 * idx_s0
        seg = width.to(gl.int64)
        if ragged != 0:
            start = gl.load(indptr_ptr + row64).to(gl.int64)
            base = start * idx_s1
            seg = gl.load(indptr_ptr + row64 + 1).to(gl.int64) - start
        return base, seg.to(gl.int32)

    @gluon.jit
    def _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK: gl.constexpr):
        """The row's length in positions, as ``triton_prefill.row_bounds``: topk_length, else the count of indices >= 0.

        Only the softmax needs it: the kernels split and gather by the row's width, so this runs
        while the first gathers are in flight instead of before them. ``_attend`` issues the same loads
        (``_row_len_start``) and reduces them (``_row_len_finish``) apart; written as those two, this
        one compiled differently in the warp-specialised kernels (a 16-byte spill at 512+64).
        """
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        n = seg
        if has_len != 0:
            n = gl.minimum(gl.load(len_ptr + row.to(gl.int64) * len_s0).to(gl.int32), seg)
        elif ragged == 0:  # dense without topk_length: the count of indices >= 0
            cnt = gl.zeros([CNT_BLOCK], gl.int32, lay)
            for j0 in range(0, seg, CNT_BLOCK):
                offs = j0 + gl.arange(0, CNT_BLOCK, lay)
                v = gl.load(idx_ptr + base + offs.to(gl.int64) * idx_s1, mask=offs < seg, other=-1)
                cnt += (v >= 0).to(gl.int32)
            n = gl.sum(cnt, axis=0)
        return gl.maximum(n, 0)

    @gluon.jit
    def _row_len_start(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK: gl.constexpr):
        """``_row_len``'s loads, issued now and reduced later by ``_row_len_finish``: (topk_length, or 0 without
        it; a dense row's first CNT_BLOCK slot numbers, or -1s)."""
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = gl.arange(0, CNT_BLOCK, lay)
        count = (has_len == 0) & (ragged == 0)
        first = gl.load(idx_ptr + base + offs.to(gl.int64) * idx_s1, mask=(offs < seg) & count, other=-1)
        given = gl.load(len_ptr + row.to(gl.int64) * len_s0, mask=has_len != 0, other=0)
        return given, first

    @gluon.jit
    def _row_len_finish(given, first, idx_ptr, base, idx_s1, seg, ragged, has_len, CNT_BLOCK: gl.constexpr):
        """The row's length from ``_row_len_start``'s loads, as ``_row_len`` gives it (rows wider than CNT_BLOCK
        load the rest here)."""
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        n = seg
        if has_len != 0:
            n = gl.minimum(given.to(gl.int32), seg)
        elif ragged == 0:
            cnt = (first >= 0).to(gl.int32)
            for j0 in range(CNT_BLOCK, seg, CNT_BLOCK):
                offs = j0 + gl.arange(0, CNT_BLOCK, lay)
                v = gl.load(idx_ptr + base + offs.to(gl.int64) * idx_s1, mask=offs < seg, other=-1)
                cnt += (v >= 0).to(gl.int32)
            n = gl.sum(cnt, axis=0)
        return gl.maximum(n, 0)

    @gluon.jit
    def _prefetch_span(idx_ptr, base, idx_s1, lo, hi):
        """Ask L1 for the slot numbers of positions [lo, min(hi, lo + 256)): one ``prefetch.global.L1`` a slot.

        Without topk_length the count of valid indices loads the whole row (``_row_len``), and the
        later tiles' slot loads hit L1. With topk_length or ragged indices nothing did, and the
        2-stage decode at 512+64 took 0.6 µs longer at 16 rows (S10-7, S11-1): each later tile's
        slot load queued behind every program's gathers. Issued before the first gathers, this
        returns nothing and waits for nothing. The warp-specialised loaders ask for each item's
        slot numbers this way, 256 at a time, with or without lengths (S11-7).
        """
        lay: gl.constexpr = gl.BlockedLayout([2], [32], [4], [0])
        if lo < hi:  # an empty split asks for nothing: position lo may be past the row, even past the tensor
            offs = lo + gl.arange(0, 256, lay)
            ptrs = idx_ptr + base + gl.where(offs < hi, offs, lo).to(gl.int64) * idx_s1  # lanes past hi: lo again
            gl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=gl.int32,
                                      is_pure=False, pack=1)

    @gluon.jit
    def _load_slots(idx_ptr, base, idx_s1, j0, hi, layout: gl.constexpr):
        """The BLOCK_N slot numbers of positions [j0, j0 + BLOCK_N), -1 past ``hi``."""
        offs = j0 + gl.arange(0, 64, layout)
        return gl.load(idx_ptr + base + offs.to(gl.int64) * idx_s1, mask=offs < hi, other=-1)

    @gluon.jit
    def _gather(kv_ptr, kv_s0, slots, skv, buf, lane0: gl.constexpr, LANES: gl.constexpr, layout: gl.constexpr):
        """Start the cp.async gather of lanes [lane0, lane0 + LANES) of one tile's kv rows; invalid slots zero-filled."""
        slot = slots.to(gl.int64)
        valid = (slot >= 0) & (slot < skv)
        krow = kv_ptr + gl.where(valid, slot, 0) * kv_s0
        offs = lane0 + gl.arange(0, LANES, gl.SliceLayout(0, layout))
        cp_async(buf, krow[:, None] + offs[None, :], mask=valid[:, None])

    @gluon.jit
    def _valid(idx_ptr, base, idx_s1, j0, hi, skv, layout: gl.constexpr):
        """Which of the tile's 64 positions hold a usable slot, in ``layout`` (the score rows' layout)."""
        slot = _load_slots(idx_ptr, base, idx_s1, j0, hi, layout).to(gl.int64)
        return (slot >= 0) & (slot < skv)

    @gluon.jit
    def _copy_q(qa_smem, qb_smem, q_ptr, q_s0, q_s1, H, row, h0, DB: gl.constexpr):
        """Start the cp.async copy of q's 16 heads (512 lanes, then DB rope lanes) into shared memory."""
        cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(1, cp))
        q_row = q_ptr + row.to(gl.int64) * q_s0 + offs_h[:, None] * q_s1
        cp_async(qa_smem, q_row + gl.arange(0, 512, gl.SliceLayout(0, cp))[None, :], mask=(offs_h < H)[:, None])
        if DB > 0:
            cp_async(qb_smem, q_row + (512 + gl.arange(0, DB, gl.SliceLayout(0, cp)))[None, :],
                     mask=(offs_h < H)[:, None])

    @gluon.jit
    def _stamp(trace_ptr, slot, TRACE: gl.constexpr):
        """With TRACE (timing experiments only), the SM's cycle counter into ``trace_ptr[slot]``."""
        if TRACE:
            c = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            gl.store(trace_ptr + slot, c)

    @gluon.jit
    def _softmax_tile(s, ok, m, l_acc, sm_scale2):
        """One tile's online-softmax step on Sᵀ [64 slots, 16 heads]: (m, l_acc, alpha, P), base 2."""
        s = gl.where(ok[:, None], s * sm_scale2, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, axis=0))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m - m_safe)
        p = gl.exp2(s - m_safe[None, :])
        return m_new, l_acc * alpha[None, :] + p, alpha, p

    @gluon.jit
    def _convert_tile(src_a, dst_a, src_b, dst_b, DB: gl.constexpr, KV8: gl.constexpr, CW: gl.constexpr = 256):
        """One landed tile's fp8 bytes (``src_*``, uint8) into its q-dtype tile (``dst_*``), exactly (``fp8_ptx``);
        fenced and barriered, so wgmma may read it next."""
        lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        for c in gl.static_range(512 // CW):  # CW lanes at a time: two halves, each held in registers whole
            x = src_a.slice(c * CW, CW, dim=1).load(lay)
            dst_a.slice(c * CW, CW, dim=1).store(_fp8_to(x, KV8))
        if DB > 0:
            dst_b.store(_fp8_to(src_b.load(lay), KV8))
        fence_async_shared()
        cta_barrier()

    @gluon.jit
    def _fp8_to(x, KV8: gl.constexpr):
        """fp8 bytes to q's dtype by ``fp8_ptx``'s PTX for mode KV8 (side effects declared: converted where loaded)."""
        if KV8 == 1:
            y = gl.inline_asm_elementwise(PTX_E4M3_BF16, "=r,=r,r", [x], dtype=gl.bfloat16, is_pure=False, pack=4)
        elif KV8 == 2:
            y = gl.inline_asm_elementwise(PTX_E5M2_BF16, "=r,=r,r", [x], dtype=gl.bfloat16, is_pure=False, pack=4)
        elif KV8 == 3:
            y = gl.inline_asm_elementwise(PTX_E4M3_F16, "=r,=r,r", [x], dtype=gl.float16, is_pure=False, pack=4)
        else:
            y = gl.inline_asm_elementwise(PTX_E5M2_F16, "=r,=r,r", [x], dtype=gl.float16, is_pure=False, pack=4)
        return y

    @gluon.jit
    def _attend(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, seg, base, idx_s1, skv, H, sm_scale2,
                q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK: gl.constexpr, DB: gl.constexpr, STAGES: gl.constexpr, ROPE1: gl.constexpr,
                ABLATE: gl.constexpr, CHAINS: gl.constexpr, trace_ptr=None, TRACE: gl.constexpr = False,
                KV8: gl.constexpr = 0):
        """Online softmax over positions [lo, hi) of one row for 16 heads: (m, l, Oᵀ), base 2, Oᵀ [512, 16] fp32.

        Positions at or past the row's length (``_row_len``) are gathered where they hold a slot
        but masked out of the softmax. The prologue asks for the first tile's slot numbers before
        anything else, and the length's loads go out with the first gathers but are reduced only
        under tile 0's scores, so the loop's set-up runs while they are in flight (S17: 0.3-0.45 µs
        off the 16-row decode at 512+64).

        STAGES tiles of the 512 lanes are resident: while one is computed, STAGES - 1 gathers are in
        flight. The DB rope lanes have a buffer per stage, or with ROPE1 a single one, refilled for
        the next tile as soon as this tile's scores are done; that is what lets three stages fit in
        shared memory at 512+64. ABLATE (timing experiments only; wrong answers): 1 gathers only the
        prologue's tiles and computes on stale data, 2 gathers and skips the products.

        KV8 (an ``fp8_ptx`` mode; the pool then holds fp8 bits, read as uint8): the stages hold the
        tiles' bytes, and each landed tile is converted into one q-dtype tile the products read.
        """
        dt: gl.constexpr = q_ptr.dtype.element_ty
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16-byte vectors, 128 B per row
        cp8: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # fp8 bytes: 16-byte vectors, 64 B a row
        gcp: gl.constexpr = cp8 if KV8 else cp  # the gathers' layout
        rows_cp: gl.constexpr = gl.SliceLayout(1, gcp)
        rows_s: gl.constexpr = gl.SliceLayout(1, mma)
        RB: gl.constexpr = 1 if ROPE1 else STAGES  # rope buffers
        LATE: gl.constexpr = ROPE1 and DB > 0  # gathers issued once this tile's scores are done
        AHEAD: gl.constexpr = STAGES - 1  # tiles the prologue starts
        gl.static_assert(STAGES >= 2, "at least two stages: one computed, one gathering")
        gl.static_assert(not (KV8 and LATE), "an fp8 pool keeps a rope buffer per stage")
        TILES: gl.constexpr = 1 if KV8 else STAGES  # q-dtype tiles the products read
        kv_a = gl.allocate_shared_memory(dt, [TILES, 64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        kv_b = kv_a
        if DB > 0:
            kv_b = gl.allocate_shared_memory(dt, [1 if KV8 else RB, 64, DB],
                                             gl.NVMMASharedLayout.get_default_for([64, DB], dt))
        g_a = kv_a  # what the gathers fill: the tiles themselves, or with KV8 their bytes
        g_b = kv_b
        if KV8:
            raw: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
            g_a = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 512], raw)
            if DB > 0:
                g_b = gl.allocate_shared_memory(gl.uint8, [RB, 64, DB], raw)
        p_smem = gl.allocate_shared_memory(dt, [64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], dt))
        qa_smem = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        qb_smem = qa_smem
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dt, [16, DB], gl.NVMMASharedLayout.get_default_for([16, DB], dt))
        # The first tile's slot numbers head the chain every tile waits on (their load, then the gather,
        # then the products): they are asked for before anything else is issued (S17).
        sl0 = _load_slots(idx_ptr, base, idx_s1, lo, hi, rows_cp)
        # q: 16 heads, resident in shared memory for every tile (wgmma's B operand, as qᵀ), copied by
        # cp.async ahead of the first gathers, in their commit group: a plain load is scheduled after
        # the gathers' issue and queues behind every program's gathers (S5-1: 17% of the decode's time
        # went to waiting for it).
        _copy_q(qa_smem, qb_smem, q_ptr, q_s0, q_s1, H, row, h0, DB)
        m = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
        l_acc = gl.zeros([64, 16], gl.float32, mma)  # per-thread partial sums: reduced once, at the end
        o = gl.zeros([512, 16], gl.float32, mma)
        s0 = gl.zeros([64, 16], gl.float32, mma)
        n_tiles = gl.cdiv(hi - lo, 64)

        if (has_len != 0) | (ragged != 0):  # no count will load the row's slot numbers: this split's into L1
            _prefetch_span(idx_ptr, base, idx_s1, lo, hi)
        for i in gl.static_range(AHEAD):  # prologue: the first tiles in flight, one commit group each
            if i == 0:
                sl = sl0
            else:
                sl = _load_slots(idx_ptr, base, idx_s1, lo + i * 64, hi, rows_cp)
            _gather(kv_ptr, kv_s0, sl, skv, g_a.index(i), 0, 512, gcp)
            if DB > 0:
                if i < RB:
                    _gather(kv_ptr, kv_s0, sl, skv, g_b.index(i), 512, DB, gcp)
            async_copy.commit_group()
        _stamp(trace_ptr, 1, TRACE)  # the prologue's copies issued
        slots = _load_slots(idx_ptr, base, idx_s1, lo + AHEAD * 64, hi, rows_cp)
        # The row's length is loaded here but reduced only once tile 0's scores are issued: reduced here,
        # the warps waited for it and only then ran the loop's set-up, about 0.3 µs after tile 0 had
        # landed (S17). Positions [lim, hi) are past the row's length.
        given, first = _row_len_start(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK)
        lim = hi  # until the length is known, in tile 0
        for t in range(n_tiles):
            stage = t % STAGES
            async_copy.wait_group(STAGES - 2)  # this thread's copies of tile t have landed
            fence_async_shared()
            cta_barrier()  # everyone's copies of tile t landed, and every warp is done with tile t - 1
            _stamp(trace_ptr, 3 + 2 * gl.minimum(t, 7), TRACE)  # tile t landed
            if not LATE:  # refill the stage tile t - 1 used
                if ABLATE != 1:
                    if t + STAGES - 1 < n_tiles:
                        g = (t + STAGES - 1) % STAGES
                        _gather(kv_ptr, kv_s0, slots, skv, g_a.index(g), 0, 512, gcp)
                        if DB > 0:
                            _gather(kv_ptr, kv_s0, slots, skv, g_b.index(g), 512, DB, gcp)
                async_copy.commit_group()
                slots = _load_slots(idx_ptr, base, idx_s1, lo + (t + STAGES) * 64, hi, rows_cp)

            if KV8:  # tile t's bytes into the q-dtype tile (every warp is past tile t - 1's products)
                # An index the compiler cannot see is 0: with a constant one it hoists every wgmma descriptor
                # of the tile out of the loop and keeps them in registers, which spills (400 bytes of stack).
                z = gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
                ka = kv_a.index(z)
                kb = kv_b.index(z)
                _convert_tile(g_a.index(stage), ka, g_b.index(t % RB), kb, DB, KV8)
            else:
                ka = kv_a.index(stage)
                kb = kv_b.index(t % RB)
            if ABLATE != 2:
                if CHAINS == 1:
                    s = warpgroup_mma(ka, qa_smem.permute((1, 0)), s0, use_acc=False, is_async=True)
                else:  # independent accumulators over halves of the 512 lanes, summed after
                    s = warpgroup_mma(ka.slice(0, 256, dim=1), qa_smem.slice(0, 256, dim=1).permute((1, 0)), s0,
                                      use_acc=False, is_async=True)
                    s2 = warpgroup_mma(ka.slice(256, 256, dim=1), qa_smem.slice(256, 256, dim=1).permute((1, 0)),
                                       s0, use_acc=False, is_async=True)
                if DB > 0:
                    s = warpgroup_mma(kb, qb_smem.permute((1, 0)), s, is_async=True)
            # under tile t's scores: the row's length (tile 0), which of the tile's positions count
            if t == 0:
                lim = gl.minimum(hi, _row_len_finish(given, first, idx_ptr, base, idx_s1, seg, ragged, has_len,
                                                     CNT_BLOCK))
                _stamp(trace_ptr, 2, TRACE)  # the row's length known
            ok = _valid(idx_ptr, base, idx_s1, lo + t * 64, lim, skv, rows_s)
            if ABLATE != 2:
                if CHAINS == 1:
                    s = warpgroup_mma_wait(0, deps=(s,))
                else:
                    s, s2 = warpgroup_mma_wait(0, deps=(s, s2))
                    s = s + s2
                m, l_acc, alpha, p = _softmax_tile(s, ok, m, l_acc, sm_scale2)
                p_smem.store(p.to(dt))
                fence_async_shared()
            cta_barrier()  # P written; every warp is done with this tile's rope lanes
            if LATE:  # the next tile's rope lanes, then the stage tile t - 1 used
                if ABLATE != 1:
                    if t + 1 < n_tiles:
                        _gather(kv_ptr, kv_s0, _load_slots(idx_ptr, base, idx_s1, lo + (t + 1) * 64, hi, rows_cp),
                                skv, kv_b.index(0), 512, DB, cp)
                async_copy.commit_group()
                if ABLATE != 1:
                    if t + STAGES - 1 < n_tiles:
                        _gather(kv_ptr, kv_s0, slots, skv, kv_a.index((t + STAGES - 1) % STAGES), 0, 512, cp)
                async_copy.commit_group()
                slots = _load_slots(idx_ptr, base, idx_s1, lo + (t + STAGES) * 64, hi, rows_cp)
            if ABLATE != 2:
                o = o * alpha[None, :]
                o = warpgroup_mma(ka.permute((1, 0)), p_smem, o, is_async=True)
                o = warpgroup_mma_wait(0, deps=(o,))
            _stamp(trace_ptr, 4 + 2 * gl.minimum(t, 7), TRACE)  # tile t's products done
        async_copy.wait_group(0)
        return m, gl.sum(l_acc, axis=0), o

    @gluon.jit
    def _refill_pipe(kv_ptr, kv_s0, slots, skv, kv_a, idx_ptr, base, idx_s1, lo, hi, t, n_tiles, cp: gl.constexpr):
        """Tile t + 1 into the stage tile t - 2 used (one commit group); the slots of tile t + 2."""
        if t + 1 < n_tiles:
            _gather(kv_ptr, kv_s0, slots, skv, kv_a.index((t + 1) % 3), 0, 512, cp)
        async_copy.commit_group()
        return _load_slots(idx_ptr, base, idx_s1, lo + (t + 2) * 64, hi, gl.SliceLayout(1, cp))

    @gluon.jit
    def _attend_pipe(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, seg, base, idx_s1, skv, H, sm_scale2,
                     q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK: gl.constexpr, DB: gl.constexpr,
                     trace_ptr=None, TRACE: gl.constexpr = False):
        """``_attend`` with tile t - 1's P·V on the tensor cores while tile t's softmax runs.

        Three stages: tile t - 1 (its P·V in flight), tile t (its scores) and tile t + 1 (gathering,
        one tile ahead as in ``_attend``). Per tile: the scores are issued, then the previous tile's
        P·V; the scores' wait leaves P·V running under the exponentials; then P·V's wait, Oᵀ's
        rescale and P's store into the other of two P buffers. Three stages fit in shared memory
        only at D = 512 (512+0, 448+64), not with a separate rope block (512+64).
        """
        gl.static_assert(DB == 0, "three stages of 576 lanes do not fit in shared memory")
        dt: gl.constexpr = kv_ptr.dtype.element_ty
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_cp: gl.constexpr = gl.SliceLayout(1, cp)
        rows_s: gl.constexpr = gl.SliceLayout(1, mma)
        kv_a = gl.allocate_shared_memory(dt, [3, 64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        p_smem = gl.allocate_shared_memory(dt, [2, 64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], dt))
        qa_smem = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        _copy_q(qa_smem, qa_smem, q_ptr, q_s0, q_s1, H, row, h0, 0)
        m = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
        l_acc = gl.zeros([64, 16], gl.float32, mma)
        o = gl.zeros([512, 16], gl.float32, mma)
        s0 = gl.zeros([64, 16], gl.float32, mma)
        n_tiles = gl.maximum(gl.cdiv(hi - lo, 64), 1)  # an empty split runs one masked tile: m -inf, l 0, Oᵀ 0

        _gather(kv_ptr, kv_s0, _load_slots(idx_ptr, base, idx_s1, lo, hi, rows_cp), skv, kv_a.index(0), 0, 512, cp)
        async_copy.commit_group()
        _stamp(trace_ptr, 1, TRACE)  # the prologue's copies issued
        slots = _load_slots(idx_ptr, base, idx_s1, lo + 64, hi, rows_cp)
        n = _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK)
        lim = gl.minimum(hi, n)
        ok = _valid(idx_ptr, base, idx_s1, lo, lim, skv, rows_s)
        _stamp(trace_ptr, 2, TRACE)  # the row's length known
        # Tile 0: its scores and softmax, nothing before it to overlap.
        ok_next = _valid(idx_ptr, base, idx_s1, lo + 64, lim, skv, rows_s)
        async_copy.wait_group(0)
        fence_async_shared()
        cta_barrier()
        _stamp(trace_ptr, 3, TRACE)  # tile 0 landed
        slots = _refill_pipe(kv_ptr, kv_s0, slots, skv, kv_a, idx_ptr, base, idx_s1, lo, hi, 0, n_tiles, cp)
        s = warpgroup_mma(kv_a.index(0), qa_smem.permute((1, 0)), s0, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        m, l_acc, alpha, p = _softmax_tile(s, ok, m, l_acc, sm_scale2)
        p_smem.index(0).store(p.to(dt))
        fence_async_shared()
        _stamp(trace_ptr, 4, TRACE)  # tile 0's scores and softmax done
        ok = ok_next
        for t in range(1, n_tiles):
            ok_next = _valid(idx_ptr, base, idx_s1, lo + (t + 1) * 64, lim, skv, rows_s)
            async_copy.wait_group(0)  # this thread's copies of tile t have landed
            fence_async_shared()
            cta_barrier()  # tile t landed everywhere; P(t - 1) written; tile t - 2's P·V done in every warp
            _stamp(trace_ptr, 3 + 2 * gl.minimum(t, 7), TRACE)  # tile t landed
            slots = _refill_pipe(kv_ptr, kv_s0, slots, skv, kv_a, idx_ptr, base, idx_s1, lo, hi, t, n_tiles, cp)
            s = warpgroup_mma(kv_a.index(t % 3), qa_smem.permute((1, 0)), s0, use_acc=False, is_async=True)
            # tile t - 1's P·V, queued behind the scores: it runs under this tile's softmax
            o = warpgroup_mma(kv_a.index((t + 2) % 3).permute((1, 0)), p_smem.index((t + 1) % 2), o, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s,))
            m, l_acc, alpha, p = _softmax_tile(s, ok, m, l_acc, sm_scale2)
            o = warpgroup_mma_wait(0, deps=(o,))
            o = o * alpha[None, :]
            p_smem.index(t % 2).store(p.to(dt))
            fence_async_shared()
            _stamp(trace_ptr, 4 + 2 * gl.minimum(t, 7), TRACE)  # tile t's scores and softmax done
            ok = ok_next
        cta_barrier()  # the last P written everywhere
        last = n_tiles - 1
        o = warpgroup_mma(kv_a.index(last % 3).permute((1, 0)), p_smem.index(last % 2), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=(o,))
        async_copy.wait_group(0)
        return m, gl.sum(l_acc, axis=0), o

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # Triton 3.9's name for 3.6's _reinterpret

        @gluon.jit
        def _p_view(rp, j):
            """P of buffer j's tile (64 slots x 16 heads, wgmma's B operand for P·V): the buffer's first 2 KB."""
            return rp.index(j).reinterpret(rp.dtype, [64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], rp.dtype))
    else:

        @gluon.jit
        def _p_view(rp, j):
            return rp.index(j)._reinterpret(rp.dtype, [64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], rp.dtype))

    @gluon.jit
    def _store_t(o_ptr, row_off, offs_h, o_s1, o_s2, lanes, hmask, o, scale, lane0: gl.constexpr = 0):
        """Write Oᵀ · scale (per head) into lanes < ``lanes`` of 16 output rows, cast to the pointer's type.

        Oᵀ holds lanes [lane0, lane0 + its rows): all 512, or one half of them.
        """
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        offs_f = lane0 + gl.arange(0, o.shape[0], gl.SliceLayout(1, mma))
        ptrs = o_ptr + row_off + offs_f[:, None] * o_s2 + offs_h[None, :] * o_s1
        val = (o * scale[None, :]).to(o_ptr.dtype.element_ty)
        gl.store(ptrs, val, mask=(offs_f < lanes)[:, None] & hmask[None, :])

    @gluon.jit
    def _store_partial(o_ptr, part0, h0, H, o_ld, o, inv):
        """The split-K partial Oᵀ · inv into rows ``part0 + h0 + i`` (16 heads, i < 16, h0 + i < H) of ``o_ld``
        lanes, in the buffer's dtype.

        ``o_ld`` (the partials' row length, the output's lanes) is a specialised argument: known to be
        a multiple of 16, it lets the stores be vectors of 4 lanes (8 bytes in 16 bits, 16 in fp32).

        The accumulator's layout gives each thread two heads of a lane, so a direct store writes 4
        bytes per 32-byte sector; through shared memory (the tiles' buffers are dead by now) each
        warp writes 128 lanes of one head at once. The row ids are built in that layout, not converted
        to it: each conversion of a 16-vector is a round trip through shared memory with two barriers.
        """
        rows: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])  # lanes fastest, 4 per thread
        val = gl.convert_layout((o * inv[None, :]).to(o_ptr.dtype.element_ty), rows)  # 16-bit: half the shuffle
        offs_f = gl.arange(0, 512, gl.SliceLayout(1, rows))
        offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(0, rows))
        ptrs = o_ptr + (part0 + offs_h)[None, :] * o_ld + offs_f[:, None]
        gl.store(ptrs, val, mask=(offs_f < o_ld)[:, None] & (offs_h < H)[None, :])

    @gluon.jit
    def _final_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink):
        """Each head's output factor: the sink joins the max and adds mass with no value, then 1/l; 0 if empty.

        Absent, the sink loads as -inf and changes nothing (as ``triton_prefill.finish_scale``).
        """
        sink = gl.load(sink_ptr + offs_h * sink_s0, mask=hmask & ((offs_h * 0 + has_sink) != 0), other=float("-inf"))
        sink = sink.to(gl.float32) * 1.4426950408889634
        m_fin = gl.maximum(m, sink)
        m_safe = gl.where(m_fin == float("-inf"), 0.0, m_fin)
        alpha = gl.exp2(m - m_safe)
        l = l * alpha + gl.exp2(sink - m_safe)
        return gl.where(l > 0.0, alpha / gl.where(l > 0.0, l, 1.0), 0.0)

    @gluon.jit(do_not_specialize=_FLAGS)
    def _prefill_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr,
                        skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                        q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                        DB: gl.constexpr, STAGES: gl.constexpr, ROPE1: gl.constexpr, ABLATE: gl.constexpr,
                        CHAINS: gl.constexpr, CNT_BLOCK: gl.constexpr, PIPE: gl.constexpr = False):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        row = gl.program_id(0)
        h0 = gl.program_id(1) * 16
        base, seg = _row_span(idx_ptr, idx_s0, idx_s1, width, indptr_ptr, row, ragged)
        if PIPE:
            m, l, o = _attend_pipe(q_ptr, kv_ptr, idx_ptr, row, h0, 0, seg, seg, base, idx_s1, skv, H, sm_scale2,
                                   q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK, DB)
        else:
            m, l, o = _attend(q_ptr, kv_ptr, idx_ptr, row, h0, 0, seg, seg, base, idx_s1, skv, H, sm_scale2,
                              q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK,
                              DB, STAGES, ROPE1, ABLATE, CHAINS)
        offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(0, mma))
        hmask = offs_h < H
        scale = _final_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
        _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o, scale)

    @gluon.jit(do_not_specialize=_FLAGS)
    def _partial_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, o_ptr, lse_ptr,
                        skv, width, H, sm_scale2, ragged, has_len, lanes, splits,
                        q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, o_ld,
                        DB: gl.constexpr, STAGES: gl.constexpr, ROPE1: gl.constexpr, ABLATE: gl.constexpr,
                        CHAINS: gl.constexpr, CNT_BLOCK: gl.constexpr, PDL: gl.constexpr,
                        PIPE: gl.constexpr = False, trace_ptr=None, TRACE: gl.constexpr = False, KV8: gl.constexpr = 0):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        if TRACE:  # 24 stamps a program: 0-20 clock64 (see _attend), 22/23 globaltimer at the start/end
            trace_ptr += ((gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(2)
                          + gl.program_id(2)) * 24
            gl.store(trace_ptr + 22, gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                                               is_pure=False, pack=1))
            _stamp(trace_ptr, 0, TRACE)
        if PDL:  # the reduce may be scheduled now; it waits for this grid in gdc_wait
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        row = gl.program_id(0)
        split = gl.program_id(1)
        h0 = gl.program_id(2) * 16
        base, seg = _row_span(idx_ptr, idx_s0, idx_s1, width, indptr_ptr, row, ragged)
        chunk = gl.cdiv(gl.cdiv(seg, splits), 64) * 64  # split by the row's width: no count before the gathers
        lo = split * chunk
        hi = gl.minimum(lo + chunk, seg)
        if PIPE:
            m, l, o = _attend_pipe(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, seg, base, idx_s1, skv, H, sm_scale2,
                                   q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK, DB,
                                   trace_ptr, TRACE)
        else:
            m, l, o = _attend(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, seg, base, idx_s1, skv, H, sm_scale2,
                              q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK,
                              DB, STAGES, ROPE1, ABLATE, CHAINS, trace_ptr, TRACE, KV8)
        offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(0, mma))
        hmask = offs_h < H
        inv = gl.where(l > 0.0, 1.0 / gl.where(l > 0.0, l, 1.0), 0.0)
        lse = gl.where(l > 0.0, m + gl.log2(gl.where(l > 0.0, l, 1.0)), float("-inf"))
        part0 = (row.to(gl.int64) * splits + split) * H  # the partial-row id of head 0
        gl.store(lse_ptr + part0 + offs_h, lse, mask=hmask)
        _store_partial(o_ptr, part0, h0, H, o_ld, o, inv)
        if TRACE:
            _stamp(trace_ptr, 20, TRACE)
            gl.store(trace_ptr + 23, gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                                               is_pure=False, pack=1))


def _consts(args: KernelArgs, cfg: Sm90Config, kv8: int = TO) -> dict:
    if cfg.pipe and (cfg.stages != 3 or int(args.q.shape[2]) != LANES_A):
        raise ValueError(f"Sm90Config(pipe=True) needs stages=3 and D = {LANES_A} (no rope lanes); "
                         f"got stages={cfg.stages}, D = {int(args.q.shape[2])}")
    if kv8 != TO and (cfg.pipe or cfg.rope1):
        raise ValueError(f"an fp8 pool takes neither pipe nor rope1; got {cfg}")
    extra = {"KV8": kv8} if kv8 != TO else {}
    return {"DB": int(args.q.shape[2]) - LANES_A, "STAGES": cfg.stages, "ROPE1": cfg.rope1,
            "ABLATE": cfg.ablate, "CHAINS": cfg.chains, "PIPE": bool(cfg.pipe), "num_warps": 4, **extra}


def ws_module(args: KernelArgs):
    """The warp-specialised kernel's module for this call's layout, the faster of two on an H200.

    With rope lanes (512+64) ``gluon_sm90_ws``, whose two rope buffers take each tile's P: 5.48-5.60
    ms at 16,384 rows against 5.85-5.88 for session 4's kernel. At D = 512 (448+64, 512+0: no rope
    buffer) ``gluon_sm90_ws_d512``, session 4's: 4.89-4.91 ms against 5.08-5.12 (S5-1 to S5-5). An fp8 pool
    takes ``gluon_sm90_ws`` at every layout: only it converts one (session 25).
    """
    if int(args.q.shape[2]) - LANES_A > 0 or args.kv.dtype != args.q.dtype:
        from . import gluon_sm90_ws

        return gluon_sm90_ws
    from . import gluon_sm90_ws_d512

    return gluon_sm90_ws_d512


def launch_prefill(args: KernelArgs, *, config: Sm90Config | None = None) -> None:
    """The no-split prefill on Hopper. Call only where ``supports_prefill`` (``supports`` with a ``config``).

    By default a warp-specialised kernel (a loader, two scores+softmax warpgroups and a P·V one,
    one persistent program per SM; ``ws_module`` says which for a layout; an fp8 pool's is ``gluon_sm90_ws``);
    with a ``config``, this module's one-warpgroup kernel, the one the split-K decode's partials use (16-bit
    pools only).
    """
    q, kv, out = args.q, args.kv, args.output
    rows, heads, _ = q.shape
    ws = config is None and PREFILL_WARP_SPECIALISED
    if kv.dtype != q.dtype and not ws:
        raise ValueError(f"the one-warpgroup prefill reads a pool in q's dtype ({q.dtype}), not {kv.dtype}; "
                         "the warp-specialised one (config=None) reads fp8 pools")
    if rows == 0 or heads == 0 or out.shape[2] == 0:
        return
    if ws:
        ws_module(args).launch_prefill_ws(args)
        return
    cfg = config or PREFILL_SM90
    p = pack(args)
    grid = (rows, (heads + HEAD_BLOCK - 1) // HEAD_BLOCK)
    _prefill_kernel[grid](
        q, kv, p.idx, p.length, p.indptr, p.sink, out,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.has_sink, p.lanes,
        q.stride(0), q.stride(1), kv.stride(0), p.idx_s0, p.idx_s1, p.len_s0,
        p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2),
        CNT_BLOCK=count_block(p.width), **_consts(args, cfg),
    )


def launch_partials(args: KernelArgs, part_o: torch.Tensor, part_lse: torch.Tensor, splits: int, *,
                    config: Sm90Config, pdl: bool, trace: torch.Tensor | None = None) -> None:
    """The split-K decode's partial pass on Hopper, into the layout ``triton_decode``'s reduce reads.

    ``trace`` (timing experiments only): int64, 24 per program, filled with cycle stamps (see _attend).
    """
    q = args.q
    rows, heads, _ = q.shape
    p = pack(args)
    kv, kv8 = kv_operand(args.kv, q.dtype)
    if kv8 == TO and kv.dtype != q.dtype:
        raise ValueError(f"no PTX conversion reads a {kv.dtype} pool beside {q.dtype} q here (gluon_sm90.supports)")
    _partial_kernel[(rows, splits, (heads + HEAD_BLOCK - 1) // HEAD_BLOCK)](
        q, kv, p.idx, p.length, p.indptr, part_o, part_lse,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.lanes, splits,
        q.stride(0), q.stride(1), kv.stride(0), p.idx_s0, p.idx_s1, p.len_s0, part_o.stride(2),
        trace_ptr=trace, TRACE=trace is not None,
        CNT_BLOCK=count_block(p.width), PDL=pdl, **_consts(args, config, kv8),
    )


def partial_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The dtype the decode keeps its split-K partials in: q's (16 bits) or fp32 (``DECODE_PARTIALS_16BIT``)."""
    return q_dtype if DECODE_PARTIALS_16BIT else torch.float32


def launch_decode(args: KernelArgs, *, splits: int | None = None, config: Sm90Config | None = None,
                  pdl: bool | None = None, ws: bool | None = None) -> None:
    """The split-K decode on Hopper: partials, then ``triton_decode``'s reduce. Call only where supports().

    The partials come from this module's one-warpgroup kernel by default (``DECODE_WARP_SPECIALISED``
    is False: faster at 2-16 rows, S4), from the warp-specialised kernel (``gluon_sm90_ws``, split
    work items) with ``ws=True``; an explicit ``config`` always means this module's kernel.
    """
    from . import triton_decode

    q, out = args.q, args.output
    rows, heads, _ = q.shape
    if rows == 0 or heads == 0 or out.shape[2] == 0:
        return
    use_ws = (DECODE_WARP_SPECIALISED and config is None) if ws is None else bool(ws)
    cfg = config or decode_config(args)
    p = pack(args)
    head_blocks = (heads + HEAD_BLOCK - 1) // HEAD_BLOCK
    if splits is None:
        width = p.width if not p.ragged else -(-int(p.idx.numel()) // rows)
        splits = triton_decode.choose_splits(rows, head_blocks, width, BLOCK_N, triton_decode.sm_count(q.device),
                                             per_sm=1 if use_ws else DECODE_PER_SM[cfg.stages])
    splits = max(1, min(int(splits), triton_decode.MAX_SPLITS))
    use_pdl = triton_decode.pdl_supported(q.device) if pdl is None else bool(pdl)
    part_o = torch.empty((rows, splits, heads, p.lanes), dtype=partial_dtype(q.dtype), device=q.device)
    part_lse = torch.empty((rows, splits, heads), dtype=torch.float32, device=q.device)
    if use_ws:
        ws_module(args).launch_partials_ws(args, part_o, part_lse, splits, pdl=use_pdl)
    else:
        launch_partials(args, part_o, part_lse, splits, config=cfg, pdl=use_pdl)
    triton_decode.reduce_partials(part_o, part_lse, p, out, splits, use_pdl)
