"""The partitions of ``gluon_sm90_ws``'s warp-specialised kernel: the loader, the two scores+softmax warpgroups
and P·V, with the work items and the buffers' float views they share.

How the partitions hand tiles over is in ``gluon_sm90_ws``'s docstring.
"""

from __future__ import annotations

from .gluon_sm90_parts import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                 warpgroup_mma_wait)

    from .gluon_sm90_parts import (_copy_q, _gather, _launch_dependents, _load_slots, _p_view, _partial_scale,
                                   _prefetch_span, _row_len, _store_t, _valid)
    from .gluon_sm90_ws_fp8 import CP8, _expand_half, _expand_rope, _kv8_mode
    from .triton_prefill import finish_scale, row_bounds
    from .triton_stamps import STAMP_ARGS, stamp_start

    STAGES = 3

    # The warp-specialised kernels (gluon_sm90_ws, gluon_sm90_ws_d512) take one launch signature
    # (gluon_sm90_ws.launch_kernel); the arguments that change from call to call are not specialised on, so one
    # compiled kernel serves every row count, width and flag.
    ws_kernel = gluon.jit(do_not_specialize=["ragged", "has_len", "has_sink", "lanes", "width", "n_items", "splits",
                                             "partial"] + STAMP_ARGS)

    @gluon.jit
    def _ws_begin(stamp_ptr, stamp_first, CLOCK: gl.constexpr, PDL: gl.constexpr):
        """A warp-specialised kernel's first steps: the call's start stamp and, for the decode's partials, the
        dependent launch of the reduce (scheduled now, it waits for this grid in gdc_wait)."""
        stamp_start(stamp_ptr, stamp_first, CLOCK)
        if PDL:
            _launch_dependents()

    # wgmma's accumulator layout for 64 x 16 per warpgroup, as gluon_sm90's kernels use it
    MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16]))

    @gluon.jit
    def _span(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged):
        """Work item w: (row, first head, split, offset of the row's first index, row width, positions [lo, hi))."""
        hb = w % n_hb
        rs = w // n_hb
        split = rs % splits
        row = rs // splits
        base, seg = row_bounds(idx_ptr, idx_s0, idx_s1, width, None, None, indptr_ptr, row, ragged, None, None,
                               LENGTH=False)  # the row's positions, not its length
        seg = seg.to(gl.int32)
        chunk = gl.cdiv(gl.cdiv(seg, splits), 64) * 64  # split by the row's width, as gluon_sm90's partials
        lo = split * chunk
        hi = gl.minimum(lo + chunk, seg)
        return row, hb * 16, split, base, seg, lo, hi

    @gluon.jit
    def _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged):
        """``_span`` and the item's count of 64-slot tiles."""
        row, h0, split, base, seg, lo, hi = _span(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged)
        return row, h0, split, base, seg, lo, hi, gl.cdiv(gl.maximum(hi - lo, 0), 64)

    @gluon.jit
    def _loader_item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged):
        """Work item w for the loader: (offset of the row's first index, positions [lo, hi), tiles), its slot
        numbers asked of L1 first so that the tiles' loads of them do not wait on L2."""
        row, h0, split, base, seg, lo, hi = _span(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged)
        for j0 in range(lo, hi, 256):
            _prefetch_span(idx_ptr, base, idx_s1, j0, hi)
        return base, lo, hi, gl.cdiv(gl.maximum(hi - lo, 0), 64)

    @gluon.jit
    def _fill_stage(kv_empty, kv_ready, kv_a, g, idx_ptr, base, idx_s1, lo, t, hi, kv_ptr, kv_s0, skv,
                    cp: gl.constexpr):
        """Tile t of an item (the program's tile g) into stage g % 3, all 512 lanes, once P·V has released the
        stage (from tile g - 3); its ``kv_ready`` completes when every loader thread's copies have landed.
        Returns the tile's slot numbers."""
        st = g % 3
        slots = _load_slots(idx_ptr, base, idx_s1, lo + t * 64, hi, gl.SliceLayout(1, cp))
        mbarrier.wait(kv_empty.index(st), ((g // 3) & 1) ^ 1)
        fence_async_shared()
        _gather(kv_ptr, kv_s0, slots, skv, kv_a.index(st), 0, 512, cp)
        async_copy.mbarrier_arrive(kv_ready.index(st), increment_count=False)
        return slots

    @gluon.jit
    def _turn(bars, t, c0, c1, flip: gl.constexpr):
        """Tile t's buffer j = t % 2 (one per softmax warpgroup), once barrier j of ``bars`` has completed its
        next phase (``c0``/``c1`` completed before; ``flip`` 1 for the first wait to pass at once)."""
        j = t % 2
        cj = gl.where(j == 0, c0, c1)
        mbarrier.wait(bars.index(j), (cj & 1) ^ flip)
        fence_async_shared()
        return j

    @gluon.jit
    def _softmax_start(idx_ptr, base, idx_s1, seg, hi, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK: gl.constexpr):
        """A softmax warpgroup's state at an item's start: the position from which it masks the scores out (the
        row's length, at most ``hi``), the running max (-inf) and the per-thread partial sums (0)."""
        lim = gl.minimum(hi, _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK))
        m = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, MMA))  # as of this warpgroup's last tile
        l_acc = gl.zeros([64, 16], gl.float32, MMA)  # relative to m: reduced at the end
        return lim, m, l_acc

    @gluon.jit
    def _write_item(o, o_hi, HALVES: gl.constexpr, m0, l0, m1, l1, row, h0, split, dst):
        """An item's Oᵀ, with the two softmax warpgroups' totals merged, into the attention output (the prefill: the
        sink's mass joined, then 1/l) or, where ``partial``, a split-K partial (Oᵀ / l and the log-sum-exp, for
        ``triton_decode``'s reduce). With HALVES ``o`` holds lanes [0, 256) and ``o_hi`` lanes [256, 512); else
        ``o`` holds all 512. ``dst``: (out, o_s0, o_s1, o_s2, part_o, part_lse, sink, sink_s0, has_sink, H, lanes,
        splits, partial)."""
        (out_ptr, o_s0, o_s1, o_s2, part_o_ptr, part_lse_ptr, sink_ptr, sink_s0, has_sink, H, lanes, splits,
         partial) = dst
        m, l = _merge_totals(m0, l0, m1, l1)
        offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(0, MMA))
        hmask = offs_h < H
        if partial != 0:
            inv, lse = _partial_scale(m, l)
            part = (row.to(gl.int64) * splits + split) * H + offs_h  # [16] partial-row ids
            gl.store(part_lse_ptr + part, lse, mask=hmask)
            _store_t(part_o_ptr, 0, part, lanes, 1, lanes, hmask, o, inv)
            if HALVES:
                _store_t(part_o_ptr, 0, part, lanes, 1, lanes, hmask, o_hi, inv, 256)
        else:
            scale = finish_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
            _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o, scale)
            if HALVES:
                _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o_hi, scale, 256)

    @gluon.jit
    def _take_max(m_smem, m_ready, par, t, cm):
        """The running max from the other warpgroup's tile t - 1, and the count of maxima received."""
        m_prev = gl.full([16], float("-inf"), gl.float32, gl.SliceLayout(0, MMA))  # the max over tiles < t
        if t > 0:
            mbarrier.wait(m_ready.index(1 - par), cm & 1)
            m_prev = m_smem.index(1 - par).load(gl.SliceLayout(0, MMA))
            cm += 1
        return m_prev, cm

    @gluon.jit
    def _tile_max(s):
        """The tile's max of each head: a reduction across the warpgroup's four warps (shared memory, barriers)."""
        return gl.max(s, axis=0)

    @gluon.jit
    def _pass_max(m_smem, m_ready, par, t, nt, m_new):
        """The new max, for the other warpgroup's tile t + 1 (which waits for it), if there is one."""
        if t + 1 < nt:
            m_smem.index(par).store(m_new)
            mbarrier.arrive(m_ready.index(par))

    @gluon.jit
    def _exp_tile(s, m, m_new, l_acc):
        """P relative to the new max, and the per-thread partial sums moved from m to it."""
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_safe[None, :])
        l_acc = l_acc * gl.exp2(m - m_safe)[None, :] + p
        return p, m_safe, l_acc

    @gluon.jit
    def _softmax_tile(s, m, l_acc, m_smem, m_ready, par, t, nt, cm):
        """Tile t's online softmax in one of two warpgroups that take alternate tiles of an item.

        The running max comes from the other warpgroup's tile t - 1 (m_smem, m_ready) and goes on to its
        tile t + 1.
        Returns P (relative to the new max), the max before this tile and after it, the
        per-thread partial sums moved to the new max, and the count of maxima received (cm).
        """
        m_prev, cm = _take_max(m_smem, m_ready, par, t, cm)
        m_new = gl.maximum(m_prev, _tile_max(s))
        _pass_max(m_smem, m_ready, par, t, nt, m_new)
        p, m_safe, l_acc = _exp_tile(s, m, m_new, l_acc)
        return p, m_prev, m_safe, m_new, l_acc, cm

    @gluon.jit
    def _softmax_tile_redo(s, m, l_acc, m_smem, m_ready, par, t, nt, cm):
        """``_softmax_tile`` for the prefill with a reference max (``REDO``): once an item has a finite max, P stays
        relative to it (the reference) rather than to the running max.

        That leaves out the tile max, whose reduction across the warps (a shared-memory round trip and two barriers,
        2.7 times slower beside wgmma's operand reads) is on the way from each tile's scores to its P. Any max
        already seen serves the online softmax as its reference: P, the sums and Oᵀ only grow with the scores above
        it, and ``_flag_redo`` has the item computed again should they grow too far.

        The running max passes between the warpgroups only until the reference is set (2.8% faster at 512+64 than
        passing it at every tile, answers bit-identical; docs/kernels.md, "Prefill kernel design figures"): a
        tile done exactly passes its max on; a warpgroup that already holds the reference (its own ``m`` finite)
        neither waits for one nor passes one on, and one that receives it takes it without passing it back. Waits
        and passes stay paired: a warpgroup waits at a tile exactly when it holds no reference, which is exactly
        when the other passed its max at the tile before (both test the same max, the last one passed, which each
        then holds).
        """
        held = gl.min(m, axis=0) > float("-inf")  # this warpgroup holds the item's reference
        if held:
            m_prev = m
            m_new = m
        else:
            m_prev, cm = _take_max(m_smem, m_ready, par, t, cm)
            lazy = gl.min(m_prev, axis=0) > float("-inf")  # set by the other's last tile
            if lazy:  # every warp holds all 16 heads: no exchange
                m_new = m_prev
            else:  # done exactly: the other warpgroup's next tile waits for this max
                m_new = gl.maximum(m_prev, _tile_max(s))
                _pass_max(m_smem, m_ready, par, t, nt, m_new)
        p, m_safe, l_acc = _exp_tile(s, m, m_new, l_acc)
        return p, m_prev, m_safe, m_new, l_acc, cm

    @gluon.jit
    def _flag_redo(l_sum, flag_ptr, dt: gl.constexpr):
        """At a softmax warpgroup's last tile of an item under a reference max, its sum of P per head (``l_sum``):
        past what P in ``dt`` holds with room to spare (2^64 in bf16, 2^15 in fp16, whose largest is 65,504) or
        not finite, 1 at ``flag_ptr``, and the launcher has the item computed again (``gluon_sm90_ws.redo_flagged``).

        Under a reference every P is at most the sum it is part of, and later tiles never scale the sum down, so
        in an item not flagged every P fitted ``dt``, and the sums and Oᵀ float32, once a tile.
        """
        heads_l: gl.constexpr = gl.SliceLayout(0, MMA)
        limit: gl.constexpr = 2.0 ** 64 if dt == gl.bfloat16 else 2.0 ** 15
        over = (l_sum > limit) | (l_sum != l_sum)
        gl.store(flag_ptr + gl.zeros([16], gl.int32, heads_l), gl.full([16], 1, gl.int32, heads_l), mask=over)

    @gluon.jit
    def _merge_totals(m0, l0, m1, l1):
        """The two softmax warpgroups' totals as one: the larger last max (Oᵀ is relative to it) and the sum."""
        m = gl.maximum(m0, m1)
        m_safe = gl.where(m == float("-inf"), 0.0, m)
        return m, l0 * gl.exp2(m0 - m_safe) + l1 * gl.exp2(m1 - m_safe)

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
    else:

        @gluon.jit
        def _vec_view(rp, j, at: gl.constexpr):
            n: gl.constexpr = rp.shape[1] * rp.shape[2] // 2
            return rp.index(j)._reinterpret(gl.float32, [n], gl.SwizzledSharedLayout(1, 1, 1, [0])).slice(at, 16)

    @gluon.jit
    def _softmax_part(qa_smem, qb_smem, kv_a, rp, kv8, rp8, kv_ptr, m_smem, bars, q_ptr, q_s0, q_s1, H,
                      idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged,
                      has_len, n_items, n_hb, splits, redo_ptr, par):
        """One of two scores+softmax warpgroups: the tiles t with t % 2 == par of every item.

        The scores, the exponentials and the P hand-over of consecutive tiles run in the two
        warpgroups at once; only the running max passes from one to the other (m_smem, m_ready), so
        P·V sees one max sequence as with a single softmax. Each keeps its own sum, relative to the
        last max it saw, and writes both beside its last P of the item; P·V merges the two. Warpgroup 0
        also writes each item's q into shared memory, once both are done with the previous item's
        (q_free), and tells warpgroup 1 (q_ready).

        Buffer ``par`` of ``rp`` is this warpgroup's: the loader gathers its tile's rope lanes there,
        and once the scores are done this warpgroup writes the tile's P and rescale factors over
        them, for P·V, which releases the buffer (buf_empty) to the loader for the warpgroup's
        next tile.

        With int32 flags at ``redo_ptr`` (the prefill where its reference pays, ``gluon_sm90_ws.reference_pays``),
        P is kept relative to each item's reference max (``_softmax_tile_redo``) and items are flagged to compute
        again; with int8 ones (the prefill elsewhere, the decode's partials), the exact running max (``_softmax_tile``):
        two specialisations, each with only its own path's code.
        """
        kv_ready, kv_empty, p_ready, buf_empty, m_ready, rope_ready, q_ready, q_free = bars
        # Worker partitions take no constexpr arguments (Triton 3.6): the rope width comes from q's buffer.
        DB: gl.constexpr = qb_smem.shape[1] if qb_smem.shape[1] != 512 else 0
        HALVES: gl.constexpr = kv_ready.shape[0] == 6  # a barrier pair per stage: its two 256-lane halves
        dt: gl.constexpr = kv_a.dtype
        KV8: gl.constexpr = _kv8_mode(kv_ptr.dtype.element_ty, dt)  # an fp8 pool: this warpgroup converts its tiles
        REDO: gl.constexpr = redo_ptr.dtype.element_ty == gl.int32  # a reference max, and flags to write
        mma: gl.constexpr = MMA
        rows_s: gl.constexpr = gl.SliceLayout(1, mma)
        heads_l: gl.constexpr = gl.SliceLayout(0, mma)
        s0 = gl.zeros([64, 16], gl.float32, mma)
        gbase = 0  # tiles of this program's earlier items: stage and phase of kv_ready
        c = 0  # tiles this warpgroup has handed to P·V: phase of its buffer's barriers
        cm = 0  # running maxima received from the other warpgroup: phase of its m_ready
        k = 0  # items done
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi, nt = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                          ragged)
            if par == 0:  # this item's q, once both warpgroups' scores of the previous item are done with the last
                # one: copied by cp.async, which arrives on Q_READY, so its latency overlaps the count below
                mbarrier.wait(q_free.index(0), (k - 1) & 1, pred=k > 0)
                _copy_q(qa_smem, qb_smem, q_ptr, q_s0, q_s1, H, row, h0, DB)
                async_copy.mbarrier_arrive(q_ready.index(0), increment_count=False)
            # The row's length (one load up to 2048 indices): only the softmax masks need it.
            lim, m, l_acc = _softmax_start(idx_ptr, base, idx_s1, seg, hi, len_ptr, len_s0, row, ragged, has_len, 2048)
            mbarrier.wait(q_ready.index(0), k & 1)
            for t in range(par, nt, 2):
                g = gbase + t
                ok = _valid(idx_ptr, base, idx_s1, lo + t * 64, lim, skv, rows_s)
                ka = kv_a.index(g % 3)
                if HALVES:  # each half's product as soon as that half has landed
                    mbarrier.wait(kv_ready.index(2 * (g % 3)), (g // 3) & 1)
                else:
                    mbarrier.wait(kv_ready.index(g % 3), (g // 3) & 1)
                fence_async_shared()
                if KV8 != 0:  # an fp8 pool: each half converted once landed (the second under the first's product)
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
                if REDO:
                    p, m_prev, m_safe, m, l_acc, cm = _softmax_tile_redo(s, m, l_acc, m_smem, m_ready, par, t, nt, cm)
                else:
                    p, m_prev, m_safe, m, l_acc, cm = _softmax_tile(s, m, l_acc, m_smem, m_ready, par, t, nt, cm)
                if DB == 0:  # no gather in between: wait until P·V is done with this buffer's previous P
                    mbarrier.wait(buf_empty.index(par), (c & 1) ^ 1)
                _p_view(rp, par).store(p.to(dt))  # over the rope lanes: every warp's product read them (waited)
                _vec_view(rp, par, ALPHA).store(gl.exp2(m_prev - m_safe))  # P·V's Oᵀ moves from max m_prev to m_new
                if t + 2 >= nt:  # this warpgroup's last tile of the item: its totals, relative to its last max
                    l_sum = gl.sum(l_acc, axis=0)
                    _vec_view(rp, par, FIN_M).store(m)
                    _vec_view(rp, par, FIN_L).store(l_sum)
                    if REDO:
                        _flag_redo(l_sum, redo_ptr + w, dt)
                fence_async_shared()
                mbarrier.arrive(p_ready.index(par))
                c += 1
            mbarrier.arrive(q_free.index(0))  # this warpgroup's scores of the item are done with q
            gbase += nt
            k += 1

    @gluon.jit
    def _pv_part(kv_a, rp, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, part_o_ptr, part_lse_ptr, H, lanes,
                 o_s0, o_s1, o_s2, n_items, n_hb, splits, partial):
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
        dst = (out_ptr, o_s0, o_s1, o_s2, part_o_ptr, part_lse_ptr, sink_ptr, sink_s0, has_sink, H, lanes, splits,
               partial)
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            row, h0, split, base, seg, lo, hi, nt = _item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                          ragged)
            o = gl.zeros([512, 16], gl.float32, mma)
            o_lo = gl.zeros([256, 16], gl.float32, mma)
            o_hi = gl.zeros([256, 16], gl.float32, mma)
            m0 = gl.full([16], float("-inf"), gl.float32, heads_l)
            m1 = m0
            l0 = gl.zeros([16], gl.float32, heads_l)
            l1 = l0
            for t in range(nt):
                j = _turn(p_ready, t, c0, c1, 0)
                alpha = _vec_view(rp, j, ALPHA).load(heads_l)
                if HALVES:  # the stage's first half goes back to the loader as soon as its product is done
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
            _write_item(o_lo if HALVES else o, o_hi, HALVES, m0, l0, m1, l1, row, h0, split, dst)

    @gluon.jit
    def _load_part(kv_a, rp, kv8, rp8, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged,
                   skv, n_items, n_hb, splits):
        """Each tile's 512 lanes into stage g % 3 once P·V has released it, then its rope lanes into buffer t % 2.

        Each item's slot numbers are asked of L1 first, so the tiles' loads of them do not wait on L2.
        """
        kv_ready, kv_empty, p_ready, buf_empty, m_ready, rope_ready, q_ready, q_free = bars
        DB: gl.constexpr = rp.shape[2] if rp.shape[2] == 64 else 0  # the buffers are 64 x 32 (no rope lanes) at 512+0
        HALVES: gl.constexpr = kv_ready.shape[0] == 6
        FP8: gl.constexpr = kv_ptr.dtype.element_ty != kv_a.dtype  # bytes into the stages' upper halves (kv8)
        cp: gl.constexpr = CP8 if FP8 else gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_cp: gl.constexpr = gl.SliceLayout(1, cp)
        if FP8:
            kv_ptr = kv_ptr.to(gl.pointer_type(gl.uint8), bitcast=True)
        g = 0
        c0 = 0  # rope lanes gathered into buffer 0, and 1: the phases of buf_empty
        c1 = 0
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            base, lo, hi, nt = _loader_item(w, n_hb, splits, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged)
            for t in range(nt):
                if HALVES:  # each 256-lane half as soon as P·V is done with it
                    st = g % 3
                    slots = _load_slots(idx_ptr, base, idx_s1, lo + t * 64, hi, rows_cp)
                    for h in gl.static_range(2):
                        mbarrier.wait(kv_empty.index(2 * st + h), ((g // 3) & 1) ^ 1)
                        fence_async_shared()
                        if FP8:  # 64 lanes a block, into the half's upper 16 KB
                            for b in gl.static_range(4):
                                _gather(kv_ptr, kv_s0, slots, skv, kv8.index(16 * st + 8 * h + 4 + b),
                                        256 * h + 64 * b, 64, cp)
                        else:
                            _gather(kv_ptr, kv_s0, slots, skv, kv_a.index(st).slice(256 * h, 256, dim=1), 256 * h,
                                    256, cp)
                        async_copy.mbarrier_arrive(kv_ready.index(2 * st + h), increment_count=False)
                else:
                    slots = _fill_stage(kv_empty, kv_ready, kv_a, g, idx_ptr, base, idx_s1, lo, t, hi, kv_ptr, kv_s0,
                                        skv, cp)
                if DB > 0:  # P·V has read the P written over this buffer's previous rope lanes
                    j = _turn(buf_empty, t, c0, c1, 1)
                    if FP8:  # into the buffer's upper 4 KB
                        _gather(kv_ptr, kv_s0, slots, skv, rp8.index(2 * j + 1), 512, DB, cp)
                    else:
                        _gather(kv_ptr, kv_s0, slots, skv, rp.index(j), 512, DB, cp)
                    async_copy.mbarrier_arrive(rope_ready.index(j), increment_count=False)
                    c0 += 1 - j
                    c1 += j
                g += 1
