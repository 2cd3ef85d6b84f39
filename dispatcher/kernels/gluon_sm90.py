"""Sparse MLA attention for Hopper (sm_90) in Gluon, one warpgroup a program: wgmma with the kv slots as M.

Computes the contract of docs/kernels.md, as ``triton_prefill`` does: scores over each row's valid slots, online
softmax in fp32 (base 2), the sink as mass with no value, rows without a valid slot written as 0.

How. The Triton kernels put the 16 heads of a head block on the MMA's M and run ``mma.sync``: every kv tile is
written to shared memory once, read twice through ``ldmatrix``, and each of the 4 warps re-reads q, about 300 KB
of shared-memory traffic per 64-slot tile. Here one warpgroup turns the products around so that Hopper's
``wgmma`` takes both operands straight from shared memory, the tile and q each read once per product:

    Sᵀ [64 slots × 16 heads]  = KV [64 × D] · qᵀ [D × 16]        (A: the kv tile, B: q, resident)
    Oᵀ [512 lanes × 16 heads] += Vᵀ [512 × 64] · Pᵀ [64 × 16]    (A: the same tile, transposed view)

Each tile is gathered by ``cp.async`` (16-byte copies, invalid slots zero-filled) into 128-byte-swizzled buffers,
``stages`` deep, so the next tiles' gathers run under this tile's products. The softmax runs along Sᵀ's columns;
its state (the running max, per-thread partial sums, Oᵀ) lives in the warpgroup's registers. The loops are in
``gluon_sm90_attend``, the blocks every Hopper kernel shares in ``gluon_sm90_parts``.

- ``_partial_kernel``: the split-K decode's partials (``launch_decode``), kept in q's dtype for ``triton_decode``'s
  reduce. At D = 512 (512+0, 448+64), where three stages fit, tile t - 1's P·V runs on the tensor cores under
  tile t's softmax (``_attend_pipe``); at 512+64 two stages; an fp8 pool (e4m3fn, e5m2) lands in the stages as
  bytes, and each landed tile is converted by ``fp8_ptx``'s PTX into one q-dtype tile the products read.
- ``_split_decode_kernel``: the same partials, then the reduce in the same programs, one cooperative launch
  (``gluon_sm90_reduce``): an eager decode whose grid is resident at once (``split_reduce_fits``,
  ``eager_or_captured``).
- ``_prefill_kernel``: a whole row a program. It is the decode where its split count is 1 (from about one row a
  multiprocessor: ``whole_row_recipe``, one launch, no partials, no reduce), with the decode's config and pools; as
  the prefill it runs only with an explicit ``config``. The prefill's default is warp-specialised and persistent
  (``gluon_sm90_ws``, picked by ``ws_module``), which overlaps the softmax with the tensor cores where one
  warpgroup cannot.

Limits: an NVIDIA sm_90 GPU (H100, H200, H20, GH200); q fp16 or bf16; kv in q's dtype, or e4m3fn/e5m2 for the
decode and the default prefill; D = 512 + 0 or 64 rope lanes (512+64, 448+64, 512+0); output lanes <= 512; rows
16-byte aligned. ``supports``, ``supports_decode`` and ``supports_prefill`` say so, and the registry hands every
other call to Triton. Gluon (``triton.experimental.gluon``) ships with Triton; the registry imports this module
only for CUDA devices, and ``HAVE_GLUON`` is False where Gluon is missing.

Why: docs/kernels.md, "Decode kernel design figures" (these partials against Triton's and the
warp-specialised ones at 2-16 rows, the pipelined kernel at D = 512, 16-bit partials) and "Prefill kernel design
figures" (against Triton's prefill and the warp-specialised one); what an fp8 pool costs: docs/benchmarks.md,
"fp8 kv pools".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from .common import KernelArgs, device_capability, device_key, empty_call
from .fp8_ptx import ASM_MODES, TO, kv_operand
from .gluon_sm90_parts import HAVE_GLUON
from .launcher import Step, current_stream
from .plan import clock_for, index_operands, launch_key, planned, stamp_operands
from .scratch import scratch
from .stamps import no_stamp
from .triton_prefill import HEAD_BLOCK, LOG2E, count_block, pack

if TYPE_CHECKING:
    from . import triton_decode

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from .triton_stamps import STAMP_ARGS, stamp_end, stamp_start
    from .gluon_sm90_attend import _attend, _attend_pipe
    from .gluon_sm90_parts import _launch_dependents, _partial_scale, _store_partial, _store_t
    from .gluon_sm90_reduce import _arrive_and_wait, _depart, _reduce_slice
    from .triton_prefill import finish_scale, row_bounds

BLOCK_N = 64  # kv slots per tile: wgmma's M for one warpgroup
LANES_A = 512  # the power-of-two head block every production layout has (V is its first ``lanes`` lanes)
ROPE_LANES = (0, 64)  # the remainder blocks it takes: none (512+0) or the rope lanes (512+64, 448+64)
DTYPES = (torch.float16, torch.bfloat16)
_FLAGS = ["ragged", "has_len", "has_sink", "lanes", "splits", "width"]


class Sm90Config(NamedTuple):
    """Resident kv tiles (``stages`` - 1 gathers in flight under the products), rope buffering, score chains."""

    stages: int = 2
    rope1: bool = False  # one rope-lane buffer instead of one per stage: 3 stages fit at 512+64
    chains: int = 1  # independent accumulators for the scores: 1, or 2 (two 256-lane halves)
    pipe: bool = False  # tile t - 1's P·V under tile t's softmax (_attend_pipe): 3 stages, D = 512 only


# The one-warpgroup prefill's fastest config on an H200 (docs/kernels.md, "Prefill kernel design figures").
PREFILL_SM90 = Sm90Config(2, chains=2)
# The prefill's default is warp-specialised (gluon_sm90_ws, ws_module): faster than this module's kernel on an H200
# (docs/kernels.md, "Prefill kernel design figures").
PREFILL_WARP_SPECIALISED = True
DECODE_SM90 = Sm90Config(2)  # the partial kernel at D = 576 (512+64): two 73.7 KB stages fit, three do not
# At D = 512 (512+0, and 448+64, whose rope lanes sit in the 512-lane block) three stages fit, and tile t - 1's P·V
# runs under tile t's softmax: kernel time at 16 rows 13.95-14.05 µs against 14.10-14.24 with two stages, at 2
# rows 8.22-8.29 against 8.38-8.45 (docs/kernels.md, "Decode kernel design figures").
DECODE_SM90_D512 = Sm90Config(3, pipe=True)
# An fp8 pool: its stages hold bytes (36 KB a 576-lane tile), so three fit; each landed tile is converted into one
# q-dtype tile the products read.
DECODE_SM90_FP8 = Sm90Config(3)
# The decode's partials from this module's kernel: the warp-specialised ones (ws=True) are slower at 2-16 rows
# (docs/kernels.md, "Decode kernel design figures").
DECODE_WARP_SPECIALISED = False
DECODE_PER_SM = {2: 1, 3: 1}  # programs per multiprocessor that fit in shared memory (168, 225 KB each)
# The decode's partials in q's dtype (fp16/bf16), as FlashInfer keeps its split-KV states: the reduce reads half
# the bytes. Kernel time 15.0-15.1 µs at 16 rows against 15.4-15.5 in fp32, 8.8-8.9 at 2 against 9.1-9.5
# (docs/kernels.md, "Decode kernel design figures"); relative error 2.2e-3 against 1.9e-3 (each partial is a
# convex mix of v, so it stays in v's range).
DECODE_PARTIALS_16BIT = True
# An eager split-K decode as one cooperative launch (``_split_decode_kernel``: the partials, then the reduce in the
# same programs) where its grid is resident at once (``split_reduce_fits``); else, and in a CUDA graph capture, the
# partials and Triton's reduce, two launches (``eager_or_captured``). One launch saves 3.6-12.3 µs of host time a call
# on an H200's host (docs/kernels.md, "Decode kernel design figures").
SPLIT_REDUCE = True
REDUCE_SLICE_VALUES = 8192  # partial values a program's reduce loads at once (its splits x a run of the plane)


def decode_config(args: KernelArgs) -> Sm90Config:
    """The partial kernel's default for a call's layout: pipelined at D = 512, two stages at D = 576; for an fp8
    pool ``DECODE_SM90_FP8``."""
    if args.kv.dtype != args.q.dtype:
        return DECODE_SM90_FP8
    return DECODE_SM90_D512 if int(args.q.shape[2]) == LANES_A else DECODE_SM90


def supports(args: KernelArgs, *, fp8: bool = False) -> bool:
    """True for the calls this kernel takes: a CUDA sm_90 device, fp16/bf16, D of 512 or 576, lanes <= 512.

    The pool is in q's dtype, or with ``fp8`` (the split-K decode: ``supports_decode``) an fp8 format
    ``fp8_ptx`` converts beside q's.
    """
    q, kv, out = args.q, args.kv, args.output
    if not HAVE_GLUON:
        return False
    same = kv.dtype == q.dtype or (fp8 and (kv.dtype, q.dtype) in ASM_MODES)
    if q.dtype not in DTYPES or not same or q.shape[2] - LANES_A not in ROPE_LANES:
        return False
    if kv.shape[1] != 1 or kv.stride(2) != 1 or q.stride(2) != 1 or out.shape[2] > LANES_A:
        return False
    # The gather copies 16-byte vectors, which Triton emits only when it knows each kv row starts
    # 16-byte aligned: a base pointer and row stride that are multiples of 16 (it specialises on both).
    if kv.stride(0) % 16 or kv.data_ptr() % 16:
        return False
    if q.stride(0) % 16 or q.stride(1) % 16 or q.data_ptr() % 16:  # q is copied the same way
        return False
    return _on_hopper(q)  # last: it asks the driver


def supports_decode(args: KernelArgs) -> bool:
    """``supports`` for the split-K decode, whose partial kernels also read fp8 pools."""
    return supports(args, fp8=True)


def supports_prefill(args: KernelArgs) -> bool:
    """``supports`` for the default (warp-specialised) prefill, which also reads fp8 pools."""
    return supports(args, fp8=PREFILL_WARP_SPECIALISED)


def _on_hopper(t: torch.Tensor) -> bool:
    """An NVIDIA GPU of compute capability 9.0 (H100, H200, H20, GH200): the wgmma these kernels need (cached)."""
    return t.device.type == "cuda" and torch.version.hip is None and device_capability(t.device) == (9, 0)


if HAVE_GLUON:

    @gluon.jit(do_not_specialize=_FLAGS + STAMP_ARGS)
    def _prefill_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr,
                        skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes,
                        q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2,
                        stamp_ptr, count_ptr, stamp_first, stamp_last,
                        DB: gl.constexpr, STAGES: gl.constexpr, ROPE1: gl.constexpr,
                        CHAINS: gl.constexpr, CNT_BLOCK: gl.constexpr, PIPE: gl.constexpr = False,
                        KV8: gl.constexpr = 0, CLOCK: gl.constexpr = 0):
        """A whole row per program (no split): the one-warpgroup prefill, and the decode where its split count is 1
        (``whole_row_recipe``), which then needs no partials and no reduce."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        stamp_start(stamp_ptr, stamp_first, CLOCK)
        row = gl.program_id(0)
        h0 = gl.program_id(1) * 16
        base, seg = row_bounds(idx_ptr, idx_s0, idx_s1, width, None, None, indptr_ptr, row, ragged, None, None,
                               LENGTH=False)  # the row's positions, not its length
        seg = seg.to(gl.int32)
        if PIPE:
            m, l, o = _attend_pipe(q_ptr, kv_ptr, idx_ptr, row, h0, 0, seg, seg, base, idx_s1, skv, H, sm_scale2,
                                   q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK, DB)
        else:
            m, l, o = _attend(q_ptr, kv_ptr, idx_ptr, row, h0, 0, seg, seg, base, idx_s1, skv, H, sm_scale2,
                              q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK,
                              DB, STAGES, ROPE1, CHAINS, KV8)
        offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(0, mma))
        hmask = offs_h < H
        scale = finish_scale(m, l, sink_ptr, offs_h, hmask, sink_s0, has_sink)
        _store_t(out_ptr, row.to(gl.int64) * o_s0, offs_h, o_s1, o_s2, lanes, hmask, o, scale)
        stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK)

    @gluon.jit
    def _split_partial(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, o_ptr, lse_ptr, skv, width, H, sm_scale2,
                       ragged, has_len, splits, q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, o_ld, row, split, h0,
                       DB: gl.constexpr, STAGES: gl.constexpr, ROPE1: gl.constexpr, CHAINS: gl.constexpr,
                       CNT_BLOCK: gl.constexpr, PIPE: gl.constexpr, KV8: gl.constexpr):
        """Split ``split`` of a row's positions for heads [h0, h0 + 16): its normalised partial Oᵀ and log-sum-exp
        into the partials' rows (row x splits + split) x H + head."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
        base, seg = row_bounds(idx_ptr, idx_s0, idx_s1, width, None, None, indptr_ptr, row, ragged, None, None,
                               LENGTH=False)  # the row's positions, not its length
        seg = seg.to(gl.int32)
        chunk = gl.cdiv(gl.cdiv(seg, splits), 64) * 64  # split by the row's width: no count before the gathers
        lo = split * chunk
        hi = gl.minimum(lo + chunk, seg)
        if PIPE:
            m, l, o = _attend_pipe(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, seg, base, idx_s1, skv, H, sm_scale2,
                                   q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK, DB)
        else:
            m, l, o = _attend(q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, seg, base, idx_s1, skv, H, sm_scale2,
                              q_s0, q_s1, kv_s0, len_ptr, len_s0, ragged, has_len, CNT_BLOCK,
                              DB, STAGES, ROPE1, CHAINS, KV8)
        offs_h = h0 + gl.arange(0, 16, gl.SliceLayout(0, mma))
        hmask = offs_h < H
        inv, lse = _partial_scale(m, l)
        part0 = (row.to(gl.int64) * splits + split) * H  # the partial-row id of head 0
        gl.store(lse_ptr + part0 + offs_h, lse, mask=hmask)
        _store_partial(o_ptr, part0, h0, H, o_ld, o, inv)

    @gluon.jit(do_not_specialize=_FLAGS + STAMP_ARGS)
    def _partial_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, o_ptr, lse_ptr,
                        skv, width, H, sm_scale2, ragged, has_len, lanes, splits,
                        q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, o_ld, stamp_ptr, count_ptr, stamp_first, stamp_last,
                        DB: gl.constexpr, STAGES: gl.constexpr, ROPE1: gl.constexpr,
                        CHAINS: gl.constexpr, CNT_BLOCK: gl.constexpr, PDL: gl.constexpr,
                        PIPE: gl.constexpr = False, KV8: gl.constexpr = 0, CLOCK: gl.constexpr = 0):
        """The split-K decode's partials, a program a (row, split, head block), for ``triton_decode``'s reduce."""
        stamp_start(stamp_ptr, stamp_first, CLOCK)
        if PDL:  # the reduce may be scheduled now; it waits for this grid in gdc_wait
            _launch_dependents()
        _split_partial(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, o_ptr, lse_ptr, skv, width, H, sm_scale2,
                       ragged, has_len, splits, q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, o_ld,
                       gl.program_id(0), gl.program_id(1), gl.program_id(2) * 16,
                       DB, STAGES, ROPE1, CHAINS, CNT_BLOCK, PIPE, KV8)

    @gluon.jit(do_not_specialize=_FLAGS + STAMP_ARGS)
    def _split_decode_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, sink_ptr, out_ptr, o_ptr, lse_ptr, cnt_ptr,
                             skv, width, H, sm_scale2, ragged, has_len, has_sink, lanes, splits,
                             q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, sink_s0, o_s0, o_s1, o_s2, o_ld,
                             stamp_ptr, count_ptr, stamp_first, stamp_last,
                             DB: gl.constexpr, STAGES: gl.constexpr, ROPE1: gl.constexpr,
                             CHAINS: gl.constexpr, CNT_BLOCK: gl.constexpr, S_BLOCK: gl.constexpr,
                             V_BLOCK: gl.constexpr, TPW_S: gl.constexpr, PIPE: gl.constexpr = False,
                             KV8: gl.constexpr = 0, CLOCK: gl.constexpr = 0):
        """The whole split-K decode in one cooperative launch: each program's partial, then, once its group (row,
        head block) has all of them, its slice of the group's reduce (``gluon_sm90_reduce``). Writes both stamps."""
        stamp_start(stamp_ptr, stamp_first, CLOCK)
        row = gl.program_id(0)
        split = gl.program_id(1)
        hb = gl.program_id(2)
        _split_partial(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, o_ptr, lse_ptr, skv, width, H, sm_scale2,
                       ragged, has_len, splits, q_s0, q_s1, kv_s0, idx_s0, idx_s1, len_s0, o_ld, row, split, hb * 16,
                       DB, STAGES, ROPE1, CHAINS, CNT_BLOCK, PIPE, KV8)
        cnt = cnt_ptr + row * gl.num_programs(2) + hb
        _arrive_and_wait(cnt, splits)
        _reduce_slice(o_ptr, lse_ptr, sink_ptr, out_ptr, row, split, splits, hb * 16, H, o_ld, has_sink,
                      sink_s0, o_s0, o_s1, o_s2, S_BLOCK, V_BLOCK, TPW_S)
        _depart(cnt, splits)
        stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK)


