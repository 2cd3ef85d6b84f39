"""LAB BASELINE (not used by the dispatcher): session 3's warp-specialised prefill, kept verbatim so
scripts/gpu/ws_lab.py can time the current kernel against it side by side in one run.

The Hopper prefill with warp specialisation: a gather warpgroup, a scores+softmax warpgroup, a P·V one.

``gluon_sm90`` runs gathers, scores, softmax and P·V in one warpgroup, so the tensor cores idle
while it does the softmax and the gathers share its instruction stream (docs/benchmarks.md,
session 3: the products alone take 5.4 ms of the 7.0 ms prefill). Here three partitions hand
tiles over through mbarriers, FlashAttention-3 style:

- the loader (4 warps) gathers tile t's 512 lanes into stage t % 3 once P·V of tile t - 3 has
  released it, and the 64 rope lanes into one shared buffer once the scores of tile t - 1 are done
  (three 73.7 KB stages do not fit in 227 KB; three 64 KB ones and one 8 KB rope buffer do);
- the default partition (4 warps) computes Sᵀ = KV · qᵀ, the online softmax, and hands P and the
  rescale factor to P·V through a double buffer;
- the P·V partition (4 warps) keeps Oᵀ, rescales and accumulates, releases the stage, and writes
  the output once the softmax partition has published the final max and sum.

The grid is one program per multiprocessor, each taking work items (query row, head block)
pid, pid + grid, ...: the loader runs on into the next item's tiles while the other two finish
the current one, so the pipeline does not drain at every row.

Same math, arguments and ``supports()`` as ``gluon_sm90`` (prefill only); ``gluon_sm90.launch_prefill``
runs it by default. On an H200 (docs/benchmarks.md, S3-9 and S3-11) it took the 16,384-row
prefill from 6.97 to 6.18 ms (512+64) and from 6.62 to 5.94 ms (512+0). What bounds it now is
the gather: with three stages only one 74 KB tile is in flight per multiprocessor while the
other two are in the products, and an L2 round trip per tile at that depth moves about 6 TB/s.
"""

from __future__ import annotations

