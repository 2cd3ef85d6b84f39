"""Split-K sparse decode (``intree.sparse_decode``) in Triton: partials over (rows, splits, head blocks), then a reduce.

Computes the contract of docs/kernels.md, split-K. A decode-sized call has too few rows to fill the GPU with one
program per row (the seed's 9x slowdown); splitting each row's positions across programs does. Each partial program
runs the prefill's tile loop (``triton_prefill.attend``) over its share of the row's length and writes a
normalised partial output (fp32) and its log-sum-exp (base 2); the reduce loads every split of a row at once,
rescales the partials to their common max, adds the sink's mass and writes the output. The split count follows
the row count: about ``PROGRAMS_PER_SM`` programs per multiprocessor (``choose_splits``). ``reduce_partials``
also combines the Hopper kernels' partials (``gluon_sm90.launch_decode``), fp32 or 16-bit.

A decode call is short enough that launch latency counts: on NVIDIA GPUs of compute capability 9.0 and up the
reduce is launched with programmatic dependent launch (PDL), so it is scheduled while the partials still run and
waits for them in-kernel (``gdc_wait``): 0.8-2.2 µs off the eager call at 2-16 rows. Splits follow each row's count
of valid positions; the partials are fp32. Figures: docs/kernels.md, "Triton kernel design figures".

Limits: those of ``triton_prefill`` (``triton_supports``); PDL needs sm_90 or later and a Triton with
``griddepcontrol`` (3.4 and later).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from .common import KernelArgs, device_key, empty_call, sm_count
from .launcher import Step, current_stream
from .launcher import launch as run
from .plan import clock_for, index_operands, launch_key, planned, stamp_operands
from .scratch import scratch
from .stamps import no_stamp
from .torch_splitk import sparse_decode as torch_sparse_decode
from .triton_stamps import STAMP_ARGS, stamp_end, stamp_start
from .triton_prefill import (HEAD_BLOCK, LOG2E, Packed, TileConfig, attend, next_pow2, no_kernel_recipe, on_torch,
                             row_bounds, store_rows, tile_launch, triton_supports)

try:  # Triton >= 3.4 on NVIDIA: griddepcontrol, for programmatic dependent launch
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAVE_GDC = True
except Exception:  # noqa: BLE001 - older Triton, or a build without the CUDA extras: no PDL, never an error
    HAVE_GDC = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

# The fastest config of those measured on an H200 at 2 and 16 rows, 512+64 (docs/kernels.md, "Triton kernel
# design figures").
DECODE_CONFIG = TileConfig(64, 4, 2, 4)
MAX_SPLITS = 64  # the reduce loads every split of a row at once
PROGRAMS_PER_SM = 2  # partial programs to aim for per multiprocessor: the fastest with DECODE_CONFIG on an H200
REDUCE_VALUES = 4096  # partial values one reduce program loads: fewer means more, lighter programs
_FLAGS = ["ragged", "has_len", "has_sink", "lanes", "splits", "width"]  # names absent from a kernel are ignored
_PDL: dict[int, bool] = {}


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: an NVIDIA GPU of compute capability >= 9.0 and a Triton that can launch it."""
    if not HAVE_GDC or device.type != "cuda" or torch.version.hip is not None:
        return False
    key = device_key(device)
    if key not in _PDL:
        try:
            from triton.backends.nvidia.compiler import CUDAOptions

            knows = "launch_pdl" in CUDAOptions.__dataclass_fields__
        except Exception:  # noqa: BLE001 - no NVIDIA backend: no PDL
            knows = False
        _PDL[key] = knows and torch.cuda.get_device_capability(key) >= (9, 0)
    return _PDL[key]


def choose_splits(rows: int, head_blocks: int, width: int, block_n: int, sms: int, per_sm: int | None = None,
                  max_splits: int | None = None) -> int:
    """Splits per row: about ``per_sm`` programs per multiprocessor, at least one tile per split, at most MAX_SPLITS."""
    tiles = max(1, triton.cdiv(width, block_n))
    target = (per_sm if per_sm is not None else PROGRAMS_PER_SM) * sms
    want = max(1, triton.cdiv(target, max(1, rows * head_blocks)))
    want = min(want, tiles, max_splits if max_splits is not None else MAX_SPLITS)
    return triton.cdiv(tiles, triton.cdiv(tiles, want))  # balance: equal tiles per split