def _consts(args: KernelArgs, cfg: Sm90Config, kv8: int = TO) -> dict:
    if cfg.pipe and (cfg.stages != 3 or int(args.q.shape[2]) != LANES_A):
        raise ValueError(f"Sm90Config(pipe=True) needs stages=3 and D = {LANES_A} (no rope lanes); "
                         f"got stages={cfg.stages}, D = {int(args.q.shape[2])}")
    if kv8 != TO and (cfg.pipe or cfg.rope1):
        raise ValueError(f"an fp8 pool takes neither pipe nor rope1; got {cfg}")
    extra = {"KV8": kv8} if kv8 != TO else {}
    return {"DB": int(args.q.shape[2]) - LANES_A, "STAGES": cfg.stages, "ROPE1": cfg.rope1,
            "CHAINS": cfg.chains, "PIPE": bool(cfg.pipe), "num_warps": 4, **extra}


def ws_module(args: KernelArgs, *, prefill: bool = True):
    """The warp-specialised kernel's module for this call, the faster of two on an H200.

    The prefill takes ``gluon_sm90_ws`` at every layout: with its reference max where that pays
    (``gluon_sm90_ws.reference_pays``; 4.29 ms at 16,384 rows, D = 512, against 4.79 for ``gluon_sm90_ws_d512``), and
    with the exact max elsewhere, where at D = 512 it is as fast as ``gluon_sm90_ws_d512`` or faster.
    ``launch_decode(ws=True)``'s partials (``prefill=False``) keep
    the exact max, and at D = 512 (448+64, 512+0: no rope lanes to buffer) take ``gluon_sm90_ws_d512``, 3.6-4.6%
    faster there; with rope lanes (512+64) ``gluon_sm90_ws``. An fp8 pool takes ``gluon_sm90_ws`` at every layout:
    only it converts one. Figures: docs/kernels.md, "Prefill kernel design figures".
    """
    if prefill or int(args.q.shape[2]) - LANES_A > 0 or args.kv.dtype != args.q.dtype:
        from . import gluon_sm90_ws

        return gluon_sm90_ws
    from . import gluon_sm90_ws_d512

    return gluon_sm90_ws_d512


