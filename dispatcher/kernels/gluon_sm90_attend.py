"""The one-warpgroup Hopper attention loops behind ``gluon_sm90``'s kernels: ``_attend`` (STAGES tiles resident,
the gathers of the next ones under this tile's products) and ``_attend_pipe`` (D = 512: tile t - 1's P·V on the
tensor cores under tile t's softmax). Each returns one row's (m, l, Oᵀ) over positions [lo, hi) for 16 heads;
``gluon_sm90._prefill_kernel`` and ``_partial_kernel`` finish them into the output or a split-K partial. The design
(wgmma with the kv slots as M, the softmax state in registers) is in ``gluon_sm90``'s docstring.
"""

from __future__ import annotations

from .gluon_sm90_parts import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from .gluon_sm90_parts import (_convert_tile, _copy_q, _gather, _load_slots, _prefetch_span, _row_len,
                                   _row_len_finish, _row_len_start, _softmax_tile, _valid, cta_barrier)

    @gluon.jit
    def _attend(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, seg, base, idx_s1, skv, H, sm_scale2,
                q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK: gl.constexpr, DB: gl.constexpr,
                STAGES: gl.constexpr, ROPE1: gl.constexpr, CHAINS: gl.constexpr, KV8: gl.constexpr = 0):
        """Online softmax over positions [lo, hi) of one row for 16 heads: (m, l, Oᵀ), base 2, Oᵀ [512, 16] fp32.

        Positions at or past the row's length (``_row_len``) are gathered where they hold a slot
        but masked out of the softmax. The prologue asks for the first tile's slot numbers before
        anything else, and the length's loads go out with the first gathers but are reduced only
        under tile 0's scores, so the loop's set-up runs while they are in flight (0.3-0.45 µs off the
        16-row decode at 512+64: docs/kernels.md, "Decode kernel design figures").

        STAGES tiles of the 512 lanes are resident: while one is computed, STAGES - 1 gathers are in
        flight. The DB rope lanes have a buffer per stage, or with ROPE1 a single one, refilled for
        the next tile as soon as this tile's scores are done; that is what lets three stages fit in
        shared memory at 512+64.

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
        # then the products): they are asked for before anything else is issued.
        sl0 = _load_slots(idx_ptr, base, idx_s1, lo, hi, rows_cp)
        # q: 16 heads, resident in shared memory for every tile (wgmma's B operand, as qᵀ), copied by
        # cp.async ahead of the first gathers, in their commit group: a plain load is scheduled after
        # the gathers' issue and queues behind every program's gathers.
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
        slots = _load_slots(idx_ptr, base, idx_s1, lo + AHEAD * 64, hi, rows_cp)
        # The row's length is loaded here but reduced only once tile 0's scores are issued: reduced here, the
        # warps would wait for it and only then run the loop's set-up, about 0.3 µs after tile 0 has landed.
        # Positions [lim, hi) are past the row's length.
        given, first = _row_len_start(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK)
        lim = hi  # until the length is known, in tile 0
        for t in range(n_tiles):
            stage = t % STAGES
            async_copy.wait_group(STAGES - 2)  # this thread's copies of tile t have landed
            fence_async_shared()
            cta_barrier()  # everyone's copies of tile t landed, and every warp is done with tile t - 1
            if not LATE:  # refill the stage tile t - 1 used
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
            ok = _valid(idx_ptr, base, idx_s1, lo + t * 64, lim, skv, rows_s)
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
                if t + 1 < n_tiles:
                    _gather(kv_ptr, kv_s0, _load_slots(idx_ptr, base, idx_s1, lo + (t + 1) * 64, hi, rows_cp),
                            skv, kv_b.index(0), 512, DB, cp)
                async_copy.commit_group()
                if t + STAGES - 1 < n_tiles:
                    _gather(kv_ptr, kv_s0, slots, skv, kv_a.index((t + STAGES - 1) % STAGES), 0, 512, cp)
                async_copy.commit_group()
                slots = _load_slots(idx_ptr, base, idx_s1, lo + (t + STAGES) * 64, hi, rows_cp)
            o = o * alpha[None, :]
            o = warpgroup_mma(ka.permute((1, 0)), p_smem, o, is_async=True)
            o = warpgroup_mma_wait(0, deps=(o,))
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
                     q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK: gl.constexpr, DB: gl.constexpr):
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
        slots = _load_slots(idx_ptr, base, idx_s1, lo + 64, hi, rows_cp)
        n = _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK)
        lim = gl.minimum(hi, n)
        ok = _valid(idx_ptr, base, idx_s1, lo, lim, skv, rows_s)
        # Tile 0: its scores and softmax, nothing before it to overlap.
        ok_next = _valid(idx_ptr, base, idx_s1, lo + 64, lim, skv, rows_s)
        async_copy.wait_group(0)
        fence_async_shared()
        cta_barrier()
        slots = _refill_pipe(kv_ptr, kv_s0, slots, skv, kv_a, idx_ptr, base, idx_s1, lo, hi, 0, n_tiles, cp)
        s = warpgroup_mma(kv_a.index(0), qa_smem.permute((1, 0)), s0, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        m, l_acc, alpha, p = _softmax_tile(s, ok, m, l_acc, sm_scale2)
        p_smem.index(0).store(p.to(dt))
        fence_async_shared()
        ok = ok_next
        for t in range(1, n_tiles):
            ok_next = _valid(idx_ptr, base, idx_s1, lo + (t + 1) * 64, lim, skv, rows_s)
            async_copy.wait_group(0)  # this thread's copies of tile t have landed
            fence_async_shared()
            cta_barrier()  # tile t landed everywhere; P(t - 1) written; tile t - 2's P·V done in every warp
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
            ok = ok_next
        cta_barrier()  # the last P written everywhere
        last = n_tiles - 1
        o = warpgroup_mma(kv_a.index(last % 3).permute((1, 0)), p_smem.index(last % 2), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=(o,))
        async_copy.wait_group(0)
        return m, gl.sum(l_acc, axis=0), o
