"""Sparse MLA attention for Hopper, warp-specialised with one rope buffer: the ``ws=True`` decode partials at D = 512.

Computes the contract of docs/kernels.md, keeping the exact running max: the split-K decode's normalised partials
and their log-sum-exp, which ``triton_decode``'s reduce combines (``launch_partials_ws``), or with no partials the
attention output itself (``launch_prefill_ws``, which no default launch takes). ``gluon_sm90.ws_module`` picks it
for ``launch_decode(ws=True)`` at D = 512 (448+64, 512+0) on a 16-bit pool: with the exact max it measured
3.6-4.6% faster there than ``gluon_sm90_ws``, whose two rope buffers have no rope lanes to hold at D = 512 (the
16,384-row prefill; docs/kernels.md, "Prefill kernel design figures"). ``gluon_sm90_ws`` takes every other warp-specialised call, the
prefill included.

How: the partitions of ``gluon_sm90_ws``, with the same work items, hand-overs, softmax step, item stores and launch
signature (``gluon_sm90_ws_parts``), and its own buffers:

- the loader (4 warps) gathers tile t's 512 lanes into stage t % 3 by cp.async once P·V of tile t - 3 has
  released it, whole stages, nothing else, so it runs up to three tiles ahead;
- two scores+softmax warpgroups take alternate tiles of an item: each computes Sᵀ = KV · qᵀ by wgmma and the
  online softmax, and hands P and the rescale factor to P·V through buffers of their own (p_smem, a_smem). Only
  the running max passes between them (m_smem), so P·V sees one max sequence; each keeps its own sum and hands
  its totals over at the item's end (fin_smem). Warpgroup 0 stores each item's q;
- P·V (4 warps, the default partition) keeps Oᵀ in registers, rescales and accumulates, releases the stage,
  and writes the item once both softmax warpgroups have published their totals.

With rope lanes (``DB`` 64, which no production call sends here) they have one buffer (three 73.7 KB stages do
not fit in 227 KB; three 64 KB ones and one 8 KB rope buffer do): the warpgroup whose scores of tile t are done
gathers tile t + 1's rope lanes into it, so each tile's rope gather waits for the previous tile's scores, an L2
round trip in every tile's chain. That is what ``gluon_sm90_ws``'s two buffers, holding P once the scores are
done with them, remove.

Limits: an NVIDIA sm_90 GPU (H100, H200, H20, GH200), one program per multiprocessor; q fp16 or bf16 and the pool
in q's dtype (no fp8: only ``gluon_sm90_ws`` converts one); D = 512 (448+64, 512+0), or 512+64 where asked for
directly; output lanes <= 512; kv ``[skv, 1, D]`` and q rows 16-byte aligned with unit last strides; dense or
ragged indices, ``topk_length`` and a sink as the contract has them. ``gluon_sm90.supports_decode`` and
``ws_module`` decide which calls reach it.
"""

from __future__ import annotations

import torch

