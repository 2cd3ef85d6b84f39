"""The prefill's redo inside the warp-specialised kernel: after its partitions join, each persistent program
computes again, with the exact running max, the items it flagged under its reference max, and zeroes their flags.

This is ``triton_prefill._redo_kernel``'s work without its launch: the items are this program's own (pid, pid +
grid, ...), so no other program's writes are read, and the whole item is computed again by
``gluon_sm90_attend._attend`` (one warpgroup: the default partition's four warps, the only ones left after the
join) and written over the output the reference max left. An fp8 pool is read as its bytes, as the one-warpgroup
decode reads one. Where the kernel does it: ``gluon_sm90_ws.redo_in_kernel``.
"""

from __future__ import annotations

from .gluon_sm90_parts import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from .gluon_sm90_attend import _attend
    from .gluon_sm90_parts import _store_t
    from .gluon_sm90_ws_parts import _span
    from .triton_prefill import finish_scale

    @gluon.jit
    def _redo_own(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, skv, width, H, sm_scale2, ragged,
                  has_len, has_sink, lanes, q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                  n_items, n_hb, redo_ptr, DB: gl.constexpr, KV8: gl.constexpr):
        """This program's flagged items (row, head block), each computed again exactly and its flag zeroed."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        pool = kv_ptr
        if KV8:  # the pool's bytes, as the one-warpgroup loop converts them
            pool = kv_ptr.to(gl.pointer_type(gl.uint8), bitcast=True)
        for w in range(gl.program_id(0), n_items, gl.num_programs(0)):
            if gl.load(redo_ptr + w) != 0:
                row, h0, split, base, seg, lo, hi = _span(w, n_hb, 1, idx_ptr, idx_s0, idx_s1, width, indptr_ptr,
                                                          ragged)
                m, l, o = _attend(q_ptr, pool, idx_ptr, row, h0, 0, seg, seg, base, idx_s1, skv, H, sm_scale2,
                                  q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, 1024, DB, 2, False, 1, KV8)
                offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(0, mma))
                hmask = offs_h < H
                scale = finish_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
                _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o, scale)
                gl.store(redo_ptr + w, 0)