from dispatcher.kernels.common import KernelArgs
from dispatcher.kernels.gluon_sm90 import HAVE_GLUON
from dispatcher.kernels.triton_prefill import HEAD_BLOCK, count_block, pack

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                 warpgroup_mma_wait)

    from dispatcher.kernels.gluon_sm90 import (_final_scale, _gather, _load_slots, _row_len, _row_span, _store_t, _valid,
                             cta_barrier)

    STAGES = 3

    @gluon.jit
    def _item(w, n_hb, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged):
        """Work item w: (query row, first head, offset of the row's first index, the row's width)."""
        row = w // n_hb
        base, seg = _row_span(idx_ptr, idx_s0, idx_s1, width, indptr_ptr, row, ragged)
        return row, (w % n_hb) * 16, base, seg

    @gluon.jit
    def _softmax_part(qa_smem, qb_smem, kv_a, kv_b, p_smem, a_smem, fin_smem, bars, q_ptr, q_s0, q_s1, H,
                      idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged, has_len,
                      n_items, n_hb, DB: gl.constexpr, CNT_BLOCK: gl.constexpr):
        kv_ready, kv_empty, rope_ready, rope_free, p_ready, p_empty, fin, fin_empty = bars
        dt: gl.constexpr = kv_a.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_cp: gl.constexpr = gl.SliceLayout(1, cp)
        rows_s: gl.constexpr = gl.SliceLayout(1, mma)
        s0 = gl.zeros([64, 16], gl.float32, mma)
        g = 0  # tiles done by this program so far, over all its items: stage and phase counters
        k = 0  # items done
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, base, seg = _item(w, n_hb, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged)
            # This item's q; the previous item's scores are done (waited), so the buffers are free
            # once every warp of this partition is past them.
            cta_barrier()
            offs_h = h0 + gl.arange(0, 16, rows_cp)
            q_row = q_ptr + row.to(gl.int64) * q_s0 + offs_h[:, None] * q_s1
            qa_smem.store(gl.load(q_row + gl.arange(0, 512, gl.SliceLayout(0, cp))[None, :],
                                  mask=(offs_h < H)[:, None], other=0.0))
            if DB > 0:
                qb_smem.store(gl.load(q_row + (512 + gl.arange(0, DB, gl.SliceLayout(0, cp)))[None, :],
                                      mask=(offs_h < H)[:, None], other=0.0))
            fence_async_shared()
            cta_barrier()  # every warp's part of q is stored before any warp's first product reads it
            n = _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK)
            lim = gl.minimum(seg, n)
            m = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, mma))
            l_acc = gl.zeros([64, 16], gl.float32, mma)
            for t in range(gl.cdiv(seg, 64)):
                st = g % 3
                ok = _valid(idx_ptr, base, idx_s1, t * 64, lim, skv, rows_s)
                mbarrier.wait(kv_ready.index(st), (g // 3) & 1)
                if DB > 0:
                    mbarrier.wait(rope_ready.index(0), g & 1)
                fence_async_shared()
                ka = kv_a.index(st)
                s = warpgroup_mma(ka.slice(0, 256, dim=1), qa_smem.slice(0, 256, dim=1).permute((1, 0)), s0,
                                  use_acc=False, is_async=True)
                s2 = warpgroup_mma(ka.slice(256, 256, dim=1), qa_smem.slice(256, 256, dim=1).permute((1, 0)), s0,
                                   use_acc=False, is_async=True)
                if DB > 0:
                    s = warpgroup_mma(kv_b.index(0), qb_smem.permute((1, 0)), s, is_async=True)
                s, s2 = warpgroup_mma_wait(0, deps=(s, s2))
                if DB > 0:
                    mbarrier.arrive(rope_free.index(0))  # the rope buffer may take the next tile's lanes
                s = gl.where(ok[:, None], (s + s2) * sm_scale2, float("-inf"))
                m_new = gl.maximum(m, gl.max(s, axis=0))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = gl.exp2(m - m_safe)
                p = gl.exp2(s - m_safe[None, :])
                l_acc = l_acc * alpha[None, :] + p
                m = m_new
                j = g % 2
                mbarrier.wait(p_empty.index(j), ((g // 2) & 1) ^ 1)
                p_smem.index(j).store(p.to(dt))
                a_smem.index(j).store(alpha)
                fence_async_shared()
                mbarrier.arrive(p_ready.index(j))
                g += 1
            mbarrier.wait(fin_empty.index(0), (k & 1) ^ 1)  # P·V has read the previous item's totals
            fin_smem.index(0).store(m)
            fin_smem.index(1).store(gl.sum(l_acc, axis=0))
            mbarrier.arrive(fin.index(0))
            k += 1

    @gluon.jit
    def _pv_part(kv_a, kv_b, p_smem, a_smem, fin_smem, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, H, lanes, o_s0, o_s1, o_s2,
                 n_items, n_hb):
        kv_ready, kv_empty, rope_ready, rope_free, p_ready, p_empty, fin, fin_empty = bars
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        heads_l: gl.constexpr = gl.SliceLayout(0, mma)
        g = 0
        k = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, base, seg = _item(w, n_hb, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged)
            o = gl.zeros([512, 16], gl.float32, mma)
            for t in range(gl.cdiv(seg, 64)):
                st = g % 3
                j = g % 2
                mbarrier.wait(p_ready.index(j), (g // 2) & 1)
                fence_async_shared()
                alpha = a_smem.index(j).load(heads_l)
                o = o * alpha[None, :]
                o = warpgroup_mma(kv_a.index(st).permute((1, 0)), p_smem.index(j), o, is_async=True)
                o = warpgroup_mma_wait(0, deps=(o,))
                mbarrier.arrive(p_empty.index(j))
                mbarrier.arrive(kv_empty.index(st))
                g += 1
            mbarrier.wait(fin.index(0), k & 1)
            m = fin_smem.index(0).load(heads_l)
            l = fin_smem.index(1).load(heads_l)
            mbarrier.arrive(fin_empty.index(0))
            k += 1
            offs_h = h0 + gl.arange(0, 16, heads_l)
            hmask = offs_h < H
            scale = _final_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
            _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o, scale)

    @gluon.jit
    def _load_part(kv_a, kv_b, p_smem, a_smem, fin_smem, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                   indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, H, lanes, o_s0, o_s1, o_s2,
                   n_items, n_hb):
        kv_ready, kv_empty, rope_ready, rope_free, p_ready, p_empty, fin, fin_empty = bars
        # Worker partitions take no constexpr arguments (Triton 3.6): the rope width comes from the buffer.
        DB: gl.constexpr = kv_b.shape[2] if kv_b.shape[0] == 1 else 0
        cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_cp: gl.constexpr = gl.SliceLayout(1, cp)
        g = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, base, seg = _item(w, n_hb, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged)
            for t in range(gl.cdiv(seg, 64)):
                st = g % 3
                slots = _load_slots(idx_ptr, base, idx_s1, t * 64, seg, rows_cp)
                mbarrier.wait(kv_empty.index(st), ((g // 3) & 1) ^ 1)
                fence_async_shared()
                _gather(kv_ptr, kv_s0, slots, skv, kv_a.index(st), 0, 512, cp)
                async_copy.mbarrier_arrive(kv_ready.index(st), increment_count=False)
                if DB > 0:
                    mbarrier.wait(rope_free.index(0), (g - 1) & 1, pred=g > 0)
                    fence_async_shared()
                    _gather(kv_ptr, kv_s0, slots, skv, kv_b.index(0), 512, DB, cp)
                    async_copy.mbarrier_arrive(rope_ready.index(0), increment_count=False)
                g += 1

    @gluon.jit(do_not_specialize=["ragged", "has_len", "has_sink", "lanes", "width", "n_items"])
    def _prefill_ws_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr,
                           skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                           q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2, n_items, n_hb,
                           DB: gl.constexpr, CNT_BLOCK: gl.constexpr):
        """Persistent: each program takes items (row, head block) pid, pid + grid, ...; the gathers run on."""
        dt: gl.constexpr = kv_ptr.dtype.element_ty
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        vec_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # rank of one buffer: [2, 16] holds two
        kv_a = gl.allocate_shared_memory(dt, [3, 64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        kv_b = kv_a
        if DB > 0:
            kv_b = gl.allocate_shared_memory(dt, [1, 64, DB], gl.NVMMASharedLayout.get_default_for([64, DB], dt))
        p_smem = gl.allocate_shared_memory(dt, [2, 64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], dt))
        a_smem = gl.allocate_shared_memory(gl.float32, [2, 16], vec_l)
        fin_smem = gl.allocate_shared_memory(gl.float32, [2, 16], vec_l)
        qa_smem = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        qb_smem = qa_smem
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dt, [16, DB], gl.NVMMASharedLayout.get_default_for([16, DB], dt))
        kv_ready = gl.allocate_shared_memory(gl.int64, [3, 1], bar_l)
        kv_empty = gl.allocate_shared_memory(gl.int64, [3, 1], bar_l)
        rope_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)
        rope_free = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)
        p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
        p_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
        fin = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)
        fin_empty = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)
        for i in gl.static_range(3):
            mbarrier.init(kv_ready.index(i), count=128)  # one cp.async arrival per loader thread
            mbarrier.init(kv_empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(p_ready.index(i), count=1)
            mbarrier.init(p_empty.index(i), count=1)
        mbarrier.init(rope_ready.index(0), count=128)
        mbarrier.init(rope_free.index(0), count=1)
        mbarrier.init(fin.index(0), count=1)
        mbarrier.init(fin_empty.index(0), count=1)
        fence_async_shared()
        bars = (kv_ready, kv_empty, rope_ready, rope_free, p_ready, p_empty, fin, fin_empty)
        wargs = (kv_a, kv_b, p_smem, a_smem, fin_smem, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, H, lanes, o_s0, o_s1, o_s2,
                 n_items, n_hb)
        gl.warp_specialize([
            (_softmax_part, (qa_smem, qb_smem, kv_a, kv_b, p_smem, a_smem, fin_smem, bars, q_ptr, q_s0, q_s1, H,
                             idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged,
                             has_len, n_items, n_hb, DB, CNT_BLOCK)),
            (_pv_part, wargs),
            (_load_part, wargs),
        ], [4, 4], [160, 88])


def launch_prefill_ws(args: KernelArgs) -> None:
    """The warp-specialised prefill; call only where ``gluon_sm90.supports``. One program per multiprocessor."""
    from dispatcher.kernels.triton_decode import sm_count

    q, kv, out = args.q, args.kv, args.output
    rows, heads, _ = q.shape
    if rows == 0 or heads == 0 or out.shape[2] == 0:
        return
    p = pack(args)
    n_hb = (heads + HEAD_BLOCK - 1) // HEAD_BLOCK
    items = rows * n_hb
    _prefill_ws_kernel[(min(items, sm_count(q.device)),)](
        q, kv, p.idx, p.length, p.indptr, p.sink, out,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.has_sink, p.lanes,
        q.stride(0), q.stride(1), kv.stride(0), p.idx_s0, p.idx_s1, p.len_s0,
        p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2), items, n_hb,
        DB=int(q.shape[2]) - 512, CNT_BLOCK=count_block(p.width), num_warps=4, maxnreg=168,
    )