@triton.jit(do_not_specialize=_FLAGS + STAMP_ARGS)
def _partial_kernel(q_ptr, kv_ptr, idx_ptr, len_ptr, indptr_ptr, o_ptr, lse_ptr,
                    skv, width, H, sm_scale2, ragged, has_len, lanes, splits,
                    q_s0, q_s1, q_s2, kv_s0, kv_s2, idx_s0, idx_s1, len_s0,
                    stamp_ptr, count_ptr, stamp_first, stamp_last,
                    D: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, BLOCK_B: tl.constexpr,
                    HAS_B: tl.constexpr, V_B: tl.constexpr, BLOCK_N: tl.constexpr, HB: tl.constexpr,
                    IEEE: tl.constexpr, CNT_BLOCK: tl.constexpr, PDL: tl.constexpr, KV8: tl.constexpr = 0,
                    CLOCK: tl.constexpr = 0):
    stamp_start(stamp_ptr, stamp_first, CLOCK)
    if PDL:
        gdc_launch_dependents()  # the reduce may be scheduled now; it waits for this grid in gdc_wait
    row = tl.program_id(0)
    split = tl.program_id(1)
    h0 = tl.program_id(2) * HB
    base, n = row_bounds(idx_ptr, idx_s0, idx_s1, width, len_ptr, len_s0, indptr_ptr, row, ragged, has_len,
                         CNT_BLOCK)
    chunk = tl.cdiv(tl.cdiv(n, splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n)
    m, l, acc0, acc1, acc2, acc3, acc_b = attend(
        q_ptr, kv_ptr, idx_ptr, row, h0, lo, hi, base, idx_s1, skv, H, sm_scale2, q_s0, q_s1, q_s2, kv_s0, kv_s2,
        D, CH, NCH, BLOCK_B, HAS_B, V_B, BLOCK_N, HB, IEEE, KV8)
    offs_h = h0 + tl.arange(0, HB)
    hmask = offs_h < H
    inv = tl.where(l > 0.0, 1.0 / tl.where(l > 0.0, l, 1.0), 0.0)
    lse = tl.where(l > 0.0, m + tl.log2(tl.where(l > 0.0, l, 1.0)), float("-inf"))
    part = (row.to(tl.int64) * splits + split) * H + offs_h  # [HB] partial-row ids
    tl.store(lse_ptr + part, lse, mask=hmask)
    store_rows(o_ptr + part[:, None] * lanes, 1, inv, hmask, lanes, acc0, acc1, acc2, acc3, acc_b,
               CH, NCH, BLOCK_B, V_B)


@triton.jit(do_not_specialize=_FLAGS + STAMP_ARGS)
def _reduce_kernel(o_ptr, lse_ptr, sink_ptr, out_ptr, H, has_sink, lanes, splits, sink_s0, o_s0, o_s1, o_s2,
                   stamp_ptr, count_ptr, stamp_first, stamp_last,
                   S_BLOCK: tl.constexpr, L_BLOCK: tl.constexpr, PDL: tl.constexpr, HB: tl.constexpr = 1,
                   CLOCK: tl.constexpr = 0):
    """One program: ``HB`` heads × ``L_BLOCK`` lanes of a row, every split of it loaded at once."""
    row = tl.program_id(0)
    offs_h = tl.program_id(1) * HB + tl.arange(0, HB)
    hmask = offs_h < H
    offs_l = tl.program_id(2) * L_BLOCK + tl.arange(0, L_BLOCK)
    lmask = offs_l < lanes
    offs_s = tl.arange(0, S_BLOCK)
    smask = (offs_s < splits)[:, None] & hmask[None, :]
    part = (row.to(tl.int64) * splits + offs_s[:, None]) * H + offs_h[None, :]  # [S_BLOCK, HB]
    # Absent, the sink loads as -inf: it moves neither the max nor the total.
    sink = tl.load(sink_ptr + offs_h * sink_s0, mask=hmask & ((offs_h * 0 + has_sink) != 0), other=float("-inf"))
    sink = sink.to(tl.float32) * 1.4426950408889634
    if PDL:
        gdc_wait()  # launched early: wait here until every partial is written
    lse = tl.load(lse_ptr + part, mask=smask, other=float("-inf"))
    o = tl.load(o_ptr + part[:, :, None] * lanes + offs_l[None, None, :], mask=smask[:, :, None] & lmask[None, None, :],
                other=0.0).to(tl.float32)
    big = tl.maximum(tl.max(lse, axis=0), sink)  # [HB]
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    w = tl.exp2(lse - big_safe[None, :])
    total = tl.sum(w, axis=0) + tl.exp2(sink - big_safe)
    inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
    res = tl.sum(o * w[:, :, None], axis=0) * inv[:, None]  # [HB, L_BLOCK]
    out_rows = out_ptr + row.to(tl.int64) * o_s0 + offs_h[:, None] * o_s1
    tl.store(out_rows + offs_l[None, :] * o_s2, res.to(out_ptr.dtype.element_ty), mask=hmask[:, None] & lmask[None, :])
    stamp_end(stamp_ptr, count_ptr, stamp_last, CLOCK)


def decode_splits(p: Packed, rows: int, heads: int, block_n: int, device: torch.device, splits: int | None = None,
                  per_sm: int | None = None) -> int:
    """The split count a decode launch uses: ``splits`` if given, else ``choose_splits``'s for the rows' width (a
    ragged index's positions per row on average); at least 1, at most MAX_SPLITS."""
    if splits is None:
        width = p.width if not p.ragged else triton.cdiv(int(p.idx.numel()), rows)
        splits = choose_splits(rows, triton.cdiv(heads, HEAD_BLOCK), width, block_n, sm_count(device), per_sm)
    return max(1, min(int(splits), MAX_SPLITS))


def partial_buffers(rows: int, splits: int, heads: int, lanes: int, dtype: torch.dtype,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The partials' buffers: each split's normalised output [rows, splits, heads, lanes] in ``dtype``, and its
    log-sum-exp (base 2, fp32) [rows, splits, heads]."""
    return (torch.empty((rows, splits, heads, lanes), dtype=dtype, device=device),
            torch.empty((rows, splits, heads), dtype=torch.float32, device=device))


def reduce_blocks(splits: int, lanes: int, values: int | None = None, heads: int = 1) -> tuple[int, int]:
    """(S_BLOCK, L_BLOCK): every split of a row in one load, lanes blocked to keep a program of ``heads``
    heads near ``values``."""
    s_block = max(2, next_pow2(splits))
    return s_block, min(max(16, next_pow2(lanes)), max(16, (values or REDUCE_VALUES) // (s_block * heads)))


class ReducePlan(NamedTuple):
    """The reduce's launch for one call signature: grid, integers, constexprs, handle key."""

    grid: tuple[int, int, int]
    ints: tuple  # H, has_sink, lanes, splits, sink_s0, o_s0, o_s1, o_s2
    consts: dict
    key: tuple


def reduce_plan(part_dtype: torch.dtype, p: Packed, out: torch.Tensor, splits: int, use_pdl: bool, clock: int, *,
                device: int, reduce_values: int | None = None, heads_per_program: int = 1) -> ReducePlan:
    """The reduce over ``splits`` partials per row in ``part_dtype``, into ``out`` (``heads_per_program``, a power
    of two, heads a program, which then loads ``reduce_values`` values for all of them)."""
    rows, heads = out.shape[0], out.shape[1]
    hb = int(heads_per_program)
    if hb < 1 or hb & (hb - 1):
        raise ValueError(f"heads_per_program must be a power of two, got {heads_per_program}")
    s_block, l_block = reduce_blocks(splits, p.lanes, reduce_values, hb)
    ints = (heads, p.has_sink, p.lanes, splits, p.sink.stride(0) if p.has_sink else 0, out.stride(0), out.stride(1),
            out.stride(2))
    consts = dict(S_BLOCK=s_block, L_BLOCK=l_block, PDL=use_pdl, HB=hb, num_warps=4, CLOCK=max(clock, 0),
                  **({"launch_pdl": True} if use_pdl else {}))
    key = (device, part_dtype, p.sink.dtype, p.sink.data_ptr() & 15, out.dtype, out.data_ptr() & 15, ints,
           tuple(sorted(consts.items())))
    return ReducePlan((rows, triton.cdiv(heads, hb), triton.cdiv(p.lanes, l_block)), ints, consts, key)


def run_reduce(plan: ReducePlan, part_o: torch.Tensor, part_lse: torch.Tensor, sink: torch.Tensor, out: torch.Tensor,
               stamps: tuple, stream: int) -> None:
    """Launch a planned reduce; ``stamps`` is (table, counters, first, last) (the reduce ends a stamped call)."""
    run(_reduce_kernel, plan.key, plan.grid, (part_o, part_lse, sink, out) + plan.ints + stamps, plan.consts, stream)


def reduce_partials(part_o: torch.Tensor, part_lse: torch.Tensor, p: Packed, out: torch.Tensor, splits: int,
                    use_pdl: bool, reduce_values: int | None = None, heads_per_program: int = 1) -> None:
    """Launch the reduce over ``splits`` partials per row (also used after the Hopper kernel's partials), unstamped.

    ``part_o`` may be fp32 or 16-bit; the reduce computes in fp32."""
    device = device_key(out.device) if out.is_cuda else -1
    plan = reduce_plan(part_o.dtype, p, out, splits, use_pdl, clock_for(out.device), device=device,
                       reduce_values=reduce_values, heads_per_program=heads_per_program)
    run_reduce(plan, part_o, part_lse, p.sink, out, (*no_stamp(out.device), -1, -1), current_stream(device))


class DecodePlan(NamedTuple):
    """What a split-K decode launch of one call signature works out on the host (``plan.planned``): Triton's
    partials here, the Hopper ones in ``gluon_sm90``; the reduce is this module's either way."""

    device: int
    clock: int
    grid: tuple[int, int, int]
    scalars: tuple  # skv, width, H
    flags: tuple  # ragged ...: the integer arguments after the scale
    consts: dict
    as_bytes: bool
    part: tuple  # (numel of the partial outputs, of their lse, their dtype)
    reduce: ReducePlan
    key: tuple


def _plan(args: KernelArgs, config: TileConfig | None, splits: int | None, reduce_values: int | None,
          reduce_heads: int, pdl: bool | None, kv8: int | None) -> DecodePlan:
    q, kv, out = args.q, args.kv, args.output
    rows, heads, _ = q.shape
    tiles = tile_launch(args, config, DECODE_CONFIG, kv8)
    p = tiles.p
    splits = decode_splits(p, rows, heads, tiles.cfg.block_n, q.device, splits)
    use_pdl = pdl_supported(q.device) if pdl is None else bool(pdl)
    clock = clock_for(q.device)
    device = device_key(q.device) if q.is_cuda else -1
    scalars = (p.skv, p.width, heads)
    flags = (p.ragged, p.has_len, p.lanes, splits, q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.stride(2),
             p.idx_s0, p.idx_s1, p.len_s0)
    consts = {"PDL": use_pdl, **tiles.consts, "CLOCK": max(clock, 0)}
    n = rows * splits * heads
    return DecodePlan(
        device, clock, (rows, splits, triton.cdiv(heads, HEAD_BLOCK)), scalars, flags, consts, tiles.pool is not kv,
        (n * p.lanes, n, torch.float32),
        reduce_plan(torch.float32, p, out, splits, use_pdl, clock, device=device, reduce_values=reduce_values,
                    heads_per_program=reduce_heads),
        launch_key(device, (q, tiles.pool, p.idx, p.length, p.indptr), scalars + flags, consts))


def partials(part: tuple, device: torch.device, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The partials' buffers, flat, from the stream's scratch: outputs (``part[2]``), lse (fp32)."""
    numel_o, numel_lse, dtype = part
    pad = scratch()
    return (pad.get(f"decode_o_{dtype}", numel_o, dtype, device, stream, zeroed=False),
            pad.get("decode_lse", numel_lse, torch.float32, device, stream, zeroed=False))


class PerStream:
    """A recipe's scratch buffers per stream: fetched from the scratch once, then kept (those made for a capture
    never are). A buffer the scratch later grows past stays valid for this recipe: it holds it."""

    __slots__ = ("_fetch", "_kept")

    def __init__(self, fetch: Callable[[int], tuple]) -> None:
        self._fetch = fetch
        self._kept: dict[int, tuple] = {}

    def __call__(self, stream: int) -> tuple:
        bufs = self._kept.get(stream)
        if bufs is None:
            bufs = self._fetch(stream)
            pad = scratch()
            if all(pad.holds(b) for b in bufs):
                self._kept[stream] = bufs
        return bufs


def reduce_step(plan: ReducePlan) -> Callable[..., None]:
    """A planned reduce as a recipe step: ``run(part_o, part_lse, sink, out, stamps, stream)``; ``stamps`` is
    (table, counters, entry), the reduce ending a stamped call."""
    step = Step(_reduce_kernel, plan.key, plan.grid, plan.consts)
    ints = plan.ints

    def run(part_o: torch.Tensor, part_lse: torch.Tensor, sink: torch.Tensor, out: torch.Tensor, stamps: tuple,
            stream: int) -> None:
        step((part_o, part_lse, sink, out) + ints + (stamps[0], stamps[1], -1, stamps[2]), stream)

    return run


def recipe(args: KernelArgs) -> Callable[[KernelArgs], str | None]:
    """The default split-K decode of calls of ``args``'s signature, worked out once (``plan.planned`` keeps it): a
    function of a call's operands launching the partials and the reduce; "torch" where torch serves."""
    elsewhere = no_kernel_recipe(args, torch_sparse_decode)
    if elsewhere is not None:
        return elsewhere
    return split_k_run(_partial_kernel, _plan(args, None, None, None, 1, None, None), args.q.device, None)


def split_k_run(partial_kernel: Any, plan: DecodePlan, where: torch.device,
                ran: str | None) -> Callable[[KernelArgs], str | None]:
    """A call's split-K decode by ``plan``: ``partial_kernel`` (this module's, or the Hopper one of ``gluon_sm90``)
    into the stream's scratch partials, then the reduce; a stamped call's start from the partials, its end from
    the reduce. Returns ``ran`` (what the registry reports)."""
    step = Step(partial_kernel, plan.key, plan.grid, plan.consts)
    reduce = reduce_step(plan.reduce)
    scalars, flags, as_bytes, device, clock, part = (plan.scalars, plan.flags, plan.as_bytes, plan.device,
                                                     plan.clock, plan.part)
    buffers = PerStream(lambda stream: partials(part, where, stream))

    def run(a: KernelArgs) -> str | None:
        stream = current_stream(device)
        part_o, part_lse = buffers(stream)
        idx, length, indptr, sink = index_operands(a)
        stamps = stamp_operands(a, where, clock)
        pool = a.kv.view(torch.uint8) if as_bytes else a.kv
        step((a.q, pool, idx, length, indptr, part_o, part_lse) + scalars + (float(a.scale) * LOG2E,) + flags
             + (stamps[0], stamps[1], stamps[2], -1), stream)
        reduce(part_o, part_lse, sink, a.output, stamps, stream)
        return ran

    return run


def launch(args: KernelArgs, *, config: TileConfig | None = None, splits: int | None = None,
           reduce_values: int | None = None, reduce_heads: int = 1, pdl: bool | None = None,
           kv8: int | None = None) -> str | None:
    """Write the split-K decode into ``args.output`` in place; torch serves dtypes Triton does not.

    The keyword options exist for tests; the defaults are the tuned choices, and ``pdl=None`` means "where the GPU
    and Triton support it". The partials live in the stream's scratch; a stamped call (``args.stamp``) has its
    start written by the partial kernel and its end by the reduce.
    """
    options = (config, splits, reduce_values, reduce_heads, pdl, kv8)
    if options == (None, None, None, 1, None, None):
        return planned(args, "triton decode", (), lambda: recipe(args))(args)
    if empty_call(args):
        return None
    if not triton_supports(args):
        return on_torch(torch_sparse_decode, args)
    plan = planned(args, "triton_decode", options, lambda: _plan(args, *options))
    q = args.q
    pool = args.kv.view(torch.uint8) if plan.as_bytes else args.kv
    stream = current_stream(plan.device)
    part_o, part_lse = partials(plan.part, q.device, stream)
    idx, length, indptr, sink = index_operands(args)
    times, counts, at = stamp_operands(args, q.device, plan.clock)
    run(_partial_kernel, plan.key, plan.grid, (q, pool, idx, length, indptr, part_o, part_lse) + plan.scalars
        + (float(args.scale) * LOG2E,) + plan.flags + (times, counts, at, -1), plan.consts, stream)
    run_reduce(plan.reduce, part_o, part_lse, sink, args.output, (times, counts, -1, at), stream)
    return None
