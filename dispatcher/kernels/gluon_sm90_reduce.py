"""The split-K decode's reduce inside its partial kernel (``gluon_sm90._split_decode_kernel``): one launch, not two.

The ``splits`` programs of a group (a query row's head block) each write their partial, count themselves in on the
group's counter, wait until the whole group has, and then each combine one slice of the group's 16 heads x lanes
over every split, as ``triton_decode``'s reduce would, straight into the output. The wait is safe only if every
program of the grid is resident at once, so the kernel is launched cooperatively (the driver refuses a grid that
does not fit), and the host takes this path only where the grid fits (``gluon_sm90.split_reduce_fits``).

The counter needs no memset: each program counts itself in once (arrival) and once more when it has read what it
needed (departure), and the group's last departure sets it back to zero, so it is zero whenever a call starts.
A group's reads follow an acquire of every arrival, and its writes precede a release: the partials from the other
multiprocessors are read past L1 (``.cg``), which is not coherent with their writes.

Why one launch: on an H200's host each launch of ours costs 9-11 µs of host time, about what the whole kernel takes
on the GPU at 2-16 rows (docs/benchmarks.md, "Host cost of a call").
"""

from __future__ import annotations

from .gluon_sm90_parts import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from .gluon_sm90_parts import cta_barrier

    @gluon.jit
    def _arrive_and_wait(cnt_ptr, splits):
        """This program's partial is written: count it in (release), then wait (acquire) for the group's others. The
        group's last arrival, which the others wait for, learns it from its own count and goes straight on."""
        cta_barrier()  # every warp's stores are issued before the count says they are
        before = gl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
        if before < splits - 1:
            seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
            while seen < splits:
                seen = gl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")

    @gluon.jit
    def _depart(cnt_ptr, splits):
        """Done with the partials: the group's last departure (its 2 x splits-th count) zeroes the counter."""
        if gl.atomic_add(cnt_ptr, 1, sem="relaxed", scope="gpu") == 2 * splits - 1:
            gl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")

    @gluon.jit
    def _reduce_slice(o_ptr, lse_ptr, sink_ptr, out_ptr, row, split, splits, h0, H, o_ld, has_sink, sink_s0,
                      o_s0, o_s1, o_s2, S_BLOCK: gl.constexpr, V_BLOCK: gl.constexpr, TPW_S: gl.constexpr):
        """Program ``split``'s share of its group's output: values [split x per, (split + 1) x per) of the 16 heads
        x ``o_ld`` plane (head-major), each the log-sum-exp-weighted mean of its ``splits`` partials with the
        sink's mass in the total, as ``triton_decode._reduce_kernel`` computes it.

        One program a multiprocessor has four warps to hide the loads' latency with, so the share is loaded at
        once: a tile of every split x V_BLOCK vectors of 8 values (8,192 values), each vector a 16-byte load that
        lies in one head (``o_ld``, the lanes, and ``per`` are multiples of 8), its head's log-sum-exp loaded once
        a vector. The splits lie in each thread's registers and across TPW_S lanes of a warp, so the sums over
        them need no shared memory. Every head block is whole (H a multiple of 16)."""
        lay: gl.constexpr = gl.BlockedLayout([S_BLOCK // TPW_S, 1, 8], [TPW_S, 32 // TPW_S, 1], [1, 4, 1], [2, 1, 0])
        sv: gl.constexpr = gl.SliceLayout(2, lay)  # [splits, vectors]
        out_l: gl.constexpr = gl.SliceLayout(0, lay)  # [vectors, 8]: the reduced values
        offs_s = gl.arange(0, S_BLOCK, gl.SliceLayout(1, sv))
        offs_v = gl.arange(0, V_BLOCK, gl.SliceLayout(0, sv))
        offs_e = gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(1, lay)))
        out_v = gl.arange(0, V_BLOCK, gl.SliceLayout(1, out_l))
        out_e = gl.arange(0, 8, gl.SliceLayout(0, out_l))
        smask = offs_s < splits
        part0 = (row.to(gl.int64) * splits + offs_s) * H + h0  # each split's partial row of head h0
        plane = 16 * o_ld
        per = gl.cdiv(gl.cdiv(plane, splits), 8) * 8
        f_lo = split * per
        f_hi = gl.minimum(f_lo + per, plane)
        out_row = out_ptr + row.to(gl.int64) * o_s0
        for f0 in range(f_lo, f_hi, V_BLOCK * 8):
            fv = gl.multiple_of(f0 + offs_v * 8, 8)  # each vector's first value in the plane
            h = fv // o_ld  # its head
            vmask = fv < f_hi
            mask = smask[:, None] & vmask[None, :]
            lse = gl.load(lse_ptr + (part0[:, None] + h[None, :]), mask=mask, other=float("-inf"),
                          cache_modifier=".cg")
            # value f of the plane is lane f - h x o_ld of head h, so its partial sits f past head 0's row
            o = gl.load(o_ptr + (part0[:, None] * o_ld + fv[None, :])[:, :, None] + offs_e[None, None, :],
                        mask=mask[:, :, None], other=0.0, cache_modifier=".cg")
            # Absent, the sink loads as -inf: it moves neither the max nor the total.
            sink = gl.load(sink_ptr + (h0 + h) * sink_s0, mask=vmask & (has_sink != 0), other=float("-inf"))
            sink = sink.to(gl.float32) * 1.4426950408889634
            big = gl.maximum(gl.max(lse, axis=0), sink)
            big_safe = gl.where(big == float("-inf"), 0.0, big)
            w = gl.exp2(lse - big_safe[None, :])
            total = gl.sum(w, axis=0) + gl.exp2(sink - big_safe)
            inv = gl.where(total > 0.0, 1.0 / gl.where(total > 0.0, total, 1.0), 0.0)
            res = gl.sum(o.to(gl.float32) * (w * inv[None, :])[:, :, None], axis=0)  # [vectors, 8]
            fo = f0 + out_v * 8  # the same vectors, in the result's layout
            ho = fo // o_ld
            dst = out_row + ((h0 + ho) * o_s1 + (fo - ho * o_ld) * o_s2)[:, None] + out_e[None, :] * o_s2
            gl.store(dst, res.to(out_ptr.dtype.element_ty), mask=(fo < f_hi)[:, None])
