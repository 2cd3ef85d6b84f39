"""Sparse MLA attention for Hopper with warp specialisation: a loader, two scores+softmax warpgroups, P·V.

``gluon_sm90`` runs gathers, scores, softmax and P·V in one warpgroup, so the tensor cores idle
while it does the softmax and the gathers share its instruction stream. Here four partitions
hand tiles over through mbarriers, FlashAttention-3 style:

- the loader (4 warps) gathers tile t's 512 lanes into stage t % 3 once P·V of tile t - 3 has
  released it, each 256-lane half as soon as that half is free (``STAGE_HALVES``), then its 64
  rope lanes into buffer t % 2 once P·V has read what that buffer held;
- two scores+softmax warpgroups (workers) take alternate tiles of an item, tile t going to
  warpgroup t % 2 with rope buffer t % 2: each computes Sᵀ = KV · qᵀ and the
  online softmax, then writes the tile's P and rescale factors (and, at its last tile of the
  item, its totals) over the rope lanes its scores are done with. One's exponentials and
  hand-over run while the other's scores are on the tensor cores. Only the running max passes
  between them (m_smem), so P·V sees one max sequence; each keeps its own sum;
- the P·V partition (4 warps, the default partition since S14-12) keeps Oᵀ (two 256-lane halves),
  rescales and accumulates, releases each half of the stage as soon as its product is done, then
  the buffer, and writes the output with both warpgroups' totals merged: the attention output
  (the prefill), or a normalised
  partial and its log-sum-exp (the split-K decode's partial pass, which ``triton_decode``'s
  reduce combines).

Three 73.7 KB stages do not fit in 227 KB; three 64 KB stages, two 8 KB buffers that hold first a
tile's rope lanes and then its P, and q do (232,232 bytes). The grid is one program per
multiprocessor, each taking work items (query row, split, head block) pid, pid + grid, ...: the
loader runs on into the next item's tiles while the others finish the current one.

An fp8 pool (e4m3fn, e5m2; session 25) keeps all of that: each tile's bytes land in the upper half of the
q-dtype stage half (and rope buffer) they become, and the softmax warpgroup whose tile it is converts them
there, in place, before its scores (``_expand_half``). 8.8-9.0 ms at 16,384 rows, 512+64, against 12.1-12.4
for the Triton prefill on the same pool; a bf16 pool takes 5.3 (docs/benchmarks.md, session 25).

Same math, arguments and ``supports()`` as ``gluon_sm90`` (``supports_prefill`` for fp8 pools);
``gluon_sm90.ws_module`` picks it for layouts with rope lanes (512+64), and for an fp8 pool at every layout,
for the prefill and for ``launch_decode(ws=True)``'s partials
(slower than the one-warpgroup kernel at 2-16 rows, so not the decode's default). On an H200
(docs/benchmarks.md, session 5): 5.48-5.60 ms at 16,384 rows, 512+64, against 5.85-5.88 for
session 4's kernel (``gluon_sm90_ws_d512``, one rope buffer) in the same runs; at D = 512 it was
3.6-4.6% slower than that one, which therefore keeps D = 512. Stages handed over in halves made
it 0.8-1.9% faster (S13), and P·V as the default partition another 1.9%: 5.35-5.37 ms (S14).
What that time is made of (docs/benchmarks.md, session 14): the products, softmax and hand-overs
alone take 4.82 ms, and add up rather than overlap; the gathers alone 4.31-4.38 ms, at a per-SM
ceiling of about 8.8 TB/s from L2 that follows bytes, not the number or kind of copies.
"""

from __future__ import annotations

import torch