from .common import KernelArgs
from .gluon_sm90_parts import HAVE_GLUON
from .gluon_sm90_ws import launch_kernel

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                 warpgroup_mma_wait)

    from .triton_stamps import stamp_end
    from .gluon_sm90_parts import _barriers, _gather, _load_slots, _valid, cta_barrier
    # the same work items, layout, hand-overs, softmax step and launch signature as that kernel
    from .gluon_sm90_ws_parts import (MMA, _fill_stage, _item, _loader_item, _softmax_start, _softmax_tile, _turn,
                                      _write_item, _ws_begin, ws_kernel)

    @gluon.jit
    def _rope_rows(kv_ptr, kv_s0, slots, skv, DB: gl.constexpr, layout: gl.constexpr):
        """A tile's DB rope lanes loaded into registers (16-byte vectors); invalid slots give 0.

        Only an item's first tile takes this path (stored with q); later tiles' rope lanes are
        gathered by cp.async (loads in the softmax warpgroups' own stream cost more).
        """
        slot = slots.to(gl.int64)
        valid = (slot >= 0) & (slot < skv)
        krow = kv_ptr + gl.where(valid, slot, 0) * kv_s0
        offs = 512 + gl.arange(0, DB, gl.SliceLayout(0, layout))
        return gl.load(krow[:, None] + offs[None, :], mask=valid[:, None], other=0.0)

    @gluon.jit
    def _softmax_part(qa_smem, qb_smem, kv_a, kv_b, p_smem, a_smem, m_smem, fin_smem, bars, q_ptr, q_s0, q_s1, H, kv_ptr,
                      kv_s0, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged,
                      has_len, n_items, n_hb, splits, par):
        """One of two scores+softmax warpgroups: the tiles t with t % 2 == par of every item.

        The scores, the exponentials and the P hand-over of consecutive tiles run in the two
        warpgroups at once; only the running max passes from one to the other (m_smem, m_bar), so
        P·V sees one max sequence as with a single softmax. Each keeps its own sum, relative to the
        last max it saw; P·V merges the two at the item's end. Warpgroup 0 also writes each item's
        q into shared memory, once both are done with the previous item's (q_free), and tells
        warpgroup 1 (q_ready).

        The rope lanes have one buffer (there is no room for two): the warpgroup whose scores of
        tile t are done gathers tile t + 1's into it (cp.async, arriving on rope_ready), while the
        other has started tile t + 1's scores over the 512 lanes and adds the rope lanes' last (starting
        with the rope lanes' product, to free the buffer sooner, is slower).
        """
        kv_ready, kv_empty, p_ready, p_empty, m_bar, rope_ready, fin, fin_empty, q_ready, q_free = bars
        # Worker partitions take no constexpr arguments (Triton 3.6): the rope width comes from q's buffer.
        DB: gl.constexpr = qb_smem.shape[1] if qb_smem.shape[1] != 512 else 0
        dt: gl.constexpr = kv_a.dtype
        mma: gl.constexpr = MMA
        cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_cp: gl.constexpr = gl.SliceLayout(1, cp)
        rows_s: gl.constexpr = gl.SliceLayout(1, mma)
        heads_l: gl.constexpr = gl.SliceLayout(0, mma)
        s0 = gl.zeros([64, 16], gl.float32, mma)
        gbase = 0  # tiles of this program's earlier items: stage and phase of kv_ready
        c = 0  # tiles this warpgroup has handed to P·V: phase of its P buffer
        cm = 0  # running maxima received from the other warpgroup: phase of its m_bar
        cr = 0  # rope lanes received from the other warpgroup: phase of rope_ready
        k = 0  # items done
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi, nt = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                          ragged)
            if DB > 0:  # the slots of the rope lanes this warpgroup gathers after its first tile: tile par + 1's
                sl = _load_slots(idx_ptr, base, idx_s1, lo + (par + 1) * 64, hi, rows_cp)
            # Warpgroup 0: this item's q and tile 0's rope lanes, once both warpgroups' scores of the
            # previous item are done.
            if par == 0:
                mbarrier.wait(q_free.index(0), (k - 1) & 1, pred=k > 0)
                offs_h = h0 + gl.arange(0, 16, rows_cp)
                q_row = q_ptr + row.to(gl.int64) * q_s0 + offs_h[:, None] * q_s1
                qa_smem.store(gl.load(q_row + gl.arange(0, 512, gl.SliceLayout(0, cp))[None, :],
                                      mask=(offs_h < H)[:, None], other=0.0))
                if DB > 0:
                    qb_smem.store(gl.load(q_row + (512 + gl.arange(0, DB, gl.SliceLayout(0, cp)))[None, :],
                                          mask=(offs_h < H)[:, None], other=0.0))
                    kv_b.index(0).store(_rope_rows(kv_ptr, kv_s0, _load_slots(idx_ptr, base, idx_s1, lo, hi, rows_cp),
                                                   skv, DB, cp))
                fence_async_shared()
                mbarrier.arrive(q_ready.index(0))  # after this partition's barrier: every warp's part is stored
            lim, m, l_acc = _softmax_start(idx_ptr, base, idx_s1, seg, hi, len_ptr, len_s0, row, ragged, has_len, 512)
            mbarrier.wait(q_ready.index(0), k & 1)
            for t in range(par, nt, 2):
                g = gbase + t
                ok = _valid(idx_ptr, base, idx_s1, lo + t * 64, lim, skv, rows_s)
                mbarrier.wait(kv_ready.index(g % 3), (g // 3) & 1)
                fence_async_shared()
                ka = kv_a.index(g % 3)
                s_a = warpgroup_mma(ka.slice(0, 256, dim=1), qa_smem.slice(0, 256, dim=1).permute((1, 0)), s0,
                                    use_acc=False, is_async=True)
                s_b = warpgroup_mma(ka.slice(256, 256, dim=1), qa_smem.slice(256, 256, dim=1).permute((1, 0)), s0,
                                    use_acc=False, is_async=True)
                if DB > 0:  # the rope lanes' product last: their buffer is the one resource the two warpgroups share
                    mbarrier.wait(rope_ready.index(par), cr & 1, pred=t > 0)  # tile 0's: stored with q
                    fence_async_shared()
                    cr += (t > 0).to(gl.int32)
                    s_a = warpgroup_mma(kv_b.index(0), qb_smem.permute((1, 0)), s_a, is_async=True)
                s_a, s_b = warpgroup_mma_wait(0, deps=(s_a, s_b))
                if DB > 0:
                    if t + 1 < nt:  # every warp is done with the rope buffer: gather tile t + 1's lanes into it
                        cta_barrier()
                        _gather(kv_ptr, kv_s0, sl, skv, kv_b.index(0), 512, DB, cp)
                        async_copy.mbarrier_arrive(rope_ready.index(1 - par), increment_count=False)
                    sl = _load_slots(idx_ptr, base, idx_s1, lo + (t + 3) * 64, hi, rows_cp)  # for after tile t + 2
                s = gl.where(ok[:, None], (s_a + s_b) * sm_scale2, float("-inf"))
                p, m_prev, m_safe, m, l_acc, cm = _softmax_tile(s, m, l_acc, m_smem, m_bar, par, t, nt, cm)
                mbarrier.wait(p_empty.index(par), (c & 1) ^ 1)
                p_smem.index(par).store(p.to(dt))
                a_smem.index(par).store(gl.exp2(m_prev - m_safe))  # P·V's Oᵀ moves from max m_prev to m_new
                fence_async_shared()
                mbarrier.arrive(p_ready.index(par))
                c += 1
            mbarrier.arrive(q_free.index(0))  # this warpgroup's scores of the item are done with q
            mbarrier.wait(fin_empty.index(par), (k & 1) ^ 1)  # P·V has read the previous item's totals
            fin_smem.index(2 * par).store(m)
            fin_smem.index(2 * par + 1).store(gl.sum(l_acc, axis=0))
            mbarrier.arrive(fin.index(par))
            gbase += nt
            k += 1

    @gluon.jit
    def _pv_part(kv_a, p_smem, a_smem, fin_smem, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, part_o_ptr, part_lse_ptr, H, lanes,
                 o_s0, o_s1, o_s2, n_items, n_hb, splits, partial):
        """Oᵀ over the item's tiles in order, P from the two softmax warpgroups in turn; the totals merged at the end."""
        kv_ready, kv_empty, p_ready, p_empty, m_bar, rope_ready, fin, fin_empty, q_ready, q_free = bars
        mma: gl.constexpr = MMA
        heads_l: gl.constexpr = gl.SliceLayout(0, mma)
        dst = (out_ptr, o_s0, o_s1, o_s2, part_o_ptr, part_lse_ptr, sink_ptr, sink_s0, has_sink, H, lanes, splits,
               partial)
        g = 0
        c0 = 0
        c1 = 0
        k = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi, nt = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                          ragged)
            o = gl.zeros([512, 16], gl.float32, mma)
            for t in range(nt):
                j = _turn(p_ready, t, c0, c1, 0)
                alpha = a_smem.index(j).load(heads_l)
                o = o * alpha[None, :]
                o = warpgroup_mma(kv_a.index(g % 3).permute((1, 0)), p_smem.index(j), o, is_async=True)
                o = warpgroup_mma_wait(0, deps=(o,))
                mbarrier.arrive(p_empty.index(j))
                mbarrier.arrive(kv_empty.index(g % 3))
                c0 += 1 - j
                c1 += j
                g += 1
            mbarrier.wait(fin.index(0), k & 1)
            mbarrier.wait(fin.index(1), k & 1)
            m0 = fin_smem.index(0).load(heads_l)
            l0 = fin_smem.index(1).load(heads_l)
            m1 = fin_smem.index(2).load(heads_l)
            l1 = fin_smem.index(3).load(heads_l)
            mbarrier.arrive(fin_empty.index(0))
            mbarrier.arrive(fin_empty.index(1))
            k += 1
            _write_item(o, o, False, m0, l0, m1, l1, row, h0, split, dst)

    @gluon.jit
    def _load_part(kv_a, p_smem, a_smem, fin_smem, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                   indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, part_o_ptr, part_lse_ptr, H, lanes,
                   o_s0, o_s1, o_s2, n_items, n_hb, splits, partial):
        """Each tile's 512 lanes into stage g % 3 once P·V has released it (the rope lanes are the softmax
        warpgroups' to gather)."""
        kv_ready, kv_empty, p_ready, p_empty, m_bar, rope_ready, fin, fin_empty, q_ready, q_free = bars
        cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        g = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            base, lo, hi, nt = _loader_item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged)
            for t in range(nt):
                _fill_stage(kv_empty, kv_ready, kv_a, g, idx_ptr, base, idx_s1, lo, t, hi, kv_ptr, kv_s0, skv, cp)
                g += 1

    @ws_kernel
    def _ws_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, part_o_ptr, part_lse_ptr,
                   skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                   q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2, n_items, n_hb, splits,
                   partial, redo_ptr, stamp_ptr, count_ptr, stamp_first, stamp_last,
                   DB: gl.constexpr, PDL: gl.constexpr, WREGS: gl.constexpr, CLOCK: gl.constexpr = 0):
        """Persistent: each program takes items (row, split, head block) pid, pid + grid, ...; the gathers run on."""
        _ws_begin(stamp_ptr, stamp_first, CLOCK, PDL)
        dt: gl.constexpr = kv_ptr.dtype.element_ty
        vec_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # rank of one buffer: [4, 16] holds four
        kv_a = gl.allocate_shared_memory(dt, [3, 64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        kv_b = kv_a
        if DB > 0:  # one buffer of rope lanes, handed between the softmax warpgroups
            kv_b = gl.allocate_shared_memory(dt, [1, 64, DB], gl.NVMMASharedLayout.get_default_for([64, DB], dt))
        p_smem = gl.allocate_shared_memory(dt, [2, 64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], dt))
        a_smem = gl.allocate_shared_memory(gl.float32, [2, 16], vec_l)
        m_smem = gl.allocate_shared_memory(gl.float32, [2, 16], vec_l)
        fin_smem = gl.allocate_shared_memory(gl.float32, [4, 16], vec_l)
        qa_smem = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        qb_smem = qa_smem
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dt, [16, DB], gl.NVMMASharedLayout.get_default_for([16, DB], dt))
        # stage s gathered (one cp.async arrival per loader thread); P·V is done with stage s
        kv_ready, kv_empty = _barriers(3, (128, 1))
        # warpgroup j's P and alpha in its buffers; P·V is done with them; its running max in m_smem j; the rope
        # lanes it gathered (one cp.async arrival per thread); its totals in fin_smem; P·V has read them
        p_ready, p_empty, m_bar, rope_ready, fin, fin_empty = _barriers(2, (1, 1, 1, 128, 1, 1))
        # the item's q stored by softmax warpgroup 0; both softmax warpgroups are done with it
        q_ready, q_free = _barriers(1, (1, 2))
        fence_async_shared()
        bars = (kv_ready, kv_empty, p_ready, p_empty, m_bar, rope_ready, fin, fin_empty, q_ready, q_free)
        sargs = (qa_smem, qb_smem, kv_a, kv_b, p_smem, a_smem, m_smem, fin_smem, bars, q_ptr, q_s0, q_s1, H, kv_ptr, kv_s0,
                 idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged, has_len,
                 n_items, n_hb, splits)
        wargs = (kv_a, p_smem, a_smem, fin_smem, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, part_o_ptr, part_lse_ptr, H, lanes,
                 o_s0, o_s1, o_s2, n_items, n_hb, splits, partial)
        zero = gl.program_id(0) * 0  # partition arguments must be values, not Python ints
        # P·V is the default partition; WREGS: both softmax warpgroups' and the loader's registers
        gl.warp_specialize([
            (_pv_part, wargs),
            (_softmax_part, sargs + (zero,)),
            (_softmax_part, sargs + (zero + 1,)),
            (_load_part, wargs),
        ], [4, 4, 4], WREGS)
        stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK)


# The workers' registers a thread (setmaxnreg): both softmax warpgroups at 160, the loader 56; P·V, the default
# partition, gets the rest of 4 x 128 (136). As gluon_sm90_ws; no spills.
WORKER_REGS = (160, 160, 56)


def launch_prefill_ws(args: KernelArgs) -> None:
    """The no-split prefill; call only where ``gluon_sm90.supports``. One program per multiprocessor."""
    launch_kernel(_ws_kernel, args, 1, None, None, False, WREGS=WORKER_REGS)


def launch_partials_ws(args: KernelArgs, part_o: torch.Tensor, part_lse: torch.Tensor, splits: int, *,
                       pdl: bool) -> None:
    """The split-K decode's partial pass, into the layout ``triton_decode``'s reduce reads."""
    launch_kernel(_ws_kernel, args, splits, part_o, part_lse, pdl, WREGS=WORKER_REGS)
