"""Can Hopper's TMA gather kv rows one by one into the wgmma layout, and how fast? (session 14)

Hopper's TMA has no row gather (Blackwell's ``gather4`` has). But a tensor map over the kv pool
with a one-row box of 64 lanes (128 bytes) copies one row's 64 lanes to any 128-byte line of a
tile. Encoded with the 128-byte swizzle, if the hardware swizzles by the destination's address
bits, as wgmma reads them, a row written to line r of a 1,024-byte aligned tile lands where a
whole 8-row box would have put it. One instruction then moves 128 bytes where a cp.async moves
16, and the copies bypass the load/store unit that the prefill's gathers keep busy
(docs/benchmarks.md, session 13).

Triton 3.6 refuses a swizzled box of fewer than 8 rows ("expected collapsed shapePerCTA to be at
least [8, 64]"), so the kernel is compiled with an unswizzled one-row box and the tensor map is
encoded with the 128-byte swizzle (``swizzle_rows``). It also puts a barrier after every TMA copy
except in a one-warp partition, so one warp issues them.

The probe gathers the same tiles (64 random rows of 512 lanes, one slot in 16 -1 when timed; a
-1 column and a past-the-pool column when checked) into a ring of three 64 KB stages, one
program per multiprocessor unless ``--grid`` says otherwise, in one of these ways (``MODES``):
- ``cp512``: the prefill's way, 16-byte cp.async copies by a 4-warp loader (gluon_sm90_parts._gather);
- ``cp576``: the same with the 64 rope lanes too, into a buffer of their own;
- ``hybrid``: cp.async for the 512 lanes and a 1-warp TMA loader for the rope lanes;
- ``tma1``, ``tma2``, ``tma4``: one-row TMA copies, 8 a row, from 1, 2 or 4 one-warp loaders;
- ``row512``, ``row512x4`` (session 18): one TMA copy of a row's 512 lanes (1,024 bytes, a [1, 8, 64]
  box of the pool seen as [slots, 9, 64]), from 1 or 4 one-warp loaders, landing row after row
  (``_rows_kernel``); ``row576``, ``row576x4``: and a second copy for its 64 rope lanes;
  ``row576sw``: ``row576`` with the 128-byte swizzle encoded.
A 4-warp consumer takes each stage back. Unless ``--no-check``, it first reads the tiles of
``cp512``, ``hybrid``, ``tma1`` and ``tma4`` back through the wgmma layout (those of ``row512``,
``row576`` and ``row576x4`` row after row) and compares them with torch's gather (rows -1 or past
the pool: zeros). Then it times each mode without the read-back:
bytes gathered per second, side by side in one run. On an H200 (S14-2, S14-3): every row right;
cp.async 8.5-8.9 TB/s, the hybrid no faster, TMA 1.3-2.0 TB/s. Whole-row boxes (S18-1, S18-3) are
right too, and faster than one-row boxes, but not than cp.async: 2.8-4.2 TB/s against 8.1-8.6.

Usage (device machine, repository root):
    python3 scripts/gpu/tma_probe.py [--tiles-per-sm N] [--grid G] [--modes cp512,cp576,row576,...] [--no-check]
Writes $OUT/tma_probe_G.json (G: the programs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels.gluon_sm90_parts import _gather  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import interleaved_event_times, lab_output, save_results, warm_clocks  # noqa: E402

ROW_BOX = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)  # one row of 64 16-bit lanes
WHOLE_ROW_BOX = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)  # a row's 512 lanes: [1, 8, 64]
CU_TENSOR_MAP_SWIZZLE_128B = 3
STAGES = 3


def swizzle_rows(compiled) -> None:
    """Encode the compiled kernel's tensor maps with the 128-byte swizzle (before its launcher exists)."""
    assert compiled.module is None, "patch the tensor maps' swizzle before the kernel's first launch"
    for meta in compiled.metadata.tensordesc_meta or []:
        meta["swizzle"] = CU_TENSOR_MAP_SWIZZLE_128B