from .common import KernelArgs
from .gluon_sm90 import HAVE_GLUON
from .triton_prefill import HEAD_BLOCK, pack

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                 warpgroup_mma_wait)

    from . import fp8_ptx
    from .gluon_sm90 import (_copy_q, _final_scale, _fp8_to, _gather, _load_slots, _p_view, _prefetch_span,
                              _row_len, _row_span, _store_t, _valid, cta_barrier)

    STAGES = 3
    # Timing experiments only (scripts/gpu/decode_trace.py --ws sets it before the first compile, in its own
    # Triton cache): cycle stamps into ``trace_ptr``, 24 a program, as gluon_sm90's partial kernel writes them.
    # A global because worker partitions take no constexpr arguments (Triton 3.6).
    TRACE = gl.constexpr(False)
    # Timing experiments only (scripts/gpu/ablate_probe.py sets them before the first compile, in its own Triton
    # cache): leave out every gather (the loader only hands stages over), the scores' products (scores zero) or
    # P·V's. Every wait and hand-over stays. Answers are then wrong.
    NO_GATHER = gl.constexpr(False)
    NO_SCORES = gl.constexpr(False)
    NO_PV = gl.constexpr(False)
    NO_RESCALE = gl.constexpr(False)  # P·V leaves Oᵀ unrescaled
    NO_MCHAIN = gl.constexpr(False)  # each softmax warpgroup keeps its own max, waiting for none from the other

    @gluon.jit
    def _stamp(tp, slot):
        if TRACE:
            c = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            gl.store(tp + gl.program_id(0) * 24 + slot, c)

    @gluon.jit
    def _stamp_time(tp, slot):
        if TRACE:
            c = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                          pack=1)
            gl.store(tp + gl.program_id(0) * 24 + slot, c)

    # wgmma's accumulator layout for 64 x 16 per warpgroup, as gluon_sm90's kernels use it
    MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16]))

    @gluon.jit
    def _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged):
        """Work item w: (row, first head, split, offset of the row's first index, row width, positions [lo, hi))."""
        hb = w % n_hb
        rs = w // n_hb
        split = rs % splits
        row = rs // splits
        base, seg = _row_span(idx_ptr, idx_s0, idx_s1, width, indptr_ptr, row, ragged)
        chunk = gl.cdiv(gl.cdiv(seg, splits), 64) * 64  # split by the row's width, as gluon_sm90's partials
        lo = split * chunk
        hi = gl.minimum(lo + chunk, seg)
        return row, hb * 16, split, base, seg, lo, hi

    # Floats of a buffer after its P (P fills the first 512): the rescale factors, then a warpgroup's totals.
    ALPHA = gl.constexpr(512)
    FIN_M = gl.constexpr(528)
    FIN_L = gl.constexpr(544)

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # Triton 3.9's name for 3.6's _reinterpret

        @gluon.jit
        def _vec_view(rp, j, at: gl.constexpr):
            """16 floats of buffer j from float ``at`` on (ALPHA, FIN_M, FIN_L), past the P written there."""
            n: gl.constexpr = rp.shape[1] * rp.shape[2] // 2  # the buffer as floats
            return rp.index(j).reinterpret(gl.float32, [n], gl.SwizzledSharedLayout(1, 1, 1, [0])).slice(at, 16)

        @gluon.jit
        def _as_blocks(buf, n: gl.constexpr):
            """A q-dtype buffer as ``n`` 4 KB blocks of [64, 64] bytes, in order (an fp8 pool's landing view)."""
            return buf.reinterpret(gl.uint8, [n, 64, 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    else:

        @gluon.jit
        def _vec_view(rp, j, at: gl.constexpr):
            n: gl.constexpr = rp.shape[1] * rp.shape[2] // 2
            return rp.index(j)._reinterpret(gl.float32, [n], gl.SwizzledSharedLayout(1, 1, 1, [0])).slice(at, 16)

        @gluon.jit
        def _as_blocks(buf, n: gl.constexpr):
            return buf._reinterpret(gl.uint8, [n, 64, 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))

    _TORCH_NAMES = {"fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16"}

    @gluon.constexpr_function
    def _kv8_mode(kv_ty, q_ty):
        """``fp8_ptx``'s conversion for a pool of element type ``kv_ty`` beside a ``q_ty`` q; TO for a 16-bit pool."""
        if kv_ty == q_ty:
            return fp8_ptx.TO
        return fp8_ptx.MODES_BY_NAME[(_TORCH_NAMES[str(kv_ty)], _TORCH_NAMES[str(q_ty)])]

    # An fp8 pool (session 25): a tile's bytes land inside the q-dtype stage they are converted into, so the
    # stages keep their size and number. ``kv8``/``rp8`` see the stages and rope buffers as 4 KB blocks of
    # [64 slots, 64 lanes] bytes: block 16 s + 8 h + c is bytes [4096 c, 4096 c + 4096) of stage s's half h
    # (its lanes [256 h, 256 h + 256), 32 KB: an NVMMA tile keeps each 64-lane column, 8 KB, contiguous).
    # A half's bytes land in its blocks 4-7, the upper 16 KB, and the rope lanes' in the upper 4 KB of
    # their buffer; the softmax warpgroup whose tile it is converts them where they lie (_expand_half).
    CP8 = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))  # 16 bytes a thread, 64 a row

    @gluon.jit
    def _load_rows(blk, r: gl.constexpr):
        """Slots [32 r, 32 r + 32) of a [64 slots, 64 lanes] block of fp8 bytes: 4 registers a thread."""
        return blk.slice(32 * r, 32, dim=0).load(CP8)

    @gluon.jit
    def _store_rows(x, col, r: gl.constexpr, KV8: gl.constexpr):
        """``_load_rows``'s bytes converted into slots [32 r, 32 r + 32) of a 64-lane q-dtype column ``col``."""
        col.slice(32 * r, 32, dim=0).store(_fp8_to(x, KV8))

    @gluon.jit
    def _expand_half(kv8, b0, dst, KV8: gl.constexpr):
        """Half a stage's fp8 bytes (blocks b0 + 4 .. b0 + 7 of ``kv8``) into its 256 q-dtype lanes ``dst``, in place.

        Column c (lanes 64 c .. 64 c + 63) is written over bytes [8 c, 8 c + 8) KB of the half, and its bytes
        lie in block b0 + 4 + c, bytes [16 + 4 c, 20 + 4 c) KB. Columns 0 and 1 overwrite no byte; column 2
        overwrites blocks 4 and 5, column 3 blocks 6 and 7, so each waits until every thread has read those
        (a barrier of this partition's warps). 32 slots of a block at a time: the softmax warpgroups have
        few registers to spare (two whole blocks in registers spilled 248 bytes at 160 registers). The
        compiler adds a barrier between each store and the next load of the stage."""
        for c in gl.static_range(2):
            for r in gl.static_range(2):
                _store_rows(_load_rows(kv8.index(b0 + 4 + c), r), dst.slice(64 * c, 64, dim=1), r, KV8)
        x3a = _load_rows(kv8.index(b0 + 7), 0)
        x3b = _load_rows(kv8.index(b0 + 7), 1)
        cta_barrier()  # blocks 4, 5 and 7 read
        for r in gl.static_range(2):
            _store_rows(_load_rows(kv8.index(b0 + 6), r), dst.slice(128, 64, dim=1), r, KV8)
        cta_barrier()  # block 6 read
        _store_rows(x3a, dst.slice(192, 64, dim=1), 0, KV8)
        _store_rows(x3b, dst.slice(192, 64, dim=1), 1, KV8)
        fence_async_shared()
        cta_barrier()

    @gluon.jit
    def _expand_rope(src, dst, KV8: gl.constexpr):
        """A tile's 64 fp8 rope lanes (``src``, the upper 4 KB of rope buffer ``dst``) into ``dst``, in place."""
        xa = _load_rows(src, 0)
        xb = _load_rows(src, 1)
        cta_barrier()
        _store_rows(xa, dst, 0, KV8)
        _store_rows(xb, dst, 1, KV8)
        fence_async_shared()
        cta_barrier()

    @gluon.jit
    def _softmax_part(qa_smem, qb_smem, kv_a, rp, kv8, rp8, kv_ptr, m_smem, bars, q_ptr, q_s0, q_s1, H,
                      idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged,
                      has_len, n_items, n_hb, splits, par, tp):
        """One of two scores+softmax warpgroups: the tiles t with t % 2 == par of every item.

        The scores, the exponentials and the P hand-over of consecutive tiles run in the two
        warpgroups at once; only the running max passes from one to the other (m_smem, m_bar), so
        P·V sees one max sequence as with a single softmax. Each keeps its own sum, relative to the
        last max it saw, and writes both beside its last P of the item; P·V merges the two. Warpgroup 0 also writes each item's
        q into shared memory, once both are done with the previous item's (q_free), and tells
        warpgroup 1 (q_ready).

        Buffer ``par`` of ``rp`` is this warpgroup's: the loader gathers its tile's rope lanes there,
        and once the scores are done this warpgroup writes the tile's P and rescale factors over
        them, for P·V, which releases the buffer (rope_empty) to the loader for the warpgroup's
        next tile.
        """
        kv_ready, kv_empty, p_ready, buf_empty, m_ready, rope_ready, q_ready, q_free = bars
        if par == 0:
            _stamp(tp, 21)  # softmax warpgroup 0 starts
        # Worker partitions take no constexpr arguments (Triton 3.6): the rope width comes from q's buffer.
        DB: gl.constexpr = qb_smem.shape[1] if qb_smem.shape[1] != 512 else 0
        HALVES: gl.constexpr = kv_ready.shape[0] == 6  # a barrier pair per stage: its two 256-lane halves
        dt: gl.constexpr = kv_a.dtype
        KV8: gl.constexpr = _kv8_mode(kv_ptr.dtype.element_ty, dt)  # an fp8 pool: this warpgroup converts its tiles
        mma: gl.constexpr = MMA
        rows_s: gl.constexpr = gl.SliceLayout(1, mma)
        heads_l: gl.constexpr = gl.SliceLayout(0, mma)
        s0 = gl.zeros([64, 16], gl.float32, mma)
        gbase = 0  # tiles of this program's earlier items: stage and phase of kv_ready
        c = 0  # tiles this warpgroup has handed to P·V: phase of its buffer's barriers
        cm = 0  # running maxima received from the other warpgroup: phase of its m_bar
        k = 0  # items done
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                      ragged)
            nt = gl.cdiv(gl.maximum(hi - lo, 0), 64)
            if par == 0:  # this item's q, once both warpgroups' scores of the previous item are done with the last
                # one: copied by cp.async, which arrives on Q_READY, so its latency overlaps the count below
                mbarrier.wait(q_free.index(0), (k - 1) & 1, pred=k > 0)
                _copy_q(qa_smem, qb_smem, q_ptr, q_s0, q_s1, H, row, h0, DB)
                async_copy.mbarrier_arrive(q_ready.index(0), increment_count=False)
            # The row's length (one load up to 2048 indices): only the softmax masks need it.
            n = _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, 2048)
            lim = gl.minimum(hi, n)  # positions at or past the row's length are masked out of the softmax
            m = gl.full([16], float("-inf"), gl.float32, heads_l)  # the running max as of this warpgroup's last tile
            l_acc = gl.zeros([64, 16], gl.float32, mma)  # per-thread partial sums relative to m: reduced at the end
            mbarrier.wait(q_ready.index(0), k & 1)
            if par == 0:
                _stamp(tp, 2)  # q in shared memory, the row's length known
            for t in range(par, nt, 2):
                g = gbase + t
                ok = _valid(idx_ptr, base, idx_s1, lo + t * 64, lim, skv, rows_s)
                ka = kv_a.index(g % 3)
                if HALVES:  # each half's product as soon as that half has landed
                    mbarrier.wait(kv_ready.index(2 * (g % 3)), (g // 3) & 1)
                else:
                    mbarrier.wait(kv_ready.index(g % 3), (g // 3) & 1)
                fence_async_shared()
                if NO_SCORES:  # timing experiments: every wait kept
                    if HALVES:
                        mbarrier.wait(kv_ready.index(2 * (g % 3) + 1), (g // 3) & 1)
                    if DB > 0:
                        mbarrier.wait(rope_ready.index(par), c & 1)
                    s_a = s0
                    s_b = s0
                else:  # an fp8 pool: each half converted once landed (the second under the first's product)
                    if KV8 != 0:
                        _expand_half(kv8, 16 * (g % 3), ka.slice(0, 256, dim=1), KV8)
                    s_a = warpgroup_mma(ka.slice(0, 256, dim=1), qa_smem.slice(0, 256, dim=1).permute((1, 0)), s0,
                                        use_acc=False, is_async=True)
                    if HALVES:
                        mbarrier.wait(kv_ready.index(2 * (g % 3) + 1), (g // 3) & 1)
                        fence_async_shared()
                        if KV8 != 0:
                            _expand_half(kv8, 16 * (g % 3) + 8, ka.slice(256, 256, dim=1), KV8)
                    s_b = warpgroup_mma(ka.slice(256, 256, dim=1), qa_smem.slice(256, 256, dim=1).permute((1, 0)),
                                        s0, use_acc=False, is_async=True)
                    if DB > 0:  # the rope lanes' product last: the loader gathered them after the 512 lanes
                        mbarrier.wait(rope_ready.index(par), c & 1)
                        fence_async_shared()
                        if KV8 != 0:
                            _expand_rope(rp8.index(2 * par + 1), rp.index(par), KV8)
                        s_a = warpgroup_mma(rp.index(par), qb_smem.permute((1, 0)), s_a, is_async=True)
                    s_a, s_b = warpgroup_mma_wait(0, deps=(s_a, s_b))
                s = gl.where(ok[:, None], (s_a + s_b) * sm_scale2, float("-inf"))
                tmax = gl.max(s, axis=0)
                m_prev = gl.full([16], float("-inf"), gl.float32, heads_l)  # the max over tiles < t
                if t > 0 and not NO_MCHAIN:
                    mbarrier.wait(m_ready.index(1 - par), cm & 1)
                    m_prev = m_smem.index(1 - par).load(heads_l)
                    cm += 1
                m_new = gl.maximum(m_prev, tmax)
                if t + 1 < nt:  # the other warpgroup's next tile waits for it
                    m_smem.index(par).store(m_new)
                    mbarrier.arrive(m_ready.index(par))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                p = gl.exp2(s - m_safe[None, :])
                l_acc = l_acc * gl.exp2(m - m_safe)[None, :] + p
                m = m_new
                if DB == 0:  # no gather in between: wait until P·V is done with this buffer's previous P
                    mbarrier.wait(buf_empty.index(par), (c & 1) ^ 1)
                _p_view(rp, par).store(p.to(dt))  # over the rope lanes: every warp's product read them (waited)
                _vec_view(rp, par, ALPHA).store(gl.exp2(m_prev - m_safe))  # P·V's Oᵀ moves from max m_prev to m_new
                if t + 2 >= nt:  # this warpgroup's last tile of the item: its totals, relative to its last max
                    _vec_view(rp, par, FIN_M).store(m)
                    _vec_view(rp, par, FIN_L).store(gl.sum(l_acc, axis=0))
                fence_async_shared()
                mbarrier.arrive(p_ready.index(par))
                c += 1
            mbarrier.arrive(q_free.index(0))  # this warpgroup's scores of the item are done with q
            gbase += nt
            k += 1

    @gluon.jit
    def _pv_part(kv_a, rp, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, part_o_ptr, part_lse_ptr, H, lanes,
                 o_s0, o_s1, o_s2, n_items, n_hb, splits, partial, tp):
        """Oᵀ over the item's tiles in order, P from the two softmax warpgroups in turn; their totals merged at the end.

        Each softmax warpgroup's totals (its last max and its sum relative to it) come with its last
        P of the item; a warpgroup with no tile in the item (one tile, or none) contributes nothing.
        """
        kv_ready, kv_empty, p_ready, buf_empty, m_ready, rope_ready, q_ready, q_free = bars
        mma: gl.constexpr = MMA
        heads_l: gl.constexpr = gl.SliceLayout(0, mma)
        HALVES: gl.constexpr = kv_empty.shape[0] == 6
        g = 0
        c0 = 0
        c1 = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                      ragged)
            o = gl.zeros([512, 16], gl.float32, mma)
            o_lo = gl.zeros([256, 16], gl.float32, mma)
            o_hi = gl.zeros([256, 16], gl.float32, mma)
            m0 = gl.full([16], float("-inf"), gl.float32, heads_l)
            m1 = m0
            l0 = gl.zeros([16], gl.float32, heads_l)
            l1 = l0
            nt = gl.cdiv(gl.maximum(hi - lo, 0), 64)
            for t in range(nt):
                j = t % 2
                cj = gl.where(j == 0, c0, c1)
                mbarrier.wait(p_ready.index(j), cj & 1)
                _stamp(tp, 3 + 2 * gl.minimum(t, 7))  # tile t's P ready
                fence_async_shared()
                alpha = _vec_view(rp, j, ALPHA).load(heads_l)
                if NO_PV:  # timing experiments
                    o_lo = o_lo * alpha[None, :]
                    o_hi = o_hi * alpha[None, :]
                    o = o * alpha[None, :]
                    if HALVES:
                        mbarrier.arrive(kv_empty.index(2 * (g % 3)))
                elif HALVES:  # the stage's first half goes back to the loader as soon as its product is done
                    if not NO_RESCALE:
                        o_lo = o_lo * alpha[None, :]
                        o_hi = o_hi * alpha[None, :]
                    kt = kv_a.index(g % 3).permute((1, 0))
                    o_lo = warpgroup_mma(kt.slice(0, 256, dim=0), _p_view(rp, j), o_lo, is_async=True)
                    o_hi = warpgroup_mma(kt.slice(256, 256, dim=0), _p_view(rp, j), o_hi, is_async=True)
                    o_lo = warpgroup_mma_wait(1, deps=(o_lo,))
                    mbarrier.arrive(kv_empty.index(2 * (g % 3)))
                    o_hi = warpgroup_mma_wait(0, deps=(o_hi,))
                else:
                    o = o * alpha[None, :]
                    o = warpgroup_mma(kv_a.index(g % 3).permute((1, 0)), _p_view(rp, j), o, is_async=True)
                    o = warpgroup_mma_wait(0, deps=(o,))
                _stamp(tp, 4 + 2 * gl.minimum(t, 7))  # tile t's P·V done
                if t + 2 >= nt:  # warpgroup j's last tile: its totals
                    if j == 0:
                        m0 = _vec_view(rp, 0, FIN_M).load(heads_l)
                        l0 = _vec_view(rp, 0, FIN_L).load(heads_l)
                    else:
                        m1 = _vec_view(rp, 1, FIN_M).load(heads_l)
                        l1 = _vec_view(rp, 1, FIN_L).load(heads_l)
                mbarrier.arrive(buf_empty.index(j))  # P read: the loader may gather the next rope lanes there
                if HALVES:
                    mbarrier.arrive(kv_empty.index(2 * (g % 3) + 1))
                else:
                    mbarrier.arrive(kv_empty.index(g % 3))
                c0 += 1 - j
                c1 += j
                g += 1
            m = gl.maximum(m0, m1)  # the last tile's running max: Oᵀ is relative to it
            m_safe = gl.where(m == float("-inf"), 0.0, m)
            l = l0 * gl.exp2(m0 - m_safe) + l1 * gl.exp2(m1 - m_safe)
            offs_h = h0 + gl.arange(0, 16, heads_l)
            hmask = offs_h < H
            if partial != 0:  # the split-K decode's partial: Oᵀ / l and the log-sum-exp, for the reduce
                inv = gl.where(l > 0.0, 1.0 / gl.where(l > 0.0, l, 1.0), 0.0)
                lse = gl.where(l > 0.0, m + gl.log2(gl.where(l > 0.0, l, 1.0)), float("-inf"))
                part = (row.to(gl.int64) * splits + split) * H + offs_h  # [16] partial-row ids
                gl.store(part_lse_ptr + part, lse, mask=hmask)
                if HALVES:
                    _store_t(part_o_ptr, 0, part, lanes, 1, lanes, hmask, o_lo, inv)
                    _store_t(part_o_ptr, 0, part, lanes, 1, lanes, hmask, o_hi, inv, 256)
                else:
                    _store_t(part_o_ptr, 0, part, lanes, 1, lanes, hmask, o, inv)
            else:
                scale = _final_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
                if HALVES:
                    _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o_lo, scale)
                    _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o_hi, scale, 256)
                else:
                    _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o, scale)
            _stamp(tp, 20)
            _stamp_time(tp, 23)

    @gluon.jit
    def _load_part(kv_a, rp, kv8, rp8, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged,
                   skv, n_items, n_hb, splits, tp):
        """Each tile's 512 lanes into stage g % 3 once P·V has released it, then its rope lanes into buffer t % 2.

        Each item's slot numbers are asked of L1 first, so the tiles' loads of them do not wait on L2.
        """
        kv_ready, kv_empty, p_ready, buf_empty, m_ready, rope_ready, q_ready, q_free = bars
        _stamp(tp, 19)  # the loader partition starts
        DB: gl.constexpr = rp.shape[2] if rp.shape[2] == 64 else 0  # the buffers are 64 x 32 (no rope lanes) at 512+0
        HALVES: gl.constexpr = kv_ready.shape[0] == 6
        FP8: gl.constexpr = kv_ptr.dtype.element_ty != kv_a.dtype  # bytes into the stages' upper halves (kv8)
        cp: gl.constexpr = CP8 if FP8 else gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_cp: gl.constexpr = gl.SliceLayout(1, cp)
        if FP8:
            kv_ptr = kv_ptr.to(gl.pointer_type(gl.uint8), bitcast=True)
        g = 0
        c0 = 0  # rope lanes gathered into buffer 0, and 1: the phases of rope_empty
        c1 = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                      ragged)
            for j0 in range(lo, hi, 256):  # the item's slot numbers into L1, for the tiles' loads of them (S11)
                _prefetch_span(idx_ptr, base, idx_s1, j0, hi)
            for t in range(gl.cdiv(gl.maximum(hi - lo, 0), 64)):
                st = g % 3
                slots = _load_slots(idx_ptr, base, idx_s1, lo + t * 64, hi, rows_cp)
                if HALVES:  # each 256-lane half as soon as P·V is done with it
                    for h in gl.static_range(2):
                        mbarrier.wait(kv_empty.index(2 * st + h), ((g // 3) & 1) ^ 1)
                        fence_async_shared()
                        if not NO_GATHER:
                            if FP8:  # 64 lanes a block, into the half's upper 16 KB
                                for b in gl.static_range(4):
                                    _gather(kv_ptr, kv_s0, slots, skv, kv8.index(16 * st + 8 * h + 4 + b),
                                            256 * h + 64 * b, 64, cp)
                            else:
                                _gather(kv_ptr, kv_s0, slots, skv, kv_a.index(st).slice(256 * h, 256, dim=1), 256 * h,
                                        256, cp)
                        async_copy.mbarrier_arrive(kv_ready.index(2 * st + h), increment_count=False)
                else:
                    mbarrier.wait(kv_empty.index(st), ((g // 3) & 1) ^ 1)
                    fence_async_shared()
                    if not NO_GATHER:
                        _gather(kv_ptr, kv_s0, slots, skv, kv_a.index(st), 0, 512, cp)
                    async_copy.mbarrier_arrive(kv_ready.index(st), increment_count=False)
                if g == 0:
                    _stamp(tp, 1)  # the first tile's copies issued
                if DB > 0:  # P·V has read the P written over this buffer's previous rope lanes
                    j = t % 2
                    cj = gl.where(j == 0, c0, c1)
                    mbarrier.wait(buf_empty.index(j), (cj & 1) ^ 1)
                    fence_async_shared()
                    if not NO_GATHER:
                        if FP8:  # into the buffer's upper 4 KB
                            _gather(kv_ptr, kv_s0, slots, skv, rp8.index(2 * j + 1), 512, DB, cp)
                        else:
                            _gather(kv_ptr, kv_s0, slots, skv, rp.index(j), 512, DB, cp)
                    async_copy.mbarrier_arrive(rope_ready.index(j), increment_count=False)
                    c0 += 1 - j
                    c1 += j
                g += 1

    @gluon.jit(do_not_specialize=["ragged", "has_len", "has_sink", "lanes", "width", "n_items", "splits", "partial"])
    def _ws_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, part_o_ptr, part_lse_ptr,
                   skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                   q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2, n_items, n_hb, splits,
                   partial, DB: gl.constexpr, PDL: gl.constexpr, WREGS: gl.constexpr, HALVES: gl.constexpr = False,
                   trace_ptr=None):
        """Persistent: each program takes items (row, split, head block) pid, pid + grid, ...; the gathers run on."""
        tp = part_lse_ptr  # the stamps' pointer (TRACE only; unread otherwise): partition arguments must be values
        if TRACE:
            tp = trace_ptr
            _stamp_time(tp, 22)
            _stamp(tp, 0)
        if PDL:  # the decode's reduce may be scheduled now; it waits for this grid in gdc_wait
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        dt: gl.constexpr = q_ptr.dtype.element_ty
        FP8: gl.constexpr = kv_ptr.dtype.element_ty != dt  # an fp8 pool: converted in the stages (_expand_half)
        gl.static_assert(HALVES or not FP8, "an fp8 pool takes stages handed over in halves")
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        vec_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        kv_a = gl.allocate_shared_memory(dt, [3, 64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        # One buffer per softmax warpgroup: its tile's rope lanes, then the tile's P, rescale factors and
        # (at its last tile of an item) totals. 64 x 32 at 512+0: room for the floats after P.
        RW: gl.constexpr = DB if DB > 0 else 32
        rp = gl.allocate_shared_memory(dt, [2, 64, RW], gl.NVMMASharedLayout.get_default_for([64, RW], dt))
        kv8 = kv_a  # the stages and rope buffers as 4 KB blocks of fp8 bytes (see _expand_half)
        rp8 = rp
        if FP8:
            kv8 = _as_blocks(kv_a, 48)
            rp8 = _as_blocks(rp, RW // 16)
        m_smem = gl.allocate_shared_memory(gl.float32, [2, 16], vec_l)
        qa_smem = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        qb_smem = qa_smem
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dt, [16, DB], gl.NVMMASharedLayout.get_default_for([16, DB], dt))
        # One allocation per kind of mbarrier: the compiler's shared-memory hazard analysis cannot tell
        # apart two entries of one allocation indexed at run time, and put a partition-wide barrier
        # between every arrive and wait on it (S5-4: 3.6% slower at 512+0 with them all in one).
        # With HALVES a pair per stage, 2 s + h for its lanes [256 h, 256 h + 256): the partitions read the shape.
        if HALVES:
            kv_ready = gl.allocate_shared_memory(gl.int64, [6, 1], bar_l)
            kv_empty = gl.allocate_shared_memory(gl.int64, [6, 1], bar_l)
        else:
            kv_ready = gl.allocate_shared_memory(gl.int64, [3, 1], bar_l)  # stage s gathered (the loader's 128 arrivals)
            kv_empty = gl.allocate_shared_memory(gl.int64, [3, 1], bar_l)  # P·V is done with stage s
        p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # warpgroup j's P, alpha (and totals) in buffer j
        buf_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # P·V is done with buffer j
        m_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # warpgroup j's running max in m_smem j
        rope_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # a tile's rope lanes in buffer j
        q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)  # the item's q is in shared memory
        q_free = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)  # both softmax warpgroups are done with it
        bars = (kv_ready, kv_empty, p_ready, buf_empty, m_ready, rope_ready, q_ready, q_free)
        for i in gl.static_range(3):
            if HALVES:
                for h in gl.static_range(2):
                    mbarrier.init(kv_ready.index(2 * i + h), count=128)
                    mbarrier.init(kv_empty.index(2 * i + h), count=1)
            else:
                mbarrier.init(kv_ready.index(i), count=128)  # one cp.async arrival per loader thread
                mbarrier.init(kv_empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(p_ready.index(i), count=1)
            mbarrier.init(buf_empty.index(i), count=1)
            mbarrier.init(m_ready.index(i), count=1)
            mbarrier.init(rope_ready.index(i), count=128)  # one cp.async arrival per loader thread
        mbarrier.init(q_ready.index(0), count=128)  # one cp.async arrival per thread of softmax warpgroup 0
        mbarrier.init(q_free.index(0), count=2)  # both softmax warpgroups
        fence_async_shared()
        sargs = (qa_smem, qb_smem, kv_a, rp, kv8, rp8, kv_ptr, m_smem, bars, q_ptr, q_s0, q_s1, H,
                 idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged, has_len,
                 n_items, n_hb, splits)
        wargs = (kv_a, rp, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, part_o_ptr, part_lse_ptr, H, lanes,
                 o_s0, o_s1, o_s2, n_items, n_hb, splits, partial, tp)
        zero = gl.program_id(0) * 0  # partition arguments must be values, not Python ints
        largs = (kv_a, rp, kv8, rp8, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged, skv,
                 n_items, n_hb, splits, tp)
        # P·V is the default partition, the softmax warpgroups and the loader workers: 1.9% faster at 512+64
        # than with softmax warpgroup 0 as the default, 3.0% at 512+0 (S14-12; bit-identical answers).
        gl.warp_specialize([
            (_pv_part, wargs),
            (_softmax_part, sargs + (zero, tp)),
            (_softmax_part, sargs + (zero + 1, tp)),
            (_load_part, largs),
        ], [4, 4, 4], WREGS)  # the workers' registers (WORKER_REGS); P·V gets the rest


# Registers per thread of the two softmax warpgroups and the loader (setmaxnreg; P·V, the default partition,
# gets what is left of 4 x 128 per warp slot, 136 here). With softmax warpgroup 0 as the default partition
# (before S14-12) the workers were the second softmax warpgroup, P·V and the loader at 160, 128 and 56.
WORKER_REGS = (160, 160, 56)
# Each stage handed over in two 256-lane halves (a barrier pair per stage): P·V frees the first half
# before its second product, the loader refills it, and the scores start on it before the second lands.
# 16,384 rows at 512+64: 5,380-5,425 µs against 5,445-5,492 with whole stages (S13-5, S13-6, S13-9;
# bit-identical). At D = 512 gluon_sm90_ws_d512, the default there, was slower in halves (S13-6).
STAGE_HALVES = True


def launch_kernel(kernel, args: KernelArgs, splits: int, part_o: torch.Tensor | None,
                  part_lse: torch.Tensor | None, pdl: bool, **consts) -> None:
    """Launch a warp-specialised kernel of this signature (this module's or ``gluon_sm90_ws_d512``'s).

    One program per multiprocessor over the work items (row, split, head block); with no
    ``part_o`` it is the prefill, writing the output, else the decode's partial pass.
    """
    from .triton_decode import sm_count

    q, kv, out = args.q, args.kv, args.output
    rows, heads, _ = q.shape
    if rows == 0 or heads == 0 or out.shape[2] == 0:
        return
    p = pack(args)
    n_hb = (heads + HEAD_BLOCK - 1) // HEAD_BLOCK
    items = rows * splits * n_hb
    partial = part_o is not None
    if not partial:  # the prefill writes no partials: any float32 tensor serves as the unread pointers
        part_o = part_lse = out.new_empty(1, dtype=torch.float32)
    kernel[(min(items, sm_count(q.device)),)](
        q, kv, p.idx, p.length, p.indptr, p.sink, out, part_o, part_lse,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.has_sink, p.lanes,
        q.stride(0), q.stride(1), kv.stride(0), p.idx_s0, p.idx_s1, p.len_s0,
        p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2), items, n_hb, splits,
        int(partial), DB=int(q.shape[2]) - 512, PDL=pdl, num_warps=4, maxnreg=128, **consts,
    )


def _halves(args: KernelArgs, halves: bool | None) -> bool:
    """Stages in halves (``STAGE_HALVES`` unless asked); an fp8 pool lands and is converted by halves only."""
    halves = STAGE_HALVES if halves is None else bool(halves)
    if not halves and args.kv.dtype != args.q.dtype:
        raise ValueError(f"an fp8 pool ({args.kv.dtype}) takes stages handed over in halves (halves=True)")
    return halves


def launch_prefill_ws(args: KernelArgs, *, worker_regs: tuple[int, int, int] | None = None,
                      halves: bool | None = None) -> None:
    """The no-split prefill; call only where ``gluon_sm90.supports_prefill``. One program per multiprocessor.

    The pool is in q's dtype or, at any layout, e4m3fn or e5m2 (converted in shared memory as it lands)."""
    launch_kernel(_ws_kernel, args, 1, None, None, False, WREGS=tuple(worker_regs or WORKER_REGS),
                  HALVES=_halves(args, halves))


def launch_partials_ws(args: KernelArgs, part_o: torch.Tensor, part_lse: torch.Tensor, splits: int, *,
                       pdl: bool, worker_regs: tuple[int, int, int] | None = None,
                       trace: torch.Tensor | None = None) -> None:
    """The split-K decode's partial pass, into the layout ``triton_decode``'s reduce reads.

    ``trace`` (timing experiments only, with the module's TRACE set): int64, 24 stamps a program.
    """
    extra = {"trace_ptr": trace} if trace is not None else {}
    launch_kernel(_ws_kernel, args, splits, part_o, part_lse, pdl, WREGS=tuple(worker_regs or WORKER_REGS),
                  HALVES=_halves(args, None), **extra)