def launch_prefill(args: KernelArgs, *, config: Sm90Config | None = None) -> None:
    """The no-split prefill on Hopper. Call only where ``supports_prefill`` (``supports`` with a ``config``).

    By default a warp-specialised kernel (a loader, two scores+softmax warpgroups and a P·V one,
    one persistent program per SM; ``ws_module`` says which for a layout; an fp8 pool's is ``gluon_sm90_ws``);
    with a ``config``, this module's one-warpgroup kernel, the one the split-K decode's partials use (16-bit
    pools only).
    """
    q, kv = args.q, args.kv
    ws = config is None and PREFILL_WARP_SPECIALISED
    if kv.dtype != q.dtype and not ws:
        raise ValueError(f"the one-warpgroup prefill reads a pool in q's dtype ({q.dtype}), not {kv.dtype}; "
                         "the warp-specialised one (config=None) reads fp8 pools")
    if empty_call(args):
        return
    if ws:
        planned(args, "gluon prefill", (), lambda: prefill_recipe(args))(args)
        return
    cfg = config or PREFILL_SM90
    planned(args, "gluon whole row", (cfg,), lambda: whole_row_recipe(args, cfg))(args)


def launch_partials(args: KernelArgs, part_o: torch.Tensor, part_lse: torch.Tensor, splits: int, *,
                    config: Sm90Config, pdl: bool) -> None:
    """The split-K decode's partial pass on Hopper, into the layout ``triton_decode``'s reduce reads."""
    q = args.q
    rows, heads, _ = q.shape
    p = pack(args)
    kv, kv8 = _pool(args)
    _partial_kernel[(rows, splits, (heads + HEAD_BLOCK - 1) // HEAD_BLOCK)](
        q, kv, p.idx, p.length, p.indptr, part_o, part_lse,
        p.skv, p.width, heads, p.sm_scale2, p.ragged, p.has_len, p.lanes, splits,
        q.stride(0), q.stride(1), kv.stride(0), p.idx_s0, p.idx_s1, p.len_s0, part_o.stride(2), *no_stamp(q.device),
        -1, -1, CNT_BLOCK=count_block(p.width), PDL=pdl, **_consts(args, config, kv8),
    )


def partial_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The dtype the decode keeps its split-K partials in: q's (16 bits) or fp32 (``DECODE_PARTIALS_16BIT``)."""
    return q_dtype if DECODE_PARTIALS_16BIT else torch.float32


def _decode_plan(args: KernelArgs, splits: int | None = None,
                 config: Sm90Config | None = None) -> triton_decode.DecodePlan:
    """The Hopper split-K decode of ``args``'s signature: a ``triton_decode.DecodePlan`` whose partial pass is
    this module's kernel (its flags run to ``o_ld``); by default the decode's config and split count."""
    from . import triton_decode

    q = args.q
    rows, heads, _ = q.shape
    cfg = config or decode_config(args)
    p = pack(args)
    splits = triton_decode.decode_splits(p, rows, heads, BLOCK_N, q.device, splits, per_sm=DECODE_PER_SM[cfg.stages])
    use_pdl = triton_decode.pdl_supported(q.device)
    pool, kv8 = kv_operand(args.kv, q.dtype)
    clock = clock_for(q.device)
    device = device_key(q.device) if q.is_cuda else -1
    scalars = (p.skv, p.width, heads)
    flags = (p.ragged, p.has_len, p.lanes, splits, q.stride(0), q.stride(1), pool.stride(0), p.idx_s0, p.idx_s1,
             p.len_s0, p.lanes)  # o_ld: the partials are contiguous, a partial row every ``lanes`` values
    consts = dict(CNT_BLOCK=count_block(p.width), PDL=use_pdl, CLOCK=max(clock, 0), **_consts(args, cfg, kv8))
    dtype = partial_dtype(q.dtype)
    n = rows * splits * heads
    return triton_decode.DecodePlan(
        device, clock, (rows, splits, (heads + HEAD_BLOCK - 1) // HEAD_BLOCK), scalars, flags, consts,
        pool is not args.kv, (n * p.lanes, n, dtype),
        triton_decode.reduce_plan(dtype, p, args.output, splits, use_pdl, clock, device=device),
        (launch_key(device, (q, pool, p.idx, p.length, p.indptr), scalars + flags, consts), dtype))


def decode_recipe(args: KernelArgs) -> Callable[[KernelArgs], str]:
    """The default Hopper decode of calls of ``args``'s signature, worked out once (``plan.planned`` keeps it): a
    function of a call's operands. One split a row: ``whole_row_recipe``. A grid resident at once: the one
    cooperative launch for an eager call, the pair for one being captured (``eager_or_captured``). Else the pair:
    the one-warpgroup partials and Triton's reduce, the partials in the stream's scratch, a stamped call's start
    from the partials and its end from the reduce."""
    from . import triton_decode

    if empty_call(args):
        return _gluon_nothing
    plan = _decode_plan(args)
    cfg = decode_config(args)
    if plan.grid[1] == 1:  # one split a row: the row's whole softmax in one program, written out as it ends
        return whole_row_recipe(args, cfg)
    two = triton_decode.split_k_run(_partial_kernel, plan, args.q.device, "gluon")
    if SPLIT_REDUCE and split_reduce_fits(args, plan.grid, cfg):
        return eager_or_captured(split_reduce_recipe(args, plan), two, args.q.device)
    return two


def eager_or_captured(eager: Callable[[KernelArgs], str], captured: Callable[[KernelArgs], str | None],
                      device: torch.device) -> Callable[[KernelArgs], str | None]:
    """``eager`` (the one cooperative launch) for a call launched now, ``captured`` (the partials and Triton's
    reduce) for one being captured into a CUDA graph. An eager call is bound by the host, whose launch the one
    kernel saves (3.6-12.3 µs on an H200's host); a replayed graph has no host in it, and there the pair is the
    faster on the GPU, by up to 1.0 µs at 1-16 rows (docs/kernels.md, "Decode kernel design figures")."""
    capturing = torch.cuda.is_current_stream_capturing if device.type == "cuda" else (lambda: False)

    def run(a: KernelArgs) -> str | None:
        return (captured if capturing() else eager)(a)

    return run


def two_launch_recipe(args: KernelArgs) -> Callable[[KernelArgs], str | None] | None:
    """The default decode plan's partials-then-reduce recipe where an eager call's default is the one cooperative
    launch, else None: what the one launch replaces, for side-by-side figures (``routescope bench host``,
    scripts/gpu), and what a graph captures."""
    from . import triton_decode

    if empty_call(args):
        return None
    plan = _decode_plan(args)
    if plan.grid[1] == 1 or not (SPLIT_REDUCE and split_reduce_fits(args, plan.grid, decode_config(args))):
        return None
    return triton_decode.split_k_run(_partial_kernel, plan, args.q.device, "gluon")


def cooperative_supported() -> bool:
    """Whether this Triton launches a kernel cooperatively (``launch_cooperative_grid``, Triton 3.2 and later)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:  # noqa: BLE001 - no NVIDIA backend: no cooperative launch
        return False
    return "launch_cooperative_grid" in CUDAOptions.__dataclass_fields__


def split_reduce_fits(args: KernelArgs, grid: tuple[int, int, int], cfg: Sm90Config) -> bool:
    """Whether the split-K decode of ``grid`` (rows, splits, head blocks) runs as one cooperative launch: every
    program resident at once (``DECODE_PER_SM`` a multiprocessor: the partial kernel's shared memory), two splits or
    more, output lanes and heads multiples of 16 (the reduce's vector loads, whole head blocks), and a Triton that
    launches cooperatively."""
    from . import triton_decode

    rows, splits, hbs = grid
    return (splits > 1 and int(args.output.shape[2]) % 16 == 0 and int(args.q.shape[1]) % 16 == 0
            and rows * splits * hbs <= DECODE_PER_SM[cfg.stages] * triton_decode.sm_count(args.q.device)
            and cooperative_supported())


def reduce_tile(splits: int) -> tuple[int, int, int]:
    """(S_BLOCK, V_BLOCK, TPW_S) of the in-kernel reduce (``gluon_sm90_reduce._reduce_slice``): every split at
    once by V_BLOCK vectors of 8 values, ``REDUCE_SLICE_VALUES`` values in all; the splits over TPW_S lanes of a
    warp and S_BLOCK / TPW_S registers of each thread."""
    from .triton_prefill import next_pow2

    s_block = max(4, next_pow2(splits))
    return s_block, REDUCE_SLICE_VALUES // 8 // s_block, max(1, s_block // 8)


def _split_reduce_or_raise(args: KernelArgs, splits: int | None,
                           config: Sm90Config | None) -> Callable[[KernelArgs], str]:
    plan = _decode_plan(args, splits, config)
    if not split_reduce_fits(args, plan.grid, config or decode_config(args)):
        raise ValueError(f"the split-K decode of grid {plan.grid} does not run as one cooperative launch here "
                         "(split_reduce_fits: two splits or more, all programs resident at once, lanes and heads "
                         "multiples of 16)")
    return split_reduce_recipe(args, plan)


def split_reduce_recipe(args: KernelArgs, plan: triton_decode.DecodePlan) -> Callable[[KernelArgs], str]:
    """Calls of ``args``'s signature through ``_split_decode_kernel`` by ``plan``, worked out once: one cooperative
    launch a call, the partials in the stream's scratch beside each group's counter (zeroed when made, zero again
    after every launch); a stamped call's start and end from that kernel."""
    from . import triton_decode

    q, out = args.q, args.output
    rows, splits, hbs = plan.grid
    p = pack(args)
    pool, _ = _pool(args)
    s_block, v_block, tpw_s = reduce_tile(splits)
    ints = (p.ragged, p.has_len, p.has_sink, p.lanes, splits, q.stride(0), q.stride(1), pool.stride(0), p.idx_s0,
            p.idx_s1, p.len_s0, p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2),
            p.lanes)  # o_ld: the partials are contiguous, a partial row every ``lanes`` values
    consts = {k: v for k, v in plan.consts.items() if k != "PDL"}
    consts.update(S_BLOCK=s_block, V_BLOCK=v_block, TPW_S=tpw_s, launch_cooperative_grid=True)
    scalars, device, clock, where, as_bytes = plan.scalars, plan.device, plan.clock, q.device, plan.as_bytes
    step = Step(_split_decode_kernel,
                (launch_key(device, (q, pool, p.idx, p.length, p.indptr, p.sink, out), scalars + ints, consts),
                 plan.part[2]),
                plan.grid, consts)

    def fetch(stream: int) -> tuple:
        arrivals = scratch().get("decode_arrivals", rows * hbs, torch.int32, where, stream, zeroed=True)
        return triton_decode.partials(plan.part, where, stream) + (arrivals,)

    buffers = triton_decode.PerStream(fetch)

    def run(a: KernelArgs) -> str:
        stream = current_stream(device)
        part_o, part_lse, arrivals = buffers(stream)
        idx, length, indptr, sink = index_operands(a)
        times, counts, entry = stamp_operands(a, where, clock)
        step((a.q, a.kv.view(torch.uint8) if as_bytes else a.kv, idx, length, indptr, sink, a.output, part_o,
              part_lse, arrivals) + scalars + (float(a.scale) * LOG2E,) + ints + (times, counts, entry, entry),
             stream)
        return "gluon"

    return run


def _pool(args: KernelArgs) -> tuple[torch.Tensor, int]:
    """``kv_operand`` of the call's pool beside q, refusing a pool no PTX conversion reads (``supports`` does)."""
    pool, kv8 = kv_operand(args.kv, args.q.dtype)
    if kv8 == TO and pool.dtype != args.q.dtype:
        raise ValueError(f"no PTX conversion reads a {pool.dtype} pool beside {args.q.dtype} q here "
                         "(gluon_sm90.supports)")
    return pool, kv8


def whole_row_recipe(args: KernelArgs, cfg: Sm90Config) -> Callable[[KernelArgs], str]:
    """Calls of ``args``'s signature through ``_prefill_kernel`` with ``cfg``, worked out once: one launch, a
    program a (row, head block), each writing its output as it finishes; a stamped call's start and end from that
    kernel. The decode where its split count is 1 (rows x head blocks fill the GPU), with the decode's ``cfg``: no
    partials, no reduce; an fp8 pool is read as bytes and converted as the partials convert it. And the prefill
    with an explicit ``config``."""
    q, out = args.q, args.output
    rows, heads, _ = q.shape
    p = pack(args)
    pool, kv8 = _pool(args)
    clock = clock_for(q.device)
    device = device_key(q.device) if q.is_cuda else -1
    scalars = (p.skv, p.width, heads)
    flags = (p.ragged, p.has_len, p.has_sink, p.lanes, q.stride(0), q.stride(1), pool.stride(0), p.idx_s0,
             p.idx_s1, p.len_s0, p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1), out.stride(2))
    consts = dict(CNT_BLOCK=count_block(p.width), CLOCK=max(clock, 0), **_consts(args, cfg, kv8))
    step = Step(_prefill_kernel,
                launch_key(device, (q, pool, p.idx, p.length, p.indptr, p.sink, out), scalars + flags, consts),
                (rows, (heads + HEAD_BLOCK - 1) // HEAD_BLOCK), consts)
    as_bytes, where = pool is not args.kv, q.device

    def run(a: KernelArgs) -> str:
        idx, length, indptr, sink = index_operands(a)
        times, counts, entry = stamp_operands(a, where, clock)
        step((a.q, a.kv.view(torch.uint8) if as_bytes else a.kv, idx, length, indptr, sink, a.output) + scalars
             + (float(a.scale) * LOG2E,) + flags + (times, counts, entry, entry), current_stream(device))
        return "gluon"

    return run


def prefill_recipe(args: KernelArgs) -> Callable[[KernelArgs], str]:
    """The default Hopper prefill of calls of ``args``'s signature (``gluon_sm90_ws.prefill_recipe``)."""
    if empty_call(args):
        return _gluon_nothing
    return ws_module(args).prefill_recipe(args)


def _gluon_nothing(args: KernelArgs) -> str:
    return "gluon"


def launch_decode(args: KernelArgs, *, splits: int | None = None, config: Sm90Config | None = None,
                  pdl: bool | None = None, ws: bool | None = None, fused: bool | None = None) -> None:
    """The split-K decode on Hopper. Call only where supports().

    By default (``decode_recipe``): one launch where the split count is 1, or, for a call not being captured into
    a CUDA graph, where the grid is resident at once (``split_reduce_fits``: the partials and the reduce in one
    cooperative kernel; ``eager_or_captured``), else this module's partials and ``triton_decode``'s reduce. The
    options are for tests and tuning. ``fused=True``: the one cooperative launch with ``splits`` and ``config`` (a
    ValueError where it does not fit); ``fused=False``, or any other option: partials, then the reduce. Those come
    from this module's one-warpgroup kernel (``DECODE_WARP_SPECIALISED`` is False: faster at 2-16 rows), from the
    warp-specialised kernel (``gluon_sm90_ws``, split work items) with ``ws=True``; an explicit ``config`` always
    means this module's kernel. The default launch keeps the partials in
    the stream's scratch and stamps a stamped call (``args.stamp``); the others allocate them and do not stamp,
    except ``fused=True``, which is the default's kernel.
    """
    from . import triton_decode

    if empty_call(args):
        return
    default = splits is None and config is None and pdl is None and fused is None
    if default and not ((DECODE_WARP_SPECIALISED and ws is None) or ws):
        planned(args, "gluon decode", (), lambda: decode_recipe(args))(args)
        return
    if fused:
        if ws or pdl is not None:
            raise ValueError("fused=True is the one-warpgroup kernel's cooperative launch: no ws, no pdl")
        planned(args, "gluon split decode", (splits, config),
                lambda: _split_reduce_or_raise(args, splits, config))(args)
        return
    q = args.q
    rows, heads, _ = q.shape
    use_ws = (DECODE_WARP_SPECIALISED and config is None) if ws is None else bool(ws)
    cfg = config or decode_config(args)
    p = pack(args)
    splits = triton_decode.decode_splits(p, rows, heads, BLOCK_N, q.device, splits,
                                         per_sm=1 if use_ws else DECODE_PER_SM[cfg.stages])
    use_pdl = triton_decode.pdl_supported(q.device) if pdl is None else bool(pdl)
    part_o, part_lse = triton_decode.partial_buffers(rows, splits, heads, p.lanes, partial_dtype(q.dtype), q.device)
    if use_ws:
        ws_module(args, prefill=False).launch_partials_ws(args, part_o, part_lse, splits, pdl=use_pdl)
    else:
        launch_partials(args, part_o, part_lse, splits, config=cfg, pdl=use_pdl)
    triton_decode.reduce_partials(part_o, part_lse, p, args.output, splits, use_pdl)
