"""Sparse MLA attention for Hopper, warp-specialised and persistent: a loader, two scores+softmax warpgroups, P·V.

Computes the contract of docs/kernels.md: the prefill on Hopper (its default, ``gluon_sm90.launch_prefill``) and the
split-K decode's partials with ``launch_decode(ws=True)`` where ``gluon_sm90.ws_module`` picks this module.

How. ``gluon_sm90``'s one warpgroup runs gathers, scores, softmax and P·V in one instruction stream, so the tensor
cores idle under the softmax. Here four partitions hand tiles over through mbarriers, FlashAttention-3 style (their
code is in ``gluon_sm90_ws_parts``):

- the loader (4 warps) gathers tile t's 512 lanes into stage t % 3 by cp.async once P·V of tile t - 3 has released
  it, each 256-lane half as soon as that half is free (``STAGE_HALVES``), then its 64 rope lanes into buffer t % 2
  once P·V has read what that buffer held;
- two scores+softmax warpgroups take alternate tiles of an item, tile t going to warpgroup t % 2 with rope buffer
  t % 2: each computes Sᵀ = KV · qᵀ by wgmma and the online softmax, then writes the tile's P and rescale factors
  (and, at its last tile of the item, its totals) over the rope lanes its scores are done with. One's exponentials
  and hand-over run while the other's scores are on the tensor cores. Only the running max passes between them
  (m_smem), so P·V sees one max sequence; each keeps its own sum, in registers;
- P·V (4 warps, the default partition) keeps Oᵀ in registers as two 256-lane halves, rescales and accumulates,
  releases each half of a stage as soon as its product is done, then the buffer, and writes the item with both
  warpgroups' totals merged: the attention output (the prefill), or a normalised partial and its log-sum-exp (the
  decode's partials, which ``triton_decode``'s reduce combines).

Shared memory: three 64 KB stages, two 8 KB buffers that hold first a tile's rope lanes and then its P, and q:
232,232 of 232,448 bytes (three 73.7 KB stages of all 576 lanes do not fit). One program per multiprocessor takes
work items (query row, split, head block) pid, pid + grid, ...: the loader runs on into the next item's tiles while
the others finish the current one.

The reference max and the redo. What bounds this kernel is the softmax's chain: each shared-memory step on it (the
tile max across the warps, the hand-overs) takes 2.7 times as long beside wgmma's operand reads. So where the call
is wide and big enough to repay a fixed cost (``reference_pays``), the prefill keeps each item's first finite max
as P's reference (``_softmax_tile_redo``): no tile max between an item's scores and its P after that, and the items
whose sums of P outgrow P's dtype are flagged and computed again, exactly: by this kernel's own programs after
their partitions join where the items make one pass of the grid (``redo_in_kernel``, ``gluon_sm90_redo``), else by
Triton's redo kernel, launched after this one (``redo_flagged``). Elsewhere, and always for the decode's partials,
the exact running max. The two are separate specialisations, chosen by the flags' dtype (``launch_kernel``).

An fp8 pool (e4m3fn, e5m2) keeps all of that: each tile's bytes land in the upper half of the q-dtype stage half
(and rope buffer) they become, and the softmax warpgroup whose tile it is converts them there, in place, before its
scores (``gluon_sm90_ws_fp8``).

Limits: those of ``gluon_sm90.supports_prefill`` (sm_90; q fp16/bf16; 512+64, 448+64, 512+0; a pool in q's dtype
or fp8); the decode's partials with rope lanes (512+64) only, ``gluon_sm90_ws_d512`` taking them at D = 512.
Figures: docs/kernels.md, "Prefill kernel design figures" (what bounds the kernel, the partitions, halves, the
default partition, the reference max and where it pays); what an fp8 pool costs: docs/benchmarks.md, "fp8 kv
pools".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .common import KernelArgs, device_key, empty_call, sm_count
from .launcher import Step, current_stream
from .launcher import launch as run
from .plan import clock_for, index_operands, launch_key, planned, stamp_operands
from .scratch import scratch
from .stamps import no_stamp
from .gluon_sm90_parts import HAVE_GLUON
from .triton_prefill import HEAD_BLOCK, LOG2E, pack

if HAVE_GLUON:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

    from .triton_stamps import stamp_end
    from .gluon_sm90_parts import _barriers
    from .gluon_sm90_ws_fp8 import _as_blocks
    from .gluon_sm90_redo import _redo_own
    from .gluon_sm90_ws_parts import _load_part, _pv_part, _softmax_part, _ws_begin, ws_kernel

    @ws_kernel
    def _ws_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, part_o_ptr, part_lse_ptr,
                   skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                   q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2, n_items, n_hb, splits,
                   partial, redo_ptr, stamp_ptr, count_ptr, stamp_first, stamp_last,
                   DB: gl.constexpr, PDL: gl.constexpr, WREGS: gl.constexpr, HALVES: gl.constexpr = False,
                   CLOCK: gl.constexpr = 0, REDO_HERE: gl.constexpr = False, REDO_KV8: gl.constexpr = 0):
        """Persistent: each program takes items (row, split, head block) pid, pid + grid, ...; the gathers run on."""
        _ws_begin(stamp_ptr, stamp_first, CLOCK, PDL)
        dt: gl.constexpr = q_ptr.dtype.element_ty
        FP8: gl.constexpr = kv_ptr.dtype.element_ty != dt  # an fp8 pool: converted in the stages (_expand_half)
        gl.static_assert(HALVES or not FP8, "an fp8 pool takes stages handed over in halves")
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
        # Stage s gathered (one cp.async arrival per loader thread); P·V is done with stage s. With HALVES a
        # pair per stage, 2 s + h for its lanes [256 h, 256 h + 256): the partitions read the count.
        kv_ready, kv_empty = _barriers(6 if HALVES else 3, (128, 1))
        # Warpgroup j's P, alpha (and totals) in buffer j; P·V is done with buffer j; warpgroup j's running max
        # in m_smem j; a tile's rope lanes in buffer j (one cp.async arrival per loader thread).
        p_ready, buf_empty, m_ready, rope_ready = _barriers(2, (1, 1, 1, 128))
        # The item's q in shared memory (one cp.async arrival per thread of softmax warpgroup 0); both softmax
        # warpgroups are done with it.
        q_ready, q_free = _barriers(1, (128, 2))
        bars = (kv_ready, kv_empty, p_ready, buf_empty, m_ready, rope_ready, q_ready, q_free)
        fence_async_shared()
        sargs = (qa_smem, qb_smem, kv_a, rp, kv8, rp8, kv_ptr, m_smem, bars, q_ptr, q_s0, q_s1, H,
                 idx_ptr, idx_s0, idx_s1, width, indptr_ptr, skv, sm_scale2, len_ptr, len_s0, ragged, has_len,
                 n_items, n_hb, splits, redo_ptr)
        wargs = (kv_a, rp, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width,
                 indptr_ptr, ragged, skv, sink_ptr, sink_s0, has_sink, out_ptr, part_o_ptr, part_lse_ptr, H, lanes,
                 o_s0, o_s1, o_s2, n_items, n_hb, splits, partial)
        zero = gl.program_id(0) * 0  # partition arguments must be values, not Python ints
        largs = (kv_a, rp, kv8, rp8, bars, kv_ptr, kv_s0, idx_ptr, idx_s0, idx_s1, width, indptr_ptr, ragged, skv,
                 n_items, n_hb, splits)
        # P·V is the default partition, the softmax warpgroups and the loader workers: 1.9% faster at 512+64 than
        # with softmax warpgroup 0 as the default, 3.0% at 512+0 (docs/kernels.md, "Prefill kernel design
        # figures"; bit-identical answers).
        gl.warp_specialize([
            (_pv_part, wargs),
            (_softmax_part, sargs + (zero,)),
            (_softmax_part, sargs + (zero + 1,)),
            (_load_part, largs),
        ], [4, 4, 4], WREGS)  # the workers' registers (WORKER_REGS); P·V gets the rest
        if REDO_HERE:  # the flagged items computed again here, by the default partition (gluon_sm90_redo)
            _redo_own(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, skv, width, H, sm_scale2,
                      ragged, has_len, has_sink, lanes, q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0,
                      o_s0, o_s1, o_s2, n_items, n_hb, redo_ptr, DB, REDO_KV8)
        stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK)  # the call's end, when no redo kernel follows


# Registers per thread of the two softmax warpgroups and the loader (setmaxnreg); P·V, the default partition, gets
# what is left of 4 x 128 per warp slot, 136. The loader needs few; the softmax warpgroups hold Sᵀ and the sums.
WORKER_REGS = (160, 160, 56)

# Where the reference max repays its fixed cost: (the narrowest mean row width, the fewest index positions a call,
# items x width, from which it is kept), widest first. The reference costs a fixed few µs a call (the redo launch
# and the gap before it) and saves a share of each item's tiles: most of a wide item's (top-k 2048), none of a
# 2-tile one (top-k 128). The boundary is where it measured faster, by kernel time at 40 points a layout;
# the figures, and the commit they were measured at: docs/kernels.md, "Prefill kernel design figures".
REFERENCE_FROM = ((2048, 0), (512, 1 << 19), (256, 1 << 22))

# The prefill's flagged items computed again by the kernel's own programs after its partitions join
# (``gluon_sm90_redo``), instead of by Triton's redo kernel in a second launch, where the items make one pass of the
# grid (``redo_in_kernel``). It compiles within the same shared memory, but ptxas then spills 24 bytes into the
# partitions' loops (Triton 3.6, 512+64): at 2-132 rows the one launch is 0.7-1.5 µs faster on the GPU and 7-9 µs
# cheaper on the host, at 1,024 rows 1.1% slower, at 16,384 1.9% (docs/benchmarks.md, "Host cost of a call").
REDO_IN_KERNEL = True

# Each stage handed over in two 256-lane halves (a barrier pair per stage): P·V frees the first half
# before its second product, the loader refills it, and the scores start on it before the second lands.
# 16,384 rows at 512+64: 5,380-5,425 µs against 5,445-5,492 with whole stages (docs/kernels.md, "Prefill kernel
# design figures"; bit-identical answers).
STAGE_HALVES = True


class WsPlan(NamedTuple):
    """What a warp-specialised launch of one call signature works out on the host (``plan.planned``)."""

    device: int
    clock: int
    grid: tuple[int]
    scalars: tuple  # skv, width, H
    flags: tuple  # ragged ... partial: everything after the scale
    consts: dict
    items: int
    key: tuple


def _plan(args: KernelArgs, splits: int, partial_dtype: torch.dtype | None, pdl: bool, redo: bool,
          consts: dict) -> WsPlan:
    q, kv, out = args.q, args.kv, args.output
    rows, heads, _ = q.shape
    p = pack(args)
    n_hb = (heads + HEAD_BLOCK - 1) // HEAD_BLOCK
    items = rows * splits * n_hb
    clock = clock_for(q.device)
    device = device_key(q.device) if q.is_cuda else -1
    scalars = (p.skv, p.width, heads)
    flags = (p.ragged, p.has_len, p.has_sink, p.lanes, q.stride(0), q.stride(1), kv.stride(0), p.idx_s0, p.idx_s1,
             p.len_s0, p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2), items,
             n_hb, splits, int(partial_dtype is not None))
    consts = dict(DB=int(q.shape[2]) - 512, PDL=pdl, num_warps=4, maxnreg=128, CLOCK=max(clock, 0), **consts)
    # the partials (fp32 and unread for the prefill) and the flags (int32 with a reference max, else one int8):
    # scratch, 16-byte aligned, so their dtypes are all the key needs
    scratch_types = (partial_dtype or torch.float32, torch.float32, torch.int32 if redo else torch.int8)
    key = (launch_key(device, (q, kv, p.idx, p.length, p.indptr, p.sink, out), scalars + flags, consts),
           scratch_types)
    return WsPlan(device, clock, (min(items, sm_count(q.device)),), scalars, flags, consts, items, key)


def launch_kernel(kernel, args: KernelArgs, splits: int, part_o: torch.Tensor | None,
                  part_lse: torch.Tensor | None, pdl: bool, *, redo: bool = False, **consts) -> None:
    """Launch a warp-specialised kernel of this signature (this module's or ``gluon_sm90_ws_d512``'s).

    One program per multiprocessor over the work items (row, split, head block); with no
    ``part_o`` it is the prefill, writing the output, else the decode's partial pass.

    ``redo`` (this module's prefill): the softmax keeps each item's first finite max as P's reference
    (``_softmax_tile_redo``), flags any item whose sums of P under it outgrow P's dtype (``_flag_redo``), and
    ``redo_flagged`` computes those items again. The flags' dtype tells the kernel which: int32 flags, zeroed,
    with a reference; an unread int8 one without (the exact running max). Each is its own specialisation, so
    neither carries the other's code (docs/kernels.md, "Prefill kernel design figures"). The flags live in the
    stream's scratch, zeroed once; the redo kernel zeroes what it read. A stamped prefill (``args.stamp``) has
    its start written here and its end here or, with ``redo``, by the redo kernel; the decode's partials are not
    stamped on this path.
    """
    if empty_call(args):
        return
    partial = part_o is not None
    if redo and partial:
        raise ValueError("redo is the prefill's: the decode's partials keep the exact running max")
    options = (splits, part_o.dtype if partial else None, pdl, redo, tuple(sorted(consts.items())))
    plan = planned(args, "gluon_ws", options, lambda: _plan(args, *options[:4], consts))
    q = args.q
    device = q.device
    stream = current_stream(plan.device)
    pad = scratch()
    if not partial:  # the prefill writes no partials: any float32 tensor serves as the unread pointers
        part_o = part_lse = pad.get("ws_unread", 1, torch.float32, device, stream, zeroed=False)
    # the items to compute again; without redo the kernel never reads them
    flags = (pad.get("redo_flags", plan.items, torch.int32, device, stream, zeroed=True) if redo
             else pad.get("no_redo", 1, torch.int8, device, stream, zeroed=False))
    if partial:
        times, counts = no_stamp(device)
        first = last = -1
    else:
        times, counts, first = stamp_operands(args, device, plan.clock)
        last = -1 if redo else first
    run(kernel, plan.key, plan.grid, (q, args.kv, *index_operands(args), args.output, part_o, part_lse) + plan.scalars
        + (float(args.scale) * LOG2E,) + plan.flags + (flags, times, counts, first, last), plan.consts, stream)
    if redo:
        redo_flagged(args, flags)


def prefill_recipe(args: KernelArgs) -> Callable[[KernelArgs], str]:
    """The default prefill of calls of ``args``'s signature, worked out once (``plan.planned`` keeps it): a function
    of a call's operands launching this kernel with the reference max where it pays (``prefill_reference``) and
    then the redo kernel, or the kernel alone computing its flagged items again itself (``redo_in_kernel``), or
    the exact max alone; flags from the stream's scratch; a stamped call's start from this kernel, its end from
    the last kernel."""
    from . import triton_decode, triton_prefill

    redo = prefill_reference(args)
    consts = {"WREGS": WORKER_REGS, "HALVES": _halves(args, None)}
    here = redo and redo_in_kernel(args)
    if here:
        from .fp8_ptx import kv_operand

        consts.update(REDO_HERE=True, REDO_KV8=kv_operand(args.kv, args.q.dtype)[1])
    plan = _plan(args, 1, None, False, redo, consts)
    step = Step(_ws_kernel, plan.key, plan.grid, plan.consts)
    redo_run = triton_prefill.redo_recipe(args) if redo and not here else None
    scalars, flags, items, device, clock, where = (plan.scalars, plan.flags, plan.items, plan.device, plan.clock,
                                                   args.q.device)
    pad = scratch()

    def fetch(stream: int) -> tuple:
        unread = pad.get("ws_unread", 1, torch.float32, where, stream, zeroed=False)
        if not redo:
            return unread, pad.get("no_redo", 1, torch.int8, where, stream, zeroed=False)
        return unread, pad.get("redo_flags", items, torch.int32, where, stream, zeroed=True)

    buffers = triton_decode.PerStream(fetch)

    def run(a: KernelArgs) -> str:
        stream = current_stream(device)
        unread, marks = buffers(stream)
        stamps = stamp_operands(a, where, clock)
        last = stamps[2] if redo_run is None else -1
        step((a.q, a.kv, *index_operands(a), a.output, unread, unread) + scalars + (float(a.scale) * LOG2E,) + flags
             + (marks, stamps[0], stamps[1], stamps[2], last), stream)
        if redo_run is not None:
            redo_run(a, marks, stamps, stream)
        return "gluon"

    return run


def redo_in_kernel(args: KernelArgs) -> bool:
    """Whether the prefill computes its flagged items again in its own kernel (``REDO_IN_KERNEL``): where its items
    (rows x head blocks) are at most one a multiprocessor, one pass of the persistent grid. Past that, the
    spills the redo brings cost more kernel time than the second launch."""
    rows, heads = int(args.q.shape[0]), int(args.q.shape[1])
    return REDO_IN_KERNEL and rows * ((heads + HEAD_BLOCK - 1) // HEAD_BLOCK) <= sm_count(args.q.device)


def redo_flagged(args: KernelArgs, flags: torch.Tensor) -> None:
    """Compute again, exactly, the prefill's items (row, head block) flagged in ``flags``: Triton's redo kernel, whose
    programs each scan a span of flags and compute only the flagged items (``triton_prefill.launch(redo=)``).
    Stream-ordered, no synchronisation."""
    from . import triton_prefill

    triton_prefill.launch(args, redo=flags)


def _halves(args: KernelArgs, halves: bool | None) -> bool:
    """Stages in halves (``STAGE_HALVES`` unless asked); an fp8 pool lands and is converted by halves only."""
    halves = STAGE_HALVES if halves is None else bool(halves)
    if not halves and args.kv.dtype != args.q.dtype:
        raise ValueError(f"an fp8 pool ({args.kv.dtype}) takes stages handed over in halves (halves=True)")
    return halves


def reference_pays(items: int, width: float) -> bool:
    """Whether the prefill's reference max (flags, the redo launch) is faster than the exact running max for a call
    of ``items`` (rows x head blocks) whose rows hold ``width`` index positions on average (``REFERENCE_FROM``):
    rows of 2,048 positions at any row count, of 512-1,024 from 2^19 positions a call, of 256 from 2^22, of 128
    never. The boundary was measured on 16-bit pools; an fp8 pool, slower per tile, is given the same one.
    """
    work = items * width
    return any(width >= w and work >= least for w, least in REFERENCE_FROM)


def prefill_reference(args: KernelArgs) -> bool:
    """``reference_pays`` for this call, from its shapes alone (no synchronisation): items are rows x head blocks,
    the width is the dense index's or, for a ragged index, its positions per row on average (``topk_length``,
    on the GPU, is not read)."""
    rows, heads = int(args.q.shape[0]), int(args.q.shape[1])
    index = args.index
    if index.ragged:
        width = index.ragged_indices.numel() / max(rows, 1)
    else:
        width = int(index.indices.shape[1])
    return reference_pays(rows * ((heads + HEAD_BLOCK - 1) // HEAD_BLOCK), width)


def launch_prefill_ws(args: KernelArgs, *, halves: bool | None = None, redo: bool | None = None) -> None:
    """The no-split prefill; call only where ``gluon_sm90.supports_prefill``. One program per multiprocessor.

    The pool is in q's dtype or, at any layout, e4m3fn or e5m2 (converted in shared memory as it lands).
    ``redo``: keep a reference max (flags, the redo launch) or the exact running max (neither); by default where
    it pays (``prefill_reference``). Two specialisations of one kernel (``launch_kernel``)."""
    redo = prefill_reference(args) if redo is None else bool(redo)
    launch_kernel(_ws_kernel, args, 1, None, None, False, redo=redo, WREGS=WORKER_REGS,
                  HALVES=_halves(args, halves))


def launch_partials_ws(args: KernelArgs, part_o: torch.Tensor, part_lse: torch.Tensor, splits: int, *,
                       pdl: bool) -> None:
    """The split-K decode's partial pass, into the layout ``triton_decode``'s reduce reads."""
    launch_kernel(_ws_kernel, args, splits, part_o, part_lse, pdl, WREGS=WORKER_REGS, HALVES=_halves(args, None))