@gluon.jit
def _consume(kv, rope, ready, empty, out_ptr, n_tiles, readback, ROWS: gl.constexpr = 0):
    """Take each stage back once gathered; with ``readback`` (nonzero), write the tile to out[t] first.

    ROWS 0: the stage in the wgmma layout, out[t] [64 rows, 512 lanes]; 8 or 9: a whole-row stage
    (``_tma_rows``, with 9 its rope lanes too), out[t] [64 rows, ROWS x 64 lanes].
    """
    lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    W: gl.constexpr = 512 if ROWS == 0 else ROWS * 64
    g = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        st = g % 3
        mbarrier.wait(ready.index(st), (g // 3) & 1)
        if readback != 0:
            if ROWS == 0:
                _read_back(kv.index(st), out_ptr + t.to(gl.int64) * 64 * W, lay)
            else:
                _read_back_rows(kv.index(st), rope.index(st), out_ptr + t.to(gl.int64) * 64 * W, ROWS, lay)
        mbarrier.arrive(empty.index(st))
        g += 1


@gluon.jit
def _read_back(stage, base, lay: gl.constexpr):
    rows = gl.arange(0, 64, gl.SliceLayout(1, lay))
    cols = gl.arange(0, 512, gl.SliceLayout(0, lay))
    gl.store(base + rows[:, None] * 512 + cols[None, :], stage.load(lay))


@gluon.jit
def _read_back_rows(stage, rope, base, ROWS: gl.constexpr, lay: gl.constexpr):
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    W: gl.constexpr = ROWS * 64
    cols = gl.arange(0, 64, gl.SliceLayout(0, lay))
    r64 = gl.arange(0, 64, gl.SliceLayout(1, lay))
    for h in gl.static_range(8):  # lines h * 64 .. h * 64 + 63 of the 512 (line l: row l // 8, block l % 8)
        v = stage._reinterpret(stage.dtype, [512, 64], plain).slice(h * 64, 64).load(lay)
        ln = h * 64 + r64
        gl.store(base + (ln // 8)[:, None] * W + (ln % 8)[:, None] * 64 + cols[None, :], v)
    if ROWS == 9:
        v = rope._reinterpret(rope.dtype, [64, 64], plain).load(lay)
        gl.store(base + r64[:, None] * W + 512 + cols[None, :], v)


@gluon.jit
def _ring(ARRIVALS: gl.constexpr):
    """The ring's barriers, initialised: (ready: ARRIVALS arrivals a stage, empty: one)."""
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [3, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [3, 1], bar_l)
    for i in gl.static_range(3):
        mbarrier.init(ready.index(i), count=ARRIVALS)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    return ready, empty


@gluon.jit
def _expect(bar, part, nbytes: gl.constexpr):
    """The first TMA warp expects the whole stage's bytes, the others only arrive (any order is safe)."""
    if part == 0:
        mbarrier.expect(bar, nbytes)
    else:
        mbarrier.arrive(bar)


@gluon.jit
def _tma_load(desc, kv, rope, ready, empty, idx_ptr, n_tiles, part, parts, rope_only):
    """One warp: per tile, rows part, part + parts, ...: a one-row TMA copy per 64-lane block.

    Into the stage's 512 lines (line c * 64 + r: row r, block c), or with ``rope_only`` only lanes
    512-575 into the tile's rope buffer.
    """
    g = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        st = g % 3
        mbarrier.wait(empty.index(st), ((g // 3) & 1) ^ 1)
        if rope_only != 0:
            _expect(ready.index(st), part, 64 * 64 * 2)
            rlines = rope.index(st)._reinterpret(kv.dtype, [64, 1, 64], desc.layout)
            for r in range(part, 64, parts):
                slot = gl.load(idx_ptr + t.to(gl.int64) * 64 + r)  # -1 or past the pool: outside the map, zeros
                tma.async_copy_global_to_shared(desc, [slot, 512], ready.index(st), rlines.index(r))
        else:
            _expect(ready.index(st), part, 64 * 512 * 2)
            lines = kv.index(st)._reinterpret(kv.dtype, [512, 1, 64], desc.layout)
            for r in range(part, 64, parts):
                slot = gl.load(idx_ptr + t.to(gl.int64) * 64 + r)
                for c in gl.static_range(8):
                    tma.async_copy_global_to_shared(desc, [slot, c * 64], ready.index(st), lines.index(c * 64 + r))
        g += 1


@gluon.jit
def _cp_load(kv_ptr, kv_s0, kv, rope, ready, empty, idx_ptr, skv, n_tiles, with_rope):
    """Four warps: per tile, the prefill's cp.async gather of 64 rows x 512 lanes (and with_rope: lanes 512-575)."""
    cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    g = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        st = g % 3
        mbarrier.wait(empty.index(st), ((g // 3) & 1) ^ 1)
        slots = gl.load(idx_ptr + t.to(gl.int64) * 64 + gl.arange(0, 64, gl.SliceLayout(1, cp)))
        _gather(kv_ptr, kv_s0, slots, skv, kv.index(st), 0, 512, cp)
        if with_rope != 0:
            _gather(kv_ptr, kv_s0, slots, skv, rope.index(st), 512, 64, cp)
        async_copy.mbarrier_arrive(ready.index(st), increment_count=False)
        g += 1


@gluon.jit
def _tma_rows(desc, rope_desc, rows, rope, ready, empty, idx_ptr, n_tiles, part, parts, ROPE: gl.constexpr):
    """One warp: per tile, rows part, part + parts, ...: a TMA copy of each row's 512 lanes (ROPE: and its rope lanes).

    The 512 lanes land row after row, each row's 1,024 bytes contiguous: not a layout wgmma reads from
    shared memory, but ldmatrix can (its rows' addresses are free). The rope lanes land in line r of
    their own buffer. (One box of all 576 lanes would be [1, 9, 64]; Triton takes only powers of 2.)
    """
    g = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        st = g % 3
        mbarrier.wait(empty.index(st), ((g // 3) & 1) ^ 1)
        _expect(ready.index(st), part, 64 * (576 if ROPE else 512) * 2)
        lines = rows.index(st)._reinterpret(rows.dtype, [64, 1, 8, 64], desc.layout)
        rlines = rope.index(st)._reinterpret(rope.dtype, [64, 1, 64], rope_desc.layout)
        for r in range(part, 64, parts):
            slot = gl.load(idx_ptr + t.to(gl.int64) * 64 + r)  # -1 or past the pool: outside the map, zeros
            tma.async_copy_global_to_shared(desc, [slot, 0, 0], ready.index(st), lines.index(r))
            if ROPE:
                tma.async_copy_global_to_shared(rope_desc, [slot, 512], ready.index(st), rlines.index(r))
        g += 1


# What gathers each tile: (MODE, arrivals a stage: one cp.async arrival per loader thread, one expect per TMA warp)
MODES = {"cp512": (0, 128), "cp576": (1, 128), "hybrid": (2, 129), "tma1": (3, 1), "tma2": (4, 2), "tma4": (5, 4),
         # session 18: one TMA copy a row's 512 lanes (and for row576* one more its rope lanes), from 1 or 4
         # one-warp loaders; "sw": the 128-byte swizzle encoded. MODE only keeps each its own compiled kernel.
         "row576": (6, 1), "row576x4": (7, 4), "row576sw": (10, 1), "row512": (8, 1), "row512x4": (9, 4)}
ROW_MODES = {"row576": 9, "row576x4": 9, "row576sw": 9, "row512": 8, "row512x4": 8}  # 64-lane blocks gathered a row


def lanes_of(mode: str) -> int:
    """The lanes a mode gathers of each row: 576 with the rope lanes, else 512."""
    return 576 if mode in ("cp576", "hybrid") else 64 * ROW_MODES.get(mode, 8)


def checked_lanes(mode: str) -> int:
    """The lanes of each row the read-back writes: a whole-row stage's (and rope buffer's), else the 512-lane stage.

    ``hybrid`` gathers 576 lanes, but its rope lanes' buffer is not read back (session 14 checked its 512).
    """
    return 64 * ROW_MODES.get(mode, 8)


@gluon.jit(do_not_specialize=["readback", "n_tiles"])
def _rows_kernel(desc, rope_desc, idx_ptr, out_ptr, n_tiles, readback, MODE: gl.constexpr,
                 ARRIVALS: gl.constexpr, ROPE: gl.constexpr):
    """The whole-row modes: three stages of 64 rows x 512 lanes, row after row, and 64 rope lanes a row."""
    dt: gl.constexpr = gl.bfloat16
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    rows = gl.allocate_shared_memory(dt, [3, 512, 64], plain)
    rope = gl.allocate_shared_memory(dt, [3, 64, 64], plain)
    ready, empty = _ring(ARRIVALS)
    zero = gl.program_id(0) * 0
    R: gl.constexpr = 9 if ROPE else 8
    if ARRIVALS == 1:
        gl.warp_specialize([(_consume, (rows, rope, ready, empty, out_ptr, n_tiles, readback, R)),
                            (_tma_rows, (desc, rope_desc, rows, rope, ready, empty, idx_ptr, n_tiles, zero, zero + 1,
                                         ROPE))],
                           [1], [48])
    else:
        gl.warp_specialize([(_consume, (rows, rope, ready, empty, out_ptr, n_tiles, readback, R)),
                            (_tma_rows, (desc, rope_desc, rows, rope, ready, empty, idx_ptr, n_tiles, zero, zero + 4,
                                         ROPE)),
                            (_tma_rows, (desc, rope_desc, rows, rope, ready, empty, idx_ptr, n_tiles, zero + 1,
                                         zero + 4, ROPE)),
                            (_tma_rows, (desc, rope_desc, rows, rope, ready, empty, idx_ptr, n_tiles, zero + 2,
                                         zero + 4, ROPE)),
                            (_tma_rows, (desc, rope_desc, rows, rope, ready, empty, idx_ptr, n_tiles, zero + 3,
                                         zero + 4, ROPE))],
                           [1, 1, 1, 1], [48, 48, 48, 48])


@gluon.jit(do_not_specialize=["readback", "n_tiles"])
def _probe_kernel(desc, kv_ptr, kv_s0, idx_ptr, out_ptr, skv, n_tiles, readback, MODE: gl.constexpr,
                  ARRIVALS: gl.constexpr):
    dt: gl.constexpr = kv_ptr.dtype.element_ty
    kv = gl.allocate_shared_memory(dt, [3, 64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
    rope = gl.allocate_shared_memory(dt, [3, 64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], dt))
    ready, empty = _ring(ARRIVALS)
    zero = gl.program_id(0) * 0  # partition arguments must be values
    if MODE == 0:
        gl.warp_specialize([(_consume, (kv, rope, ready, empty, out_ptr, n_tiles, readback)),
                            (_cp_load, (kv_ptr, kv_s0, kv, rope, ready, empty, idx_ptr, skv, n_tiles, zero))],
                           [4], [64])
    elif MODE == 1:
        gl.warp_specialize([(_consume, (kv, rope, ready, empty, out_ptr, n_tiles, readback)),
                            (_cp_load, (kv_ptr, kv_s0, kv, rope, ready, empty, idx_ptr, skv, n_tiles,
                                              zero + 1))], [4], [64])
    elif MODE == 2:
        gl.warp_specialize([(_consume, (kv, rope, ready, empty, out_ptr, n_tiles, readback)),
                            (_cp_load, (kv_ptr, kv_s0, kv, rope, ready, empty, idx_ptr, skv, n_tiles, zero)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero, zero + 1, zero + 1))],
                           [4, 1], [64, 48])
    elif MODE == 3:
        gl.warp_specialize([(_consume, (kv, rope, ready, empty, out_ptr, n_tiles, readback)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero, zero + 1,
                                               zero))], [1], [48])
    elif MODE == 4:
        gl.warp_specialize([(_consume, (kv, rope, ready, empty, out_ptr, n_tiles, readback)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero, zero + 2, zero)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero + 1, zero + 2, zero))],
                           [1, 1], [48, 48])
    else:
        gl.warp_specialize([(_consume, (kv, rope, ready, empty, out_ptr, n_tiles, readback)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero, zero + 4, zero)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero + 1, zero + 4, zero)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero + 2, zero + 4, zero)),
                            (_tma_load, (desc, kv, rope, ready, empty, idx_ptr, n_tiles, zero + 3, zero + 4, zero))],
                           [1, 1, 1, 1], [48, 48, 48, 48])


def row_desc(kv: torch.Tensor) -> TensorDescriptor:
    """The kv pool as a tensor map with a one-row box of 64 lanes."""
    return TensorDescriptor(kv, list(kv.shape), [kv.stride(0), 1], [1, 64], ROW_BOX)


def whole_row_desc(kv: torch.Tensor) -> TensorDescriptor:
    """The kv pool [slots, 576] as a tensor map [slots, 9, 64] whose box is one row's first 512 lanes."""
    assert kv.stride(1) == 1 and kv.shape[1] == 576 and kv.stride(0) % 64 == 0
    return TensorDescriptor(kv, [kv.shape[0], 9, 64], [kv.stride(0), 64, 1], [1, 8, 64], WHOLE_ROW_BOX)


def launcher(kv: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, mode: str, grid: int):
    blocks = ROW_MODES.get(mode)
    if blocks:
        kernel, args = _rows_kernel, (whole_row_desc(kv), row_desc(kv), idx, out, idx.shape[0])
        consts = dict(MODE=MODES[mode][0], ARRIVALS=MODES[mode][1], ROPE=blocks == 9, num_warps=4)
    else:
        kernel, args = _probe_kernel, (row_desc(kv), kv, kv.stride(0), idx, out, kv.shape[0], idx.shape[0])
        consts = dict(MODE=MODES[mode][0], ARRIVALS=MODES[mode][1], num_warps=4)
    compiled = kernel.warmup(*args, 1, grid=(grid,), **consts)
    if compiled.module is None and (not blocks or mode.endswith("sw")):
        swizzle_rows(compiled)

    def run(readback: int) -> None:
        kernel[(grid,)](*args, readback, **consts)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles-per-sm", type=int, default=1500)
    ap.add_argument("--skv", type=int, default=16384, help="kv pool rows (16,384: the 16K-row prefill's pool)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--grid", type=int, default=0, help="programs (default: one per multiprocessor)")
    ap.add_argument("--modes", default=",".join(MODES), help="which ways to gather, timed")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    out_dir, log = lab_output()
    dev = torch.device("cuda")
    sms = args.grid or torch.cuda.get_device_properties(dev).multi_processor_count
    torch.manual_seed(0)
    kv = torch.randn(args.skv, 576, device=dev, dtype=torch.bfloat16)

    # Correctness: a few tiles, read back
    n_chk = sms * 4
    idx = torch.randint(0, args.skv, (n_chk, 64), device=dev, dtype=torch.int32)
    idx[:, 5] = -1
    idx[:, 9] = args.skv + 3
    checks = {}
    for name in () if args.no_check else ("cp512", "hybrid", "tma1", "tma4", "row576", "row576x4", "row512"):
        lanes = checked_lanes(name)
        ref = kv[:, :lanes][idx.clamp(0, args.skv - 1).long()]
        ref[(idx < 0) | (idx >= args.skv)] = 0
        got = torch.full((n_chk, 64, lanes), float("nan"), device=dev, dtype=torch.bfloat16)
        try:
            launcher(kv, idx, got, name, sms)(1)
            torch.cuda.synchronize()
            bad = (got != ref).any(dim=-1)  # [tile, row]: a row with any lane wrong
            checks[name] = {"rows_wrong": int(bad.sum()), "rows": int(bad.numel()),
                            "first_wrong": [int(x) for x in bad.nonzero()[:3].flatten().tolist()]}
            if bad.any():
                t, r = (int(x) for x in bad.nonzero()[0])
                g, w = got[t, r].float(), ref[t, r].float()
                where = [int(i) for i in (g != w).nonzero().flatten()[:16].tolist()]
                # where does the wrong row's first 8-lane chunk sit in the reference row?
                chunk = g[:8]
                found = [(int(j)) for j in range(lanes // 8) if torch.equal(chunk, w[8 * j:8 * j + 8])]
                checks[name].update({"lanes_wrong": where, "chunk0_found_at": found})
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            checks[name] = {"error": f"{type(e).__name__}: {e}"[:800]}
        log(f"check {name}: {checks[name]}")

    # Throughput: gather only
    n_tiles = sms * args.tiles_per_sm
    idx = torch.randint(0, args.skv, (n_tiles, 64), device=dev, dtype=torch.int32)
    idx[:, ::16] = -1  # one slot in 16 invalid, as short rows would leave
    dummy = torch.empty(1, device=dev, dtype=torch.bfloat16)
    runs = {name: launcher(kv, idx, dummy, name, sms) for name in args.modes.split(",")
            if "error" not in checks.get(name, {})}
    warm_clocks(dev, 1.0)
    times = interleaved_event_times({name: (lambda run=run: run(0)) for name, run in runs.items()}, args.repeats)
    res = {}
    for name, ts in times.items():
        med = ts[len(ts) // 2]
        gathered = n_tiles * 64 * lanes_of(name) * 2
        res[name] = {"median_us": med, "min_us": ts[0], "max_us": ts[-1], "tb_per_s": gathered / med / 1e6,
                     "us_per_tile_per_sm": med / args.tiles_per_sm}
        log(f"{name}: {med:9.1f} us median ({ts[0]:.1f}-{ts[-1]:.1f}), {gathered / med / 1e6:.2f} TB/s, "
            f"{med / args.tiles_per_sm * 1e3:.0f} ns a tile per SM")
    save_results(out_dir, f"tma_probe_{sms}", checks=checks, timing=res, tiles=n_tiles, skv=args.skv, sms=sms)


if __name__ == "__main__":
    main()
