"""Sparse MLA prefill for Hopper: two warpgroups, each a whole attention pipeline over alternate tiles.

``gluon_sm90_ws`` splits a tile's work over four partitions: a loader, two scores+softmax
warpgroups on alternate tiles, and one P·V warpgroup that takes P from both. That needs the
running max to pass from one softmax warpgroup to the other every tile (so P·V sees one max
sequence) and P to pass to P·V, so every tile's P waits on a chain of hand-overs through three
partitions. Without gathers or products that chain alone costs 767 cycles a tile (1.54 ms at
16,384 rows, docs/benchmarks.md, session 14), and it does not hide under the products.

Here each of two warpgroups does everything for its tiles (t % 2 == its index) and keeps its own
max, sum and Oᵀ, as two splits of the row would; they meet once per item, where each merges one
256-lane half of the other's Oᵀ into its own (the halves pass through a small global scratch
buffer, in L2) and writes that half of the output. The loader is ``gluon_sm90_ws``'s own:

- the loader (4 warps) gathers tile t's 512 lanes into stage t % 3, each 256-lane half once the
  warpgroup that last used it is done with that half, then its 64 rope lanes into the buffer of
  warpgroup t % 2 once that warpgroup's previous P·V is done with it;
- each compute warpgroup, for each of its tiles: Sᵀ = KV · qᵀ (the 512 lanes in two halves, then
  the rope lanes), the online softmax, P written over the rope lanes its scores are done with,
  Oᵀ rescaled, Oᵀ += KVᵀ · Pᵀ (two 256-lane halves, each released to the loader as soon as its
  product is done), then the rope buffer released. One warpgroup's softmax runs while the
  other's products are on the tensor cores; nothing passes between them inside an item.

Warpgroup 0 copies each item's q once both are done with the previous item's scores. The scratch
is double-buffered by item parity, with one mbarrier per (warpgroup, parity), so neither can get
a whole item ahead of the other's merge. Shared memory as ``gluon_sm90_ws``'s less the running
max: three 64 KB stages, two 8 KB rope/P buffers, q.

Prefill only (no split-K partials); same math, arguments and ``supports()`` as ``gluon_sm90``.
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

    from .gluon_sm90 import _copy_q, _final_scale, _p_view, _row_len, _valid
    from .gluon_sm90_ws import MMA, _item, _load_part

    # Floats a (program, item parity, warpgroup) slot of the scratch holds: a 256-lane half of Oᵀ
    # (256 x 16), then the warpgroup's max and sum (16 each).
    HALF = gl.constexpr(256 * 16)
    SLOT = gl.constexpr(256 * 16 + 32)

    @gluon.jit
    def _attend_part(qa_smem, qb_smem, kv_a, rp, bars, q_ptr, q_s0, q_s1, H, idx_ptr, idx_s0, idx_s1, width,
                     indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged, has_len, sink_ptr, sink_s0, has_sink,
                     out_ptr, scr_ptr, lanes, o_s0, o_s1, o_s2, n_items, n_hb, splits, pingpong, par):
        """Compute warpgroup ``par``: scores, softmax and P·V of the tiles t with t % 2 == par of every item.

        At each item's end it leaves the other warpgroup's half of Oᵀ (lanes 256 (1 - par) on) and
        its max and sum in the scratch, takes the other's half of its own lanes, and writes output
        lanes [256 par, 256 par + 256) of the item's 16 heads.
        """
        kv_ready, kv_empty, mg_ready, buf_empty, sched, rope_ready, q_ready, q_free = bars
        DB: gl.constexpr = qb_smem.shape[1] if qb_smem.shape[1] != 512 else 0
        dt: gl.constexpr = kv_a.dtype
        mma: gl.constexpr = MMA
        rows_s: gl.constexpr = gl.SliceLayout(1, mma)
        heads_l: gl.constexpr = gl.SliceLayout(0, mma)
        s0 = gl.zeros([64, 16], gl.float32, mma)
        offs_f = gl.arange(0, 256, rows_s)
        offs_hl = gl.arange(0, 16, heads_l)
        half_offs = offs_f[:, None] * 16 + offs_hl[None, :]  # a half of Oᵀ in the scratch, in this layout's order
        gbase = 0  # tiles of this program's earlier items: stage and phase of kv_ready
        c = 0  # tiles this warpgroup has done: phase of its rope buffer's barriers
        k = 0  # items done
        ts = 0  # turns taken (pingpong): the phase of sched[par]
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                      ragged)
            nt = gl.cdiv(gl.maximum(hi - lo, 0), 64)
            if par == 0:  # this item's q, once both warpgroups' scores of the previous item are done with the last
                mbarrier.wait(q_free.index(0), (k - 1) & 1, pred=k > 0)
                _copy_q(qa_smem, qb_smem, q_ptr, q_s0, q_s1, H, row, h0, DB)
                async_copy.mbarrier_arrive(q_ready.index(0), increment_count=False)
            n = _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, 2048)
            lim = gl.minimum(hi, n)  # positions at or past the row's length are masked out of the softmax
            m = gl.full([16], float("-inf"), gl.float32, heads_l)
            l_acc = gl.zeros([64, 16], gl.float32, mma)  # per-thread partial sums relative to m: reduced at the end
            o_lo = gl.zeros([256, 16], gl.float32, mma)  # Oᵀ, lanes 0-255 and 256-511
            o_hi = gl.zeros([256, 16], gl.float32, mma)
            mbarrier.wait(q_ready.index(0), k & 1)
            for t2 in range(0, nt, 2):  # tile pairs: both warpgroups take the same number of turns an item
                t = t2 + par
                if t >= nt:  # no tile of this warpgroup in this pair: pass the two turns on (pingpong)
                    if pingpong != 0:
                        for _turn in gl.static_range(2):
                            mbarrier.wait(sched.index(par), ts & 1)
                            mbarrier.arrive(sched.index(1 - par))
                            ts += 1
                else:
                    g = gbase + t
                    st = g % 3
                    ph = (g // 3) & 1
                    ok = _valid(idx_ptr, base, idx_s1, lo + t * 64, lim, skv, rows_s)
                    ka = kv_a.index(st)
                    mbarrier.wait(kv_ready.index(2 * st), ph)
                    fence_async_shared()
                    if pingpong != 0:  # this warpgroup's turn to put products on the tensor cores
                        mbarrier.wait(sched.index(par), ts & 1)
                    s_a = warpgroup_mma(ka.slice(0, 256, dim=1), qa_smem.slice(0, 256, dim=1).permute((1, 0)), s0,
                                        use_acc=False, is_async=True)
                    mbarrier.wait(kv_ready.index(2 * st + 1), ph)
                    fence_async_shared()
                    s_b = warpgroup_mma(ka.slice(256, 256, dim=1), qa_smem.slice(256, 256, dim=1).permute((1, 0)), s0,
                                        use_acc=False, is_async=True)
                    if DB > 0:  # the rope lanes' product last: the loader gathered them after the 512 lanes
                        mbarrier.wait(rope_ready.index(par), c & 1)
                        fence_async_shared()
                        s_a = warpgroup_mma(rp.index(par), qb_smem.permute((1, 0)), s_a, is_async=True)
                    if pingpong != 0:  # the scores issued: the other warpgroup's turn while this one waits
                        mbarrier.arrive(sched.index(1 - par))
                        ts += 1
                    s_a, s_b = warpgroup_mma_wait(0, deps=(s_a, s_b))
                    # this warpgroup's last scores of the item are done with q: the next item's may be copied
                    mbarrier.arrive(q_free.index(0), pred=t + 2 >= nt)
                    s = gl.where(ok[:, None], (s_a + s_b) * sm_scale2, float("-inf"))
                    m_new = gl.maximum(m, gl.max(s, axis=0))
                    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = gl.exp2(m - m_safe)
                    p = gl.exp2(s - m_safe[None, :])
                    l_acc = l_acc * alpha[None, :] + p
                    m = m_new
                    # P over the rope lanes (every warp's product read them: waited above); at D = 512 the buffer
                    # held this warpgroup's previous P, whose product was waited for in its previous tile
                    _p_view(rp, par).store(p.to(dt))
                    fence_async_shared()
                    o_lo = o_lo * alpha[None, :]
                    o_hi = o_hi * alpha[None, :]
                    kt = ka.permute((1, 0))
                    if pingpong != 0:
                        mbarrier.wait(sched.index(par), ts & 1)
                    o_lo = warpgroup_mma(kt.slice(0, 256, dim=0), _p_view(rp, par), o_lo, is_async=True)
                    o_hi = warpgroup_mma(kt.slice(256, 256, dim=0), _p_view(rp, par), o_hi, is_async=True)
                    if pingpong != 0:
                        mbarrier.arrive(sched.index(1 - par))
                        ts += 1
                    o_lo = warpgroup_mma_wait(1, deps=(o_lo,))
                    mbarrier.arrive(kv_empty.index(2 * st))  # the stage's first half back to the loader
                    o_hi = warpgroup_mma_wait(0, deps=(o_hi,))
                    mbarrier.arrive(kv_empty.index(2 * st + 1))
                    mbarrier.arrive(buf_empty.index(par))  # P read: the loader may gather the next rope lanes there
                    c += 1
            mbarrier.arrive(q_free.index(0), pred=nt <= par)  # no tile of this item: done with q at once
            # The merge: leave the other's half and this warpgroup's (max, sum); take the other's half of mine.
            l = gl.sum(l_acc, axis=0)
            if par == 0:
                keep = o_lo
                send = o_hi
            else:
                keep = o_hi
                send = o_lo
            pid = gl.program_id(0)
            mine = scr_ptr + ((pid * 2 + (k & 1)) * 2 + par).to(gl.int64) * SLOT
            theirs = scr_ptr + ((pid * 2 + (k & 1)) * 2 + 1 - par).to(gl.int64) * SLOT
            gl.store(mine + half_offs, send)
            gl.store(mine + HALF + offs_hl, m)
            gl.store(mine + HALF + 16 + offs_hl, l)
            gl.thread_barrier()  # every thread's stores before the one arrival (release, CTA scope)
            mbarrier.arrive(mg_ready.index(2 * par + (k & 1)))
            mbarrier.wait(mg_ready.index(2 * (1 - par) + (k & 1)), (k >> 1) & 1)
            other = gl.load(theirs + half_offs, cache_modifier=".cg")
            m_o = gl.load(theirs + HALF + offs_hl, cache_modifier=".cg")
            l_o = gl.load(theirs + HALF + 16 + offs_hl, cache_modifier=".cg")
            m_all = gl.maximum(m, m_o)
            m_safe = gl.where(m_all == float("-inf"), 0.0, m_all)
            a_me = gl.exp2(m - m_safe)
            a_o = gl.exp2(m_o - m_safe)
            o = keep * a_me[None, :] + other * a_o[None, :]
            offs_h = h0 + offs_hl
            hmask = offs_h < H
            scale = _final_scale(m_all, l * a_me + l_o * a_o, sink_ptr, offs_h, hmask, sink_s0, has_sink)
            lane = par * 256 + offs_f
            ptrs = out_ptr + row.to(gl.int64) * o_s0 + lane[:, None] * o_s2 + offs_h[None, :] * o_s1
            gl.store(ptrs, (o * scale[None, :]).to(out_ptr.dtype.element_ty),
                     mask=(lane < lanes)[:, None] & hmask[None, :])
            gbase += nt
            k += 1

    @gluon.jit(do_not_specialize=["ragged", "has_len", "has_sink", "lanes", "width", "n_items"])
    def _pp_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, scr_ptr,
                   skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                   q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2, n_items, n_hb, pingpong,
                   DB: gl.constexpr, WREGS: gl.constexpr):
        """Persistent: each program takes items (row, head block) pid, pid + grid, ...; the gathers run on."""
        dt: gl.constexpr = kv_ptr.dtype.element_ty
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        kv_a = gl.allocate_shared_memory(dt, [3, 64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        # Warpgroup j's buffer: its tile's rope lanes, then the tile's P. 64 x 16 (P only) at D = 512.
        RW: gl.constexpr = DB if DB > 0 else 16
        rp = gl.allocate_shared_memory(dt, [2, 64, RW], gl.NVMMASharedLayout.get_default_for([64, RW], dt))
        qa_smem = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        qb_smem = qa_smem
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dt, [16, DB], gl.NVMMASharedLayout.get_default_for([16, DB], dt))
        # One allocation per kind of mbarrier (gluon_sm90_ws says why); a pair per stage, one per 256-lane half.
        kv_ready = gl.allocate_shared_memory(gl.int64, [6, 1], bar_l)  # half h of stage s gathered: 2 s + h
        kv_empty = gl.allocate_shared_memory(gl.int64, [6, 1], bar_l)  # its product done
        buf_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # warpgroup j's P·V done with buffer j
        rope_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # a tile's rope lanes in buffer j
        q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)
        q_free = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l)  # both warpgroups' scores are done with q
        mg_ready = gl.allocate_shared_memory(gl.int64, [4, 1], bar_l)  # warpgroup j's half in the scratch: 2 j + parity
        sched = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)  # pingpong: warpgroup j's turn at the tensor cores
        # The loader's tuple, as gluon_sm90_ws lays it out; it reads none of the merge's or the turns' barriers.
        bars = (kv_ready, kv_empty, mg_ready, buf_empty, sched, rope_ready, q_ready, q_free)
        for i in gl.static_range(6):
            mbarrier.init(kv_ready.index(i), count=128)  # one cp.async arrival per loader thread
            mbarrier.init(kv_empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(buf_empty.index(i), count=1)
            mbarrier.init(rope_ready.index(i), count=128)
        for i in gl.static_range(4):
            mbarrier.init(mg_ready.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(sched.index(i), count=1)
        mbarrier.init(q_ready.index(0), count=128)  # one cp.async arrival per thread of warpgroup 0
        mbarrier.init(q_free.index(0), count=2)
        mbarrier.arrive(sched.index(0))  # warpgroup 0 takes the first turn
        fence_async_shared()
        zero = gl.program_id(0) * 0  # partition arguments must be values, not Python ints
        cargs = (qa_smem, qb_smem, kv_a, rp, bars, q_ptr, q_s0, q_s1, H, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                 skv, sm_scale2, len_ptr, len_s0, ragged, has_len, sink_ptr, sink_s0, has_sink, out_ptr, scr_ptr,
                 lanes, o_s0, o_s1, o_s2, n_items, n_hb, zero + 1, pingpong)
        largs = (kv_a, rp, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged, skv, n_items, n_hb,
                 zero + 1, out_ptr)
        gl.warp_specialize([
            (_attend_part, cargs + (zero,)),
            (_attend_part, cargs + (zero + 1,)),
            (_load_part, largs),
        ], [4, 4], WREGS)


# Registers per thread of compute warpgroup 1 and the loader (setmaxnreg); warpgroup 0, the default
# partition, gets what is left of 3 x 168 per warp slot: 224.
WORKER_REGS = (224, 56)


def scratch_floats(programs: int) -> int:
    """Floats of the merge's scratch: a slot per (program, item parity, warpgroup)."""
    return programs * 2 * 2 * (256 * 16 + 32)


def launch_prefill_pp(args: KernelArgs, *, worker_regs: tuple[int, int] | None = None, pingpong: bool = False) -> None:
    """The no-split prefill; call only where ``gluon_sm90.supports``. One program per multiprocessor."""
    from .triton_decode import sm_count

    q, kv, out = args.q, args.kv, args.output
    rows, heads, _ = q.shape
    if rows == 0 or heads == 0 or out.shape[2] == 0:
        return
    p = pack(args)
    n_hb = (heads + HEAD_BLOCK - 1) // HEAD_BLOCK
    items = rows * n_hb
    grid = min(items, sm_count(q.device))
    scratch = torch.empty(scratch_floats(grid), dtype=torch.float32, device=q.device)
    _pp_kernel[(grid,)](
        q, kv, p.idx, p.length, p.indptr, p.sink, out, scratch,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.has_sink, p.lanes,
        q.stride(0), q.stride(1), kv.stride(0), p.idx_s0, p.idx_s1, p.len_s0,
        p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2), items, n_hb,
        int(pingpong), DB=int(q.shape[2]) - 512, WREGS=tuple(worker_regs or WORKER_REGS), num_warps=4, maxnreg=168,
    )
