"""The Gluon building blocks the Hopper kernels share: a row's length, slot loads and cp.async gathers, q's copy,
mbarrier sets, the online-softmax step, fp8 conversion, and the output and partial stores.

``gluon_sm90`` (the one-warpgroup prefill and the split-K decode's partials, through ``gluon_sm90_attend``),
``gluon_sm90_ws`` and ``gluon_sm90_ws_d512`` (the warp-specialised kernels) build on these; a row's span
(``triton_prefill.row_bounds``) and the output's final factor (``finish_scale``) they take from the Triton tile
loop itself. Every function is ``@gluon.jit`` and inlined where it is called; the math and edge cases are the
contract of docs/kernels.md. ``HAVE_GLUON`` is False where this Triton has no Gluon (or there is no Triton): then
nothing else is defined.
"""

from __future__ import annotations

try:  # Gluon and its Hopper ops: Triton >= 3.5 with the NVIDIA backend
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

    # Triton 3.9 renamed the cp.async copy (async_copy_global_to_shared -> async_load); same arguments.
    cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # likewise (gl.barrier in 3.9)
    from .fp8_ptx import PTX_E4M3_BF16, PTX_E4M3_F16, PTX_E5M2_BF16, PTX_E5M2_F16

    HAVE_GLUON = True
except Exception:  # noqa: BLE001 - no Gluon in this Triton (or no Triton): the Triton kernels serve
    HAVE_GLUON = False


if HAVE_GLUON:

    @gluon.jit
    def _count_valid(idx_ptr, base, idx_s1, j_from, seg, cnt, CNT_BLOCK: gl.constexpr):
        """``cnt`` plus, lane by lane, the indices >= 0 among a row's positions [j_from, seg), CNT_BLOCK at a time."""
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        for j0 in range(j_from, seg, CNT_BLOCK):
            offs = j0 + gl.arange(0, CNT_BLOCK, lay)
            v = gl.load(idx_ptr + base + offs.to(gl.int64) * idx_s1, mask=offs < seg, other=-1)
            cnt += (v >= 0).to(gl.int32)
        return cnt

    @gluon.jit
    def _row_len(idx_ptr, base, idx_s1, seg, len_ptr, len_s0, row, ragged, has_len, CNT_BLOCK: gl.constexpr):
        """The row's length in positions, as ``triton_prefill.row_bounds``: topk_length, else the count of indices >= 0.

        Only the softmax needs it: the kernels split and gather by the row's width, so this runs
        while the first gathers are in flight instead of before them. ``_attend`` issues the same loads
        (``_row_len_start``) and reduces them (``_row_len_finish``) apart; written as those two, this
        one would spill 16 bytes in the warp-specialised kernels at 512+64.
        """
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        n = seg
        if has_len != 0:
            n = gl.minimum(gl.load(len_ptr + row.to(gl.int64) * len_s0).to(gl.int32), seg)
        elif ragged == 0:  # dense without topk_length: the count of indices >= 0
            cnt = _count_valid(idx_ptr, base, idx_s1, 0, seg, gl.zeros([CNT_BLOCK], gl.int32, lay), CNT_BLOCK)
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
        load the rest here).

        The count's loop is ``_count_valid``'s, written out: called, it leaves the same instructions but ptxas
        allocates the fp8 decode partials' registers differently."""
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
        later tiles' slot loads hit L1. With topk_length or ragged indices nothing would: each later
        tile's slot load would queue behind every program's gathers, and the lengths would cost the
        16-row decode at 512+64 0.57-0.71 µs instead of 0.28-0.39 (docs/kernels.md, "Decode kernel
        design figures").
        Issued before the first gathers, this returns nothing and waits for nothing. The
        warp-specialised loaders ask for each item's slot numbers this way, 256 at a time, with or
        without lengths.
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
    def _launch_dependents():
        """Programmatic dependent launch: the next kernel in the stream (the decode's reduce) may be scheduled now;
        it waits for this grid's writes in its ``gdc_wait``."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _barriers(n: gl.constexpr, counts: gl.constexpr):
        """One mbarrier allocation of ``n`` per entry of ``counts``, barrier i of each initialised in turn to expect
        counts[k] arrivals a phase.

        One allocation per kind of barrier: the compiler's shared-memory hazard analysis cannot tell apart two
        entries of one allocation indexed at run time, and would put a partition-wide barrier between every arrive
        and wait on it."""
        bars = ()
        for k in gl.static_range(len(counts)):
            bars = bars + (gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout()),)
        for i in gl.static_range(n):
            for k in gl.static_range(len(counts)):
                mbarrier.init(bars[k].index(i), count=counts[k])
        return bars

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
    def _partial_scale(m, l):
        """A split-K partial's factor 1/l and log-sum-exp (base 2, as ``triton_decode``'s reduce reads it);
        0 and -inf for heads with nothing valid."""
        inv = gl.where(l > 0.0, 1.0 / gl.where(l > 0.0, l, 1.0), 0.0)
        lse = gl.where(l > 0.0, m + gl.log2(gl.where(l > 0.0, l, 1.0)), float("-inf"))
        return inv, lse
