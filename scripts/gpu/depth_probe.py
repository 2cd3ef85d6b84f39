"""Does an SM gather kv rows faster with more bytes in flight? (session 22)

The 512+64 prefill gathers at about 7.2 TB/s (38.6 GB in 5.33 ms) while it computes; a ring of
three 64-row stages with nothing computing gathers at 8.5-8.8 TB/s (``tma_probe.py``'s ``cp576``,
S14-2, S18-1). Shared memory is full, so the prefill cannot hold more stages, and while a stage is
being scored and multiplied it is not gathering: about two of its three stages are in flight.
If the rate follows the bytes in flight, more of them (in registers: a warpgroup that loads rows
with plain loads and stores them into a stage once it is free) would gather faster. If it does
not, the gathers are capped elsewhere (the path between the SMs and L2), and only fewer bytes
(fp8 kv) can make them faster.

Two questions, side by side in one run, one program per SM, nothing computing:
- ``ring{R}x{D}``: R-row stages (576 lanes: 512 in the wgmma layout, 64 rope lanes in their own
  buffer, by the prefill's cp.async gather, ``gluon_sm90_parts._gather``), D of them in the ring. Bytes
  in flight are at most R x D x 1,152. 64x1, 64x2, 64x3 and 32x2 to 32x6 trace rate against
  bytes in flight.
- ``ring64x{D}+reg{F}``: the same ring, and beside it a 4-warp partition that gathers more rows
  (512 lanes, the same random slots of other tiles) with plain 16-byte loads into registers,
  64 KB a batch, and folds them into an xor it stores at the end. F: its tiles as a fraction of
  the ring's. If the ring alone is at a cap, the extra bytes cost their share of time; if not,
  they come nearly free. ``reg`` alone is that partition with no ring.
- ``ring64x{D}+pf{N}``: the ring, and after each tile's copies the next tile's lanes [0, N) asked
  of L1 (``prefetch.global.L1``): can L1 hold bytes in flight for the ring's copies?

On an H200 (S22-1, S22-2, docs/benchmarks.md "Session 22"): one 64-row stage in flight 56-58
bytes a ns per SM, two or three 65-67, 32-row stages 57-59 at any depth, a ring and the register
partition together 67-70; the L1 prefetch level or slower. The prefill gathers at 54.9.

Every mode moves the same tiles of 64 random slots (one in 16 -1, zero-filled) of a pool of
16,384 rows, as ``tma_probe.py`` does. The register partition is checked first: its xor equals
torch's over the same rows. The ring's copies are the prefill's own ``_gather``, whose landing
``tma_probe.py``'s ``cp512`` check reads back; here each mode only runs once before it is timed.

Usage (device machine, repository root):
    python3 scripts/gpu/depth_probe.py [--tiles-per-sm N] [--repeats N] [--modes ring64x3,reg,...]
Writes $OUT/depth_probe.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels.gluon_sm90_parts import _gather  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import interleaved_event_times, lab_output, save_results, warm_clocks  # noqa: E402

LANES = 576
REG_LANES = 512
REG_CHUNK = 128  # lanes a thread block of the register partition loads per load: 4 loads a batch


@gluon.jit
def _consume(ready, empty, n_tiles, DEPTH: gl.constexpr):
    """Take each stage back as soon as it has landed."""
    g = 0
    for _t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        st = g % DEPTH
        mbarrier.wait(ready.index(st), (g // DEPTH) & 1)
        mbarrier.arrive(empty.index(st))
        g += 1


@gluon.jit
def _prefetch_l1(kv_ptr, kv_s0, slots, skv, PF: gl.constexpr, pf: gl.constexpr):
    """Ask L1 for lanes [0, PF) of the tile's rows, a 128-byte line per thread: no register, no wait."""
    LPR: gl.constexpr = PF // 64  # lines a row
    slot = slots.to(gl.int64)
    ok = (slot >= 0) & (slot < skv)
    line = gl.arange(0, LPR, gl.SliceLayout(0, pf))
    p = kv_ptr + (gl.where(ok, slot, 0) * kv_s0)[:, None] + (line * 64)[None, :]
    gl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [p], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _cp_load(kv_ptr, kv_s0, kv, rope, ready, empty, idx_ptr, skv, n_tiles, DEPTH: gl.constexpr,
             ROWS: gl.constexpr, PF: gl.constexpr):
    """Four warps: per tile, the prefill's cp.async gather of ROWS rows x 576 lanes into the next free stage.

    PF > 0: after a tile's copies, the next tile's lanes [0, PF) are asked of L1 (``prefetch.global.L1``),
    so that L1 would hold bytes in flight the ring has no room for. The copies stay cp.async.cg:
    Triton 3.6 emits .cg for 16-byte copies whatever the cache modifier (checked in the PTX), so
    this asks whether they find the prefetched lines at all. The next tile's slot numbers are
    loaded before this tile's copies, so the prefetch does not wait behind them.
    """
    cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    LPR: gl.constexpr = PF // 64 if PF > 0 else 1
    pf: gl.constexpr = gl.BlockedLayout([1, 1], [32 // LPR, LPR], [4, 1], [1, 0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    g = 0
    for t in range(pid, n_tiles, nprog):
        st = g % DEPTH
        mbarrier.wait(empty.index(st), ((g // DEPTH) & 1) ^ 1)
        slots = gl.load(idx_ptr + t.to(gl.int64) * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, cp)))
        if PF > 0:  # the next tile's slot numbers, before this tile's copies (a load waits behind them)
            tn = gl.minimum(t + nprog, n_tiles - 1)
            nslots = gl.load(idx_ptr + tn.to(gl.int64) * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, pf)))
        _gather(kv_ptr, kv_s0, slots, skv, kv.index(st), 0, 512, cp)
        _gather(kv_ptr, kv_s0, slots, skv, rope.index(st), 512, 64, cp)
        async_copy.mbarrier_arrive(ready.index(st), increment_count=False)
        if PF > 0:
            _prefetch_l1(kv_ptr, kv_s0, nslots, skv, PF, pf)
        g += 1


@gluon.jit
def _reg_load(kvi_ptr, kv_s0, ridx_ptr, skv, n_reg, xor_ptr):
    """Four warps: per tile, 64 rows x 512 lanes by plain 16-byte loads (4 of 128 lanes a row), xor-folded."""
    lay: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, 64, gl.SliceLayout(1, lay))
    cols = gl.arange(0, 128, gl.SliceLayout(0, lay))
    acc = gl.zeros([64, 128], gl.int16, lay)
    for t in range(gl.program_id(0), n_reg, gl.num_programs(0)):
        slot = gl.load(ridx_ptr + t.to(gl.int64) * 64 + rows).to(gl.int64)
        ok = (slot >= 0) & (slot < skv)
        valid = ok[:, None]
        p = kvi_ptr + (gl.where(ok, slot, 0) * kv_s0)[:, None] + cols[None, :]
        a = gl.load(p, mask=valid, other=0, cache_modifier=".cg")
        b = gl.load(p + 128, mask=valid, other=0, cache_modifier=".cg")
        c = gl.load(p + 256, mask=valid, other=0, cache_modifier=".cg")
        d = gl.load(p + 384, mask=valid, other=0, cache_modifier=".cg")
        acc = acc ^ a ^ b ^ c ^ d
    gl.store(xor_ptr + gl.program_id(0).to(gl.int64) * 64 * 128 + rows[:, None] * 128 + cols[None, :], acc)


@gluon.jit
def _idle():
    pass


@gluon.jit(do_not_specialize=["n_tiles", "n_reg"])
def _depth_kernel(kv_ptr, kvi_ptr, kv_s0, idx_ptr, ridx_ptr, xor_ptr, skv, n_tiles, n_reg,
                  DEPTH: gl.constexpr, ROWS: gl.constexpr, REG: gl.constexpr, REG_REGS: gl.constexpr,
                  PF: gl.constexpr = 0):
    dt: gl.constexpr = kv_ptr.dtype.element_ty
    kv = gl.allocate_shared_memory(dt, [DEPTH, ROWS, 512], gl.NVMMASharedLayout.get_default_for([ROWS, 512], dt))
    rope = gl.allocate_shared_memory(dt, [DEPTH, ROWS, 64], gl.NVMMASharedLayout.get_default_for([ROWS, 64], dt))
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], bar_l)
    for i in gl.static_range(DEPTH):
        mbarrier.init(ready.index(i), count=128)  # one cp.async arrival per loader thread
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    if REG:
        gl.warp_specialize([(_consume, (ready, empty, n_tiles, DEPTH)),
                            (_cp_load, (kv_ptr, kv_s0, kv, rope, ready, empty, idx_ptr, skv, n_tiles, DEPTH, ROWS, PF)),
                            (_reg_load, (kvi_ptr, kv_s0, ridx_ptr, skv, n_reg, xor_ptr))],
                           [4, 4], [64, REG_REGS])
    else:
        gl.warp_specialize([(_consume, (ready, empty, n_tiles, DEPTH)),
                            (_cp_load, (kv_ptr, kv_s0, kv, rope, ready, empty, idx_ptr, skv, n_tiles, DEPTH, ROWS,
                                        PF))],
                           [4], [64])


def parse_mode(mode: str) -> dict:
    """``ring64x3``, ``ring32x6``, ``ring64x3+reg0.5``, ``ring64x1+pf128`` or ``reg``.

    Stage rows, ring depth, the register partition's tiles as a fraction of the ring's, lanes prefetched into L1.
    """
    ring, *extras = mode.split("+")
    if ring == "reg" and not extras:
        return {"rows": 64, "depth": 1, "ring": False, "reg_frac": 1.0, "pf": 0}
    if not ring.startswith("ring") or "x" not in ring:
        raise ValueError(f"mode {mode!r}: expected ringRxD[+regF][+pfN] or reg")
    rows, depth = (int(x) for x in ring[4:].split("x"))
    if rows not in (32, 64) or not 1 <= depth <= 6 or rows * depth > 192:
        raise ValueError(f"mode {mode!r}: rows 32 or 64, depth 1-6, at most 192 rows in the ring (shared memory)")
    got = {"rows": rows, "depth": depth, "ring": True, "reg_frac": 0.0, "pf": 0}
    for extra in extras:
        if extra.startswith("reg"):
            got["reg_frac"] = float(extra[3:])
        elif extra.startswith("pf") and extra[2:] in ("64", "128", "256"):
            got["pf"] = int(extra[2:])
        else:
            raise ValueError(f"mode {mode!r}: {extra!r} is neither regF nor pf64/pf128/pf256")
    return got


MODES = ["ring64x1", "ring64x2", "ring64x3", "ring32x2", "ring32x4", "ring32x6", "reg",
         "ring64x2+reg0.5", "ring64x3+reg0.25", "ring64x3+reg0.5",
         "ring64x1+pf64", "ring64x1+pf128", "ring64x1+pf256", "ring64x2+pf128", "ring64x3+pf128"]


def launcher(kv: torch.Tensor, tiles64: torch.Tensor, ridx_all: torch.Tensor, xor: torch.Tensor, mode: str,
             sms: int, reg_regs: int):
    """(run, bytes the mode moves, ring tiles, register tiles) for ``mode`` over tiles64 ([n, 64] slots)."""
    m = parse_mode(mode)
    rows = m["rows"]
    n_ring = 0
    if m["ring"]:
        idx = tiles64.reshape(-1, rows)  # the same slots, cut into ROWS-row tiles
        n_ring = idx.shape[0]
    else:
        idx = tiles64
    n_reg = int(round(tiles64.shape[0] * m["reg_frac"])) if m["reg_frac"] else 0
    ridx = ridx_all[:max(n_reg, 1)]
    reg = n_reg > 0
    kvi = kv.view(torch.int16)
    args = (kv, kvi, kv.stride(0), idx, ridx, xor, kv.shape[0], n_ring, n_reg)
    consts = dict(DEPTH=m["depth"], ROWS=rows, REG=reg, REG_REGS=reg_regs, PF=m["pf"], num_warps=4)
    _depth_kernel.warmup(*args, grid=(sms,), **consts)
    moved = n_ring * rows * LANES * 2 + n_reg * 64 * REG_LANES * 2

    def run() -> None:
        _depth_kernel[(sms,)](*args, **consts)

    return run, moved, n_ring, n_reg


def reg_xor_reference(kv: torch.Tensor, ridx: torch.Tensor, sms: int) -> torch.Tensor:
    """What ``_reg_load`` stores: per program p, the xor over its tiles t = p, p + sms, ... of rows x 4 chunks."""
    skv = kv.shape[0]
    kvi = kv.view(torch.int16)[:, :REG_LANES]
    valid = (ridx >= 0) & (ridx < skv)
    rows = kvi[ridx.clamp(0, skv - 1).long()]  # [n, 64, 512]
    rows[~valid] = 0
    folded = rows[..., 0:128] ^ rows[..., 128:256] ^ rows[..., 256:384] ^ rows[..., 384:512]  # [n, 64, 128]
    out = torch.zeros(sms, 64, 128, dtype=torch.int16, device=kv.device)
    for p in range(sms):
        part = folded[p::sms]
        acc = torch.zeros(64, 128, dtype=torch.int16, device=kv.device)
        for t in range(part.shape[0]):
            acc ^= part[t]
        out[p] = acc
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles-per-sm", type=int, default=1500, help="64-row tiles per SM the ring gathers")
    ap.add_argument("--skv", type=int, default=16384, help="kv pool rows (16,384: the 16K-row prefill's pool)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--reg-regs", type=int, default=232, help="registers a thread of the register partition")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    modes = args.modes.split(",")
    for mode in modes:
        parse_mode(mode)  # bad names fail before anything runs
    out_dir, log = lab_output()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    torch.manual_seed(0)
    kv = torch.randn(args.skv, LANES, device=dev, dtype=torch.bfloat16)
    xor = torch.zeros(sms, 64, 128, device=dev, dtype=torch.int16)

    # Check: the register partition's xor against torch's, on a few tiles with -1 and past-the-pool slots.
    n_chk = sms * 3
    ridx = torch.randint(0, args.skv, (n_chk, 64), device=dev, dtype=torch.int32)
    ridx[:, 5] = -1
    ridx[:, 9] = args.skv + 3
    run, _, _, _ = launcher(kv, ridx, ridx, xor, "reg", sms, args.reg_regs)
    xor.zero_()
    run()
    torch.cuda.synchronize()
    want = reg_xor_reference(kv, ridx, sms)
    checks = {"reg_xor_equal": bool(torch.equal(xor, want))}
    log(f"check: register partition's xor {'equals' if checks['reg_xor_equal'] else 'DIFFERS FROM'} torch's")

    n_tiles = sms * args.tiles_per_sm
    tiles = torch.randint(0, args.skv, (n_tiles, 64), device=dev, dtype=torch.int32)
    tiles[:, ::16] = -1
    ridx = torch.randint(0, args.skv, (n_tiles, 64), device=dev, dtype=torch.int32)
    ridx[:, ::16] = -1
    runs = {}
    for mode in modes:
        try:
            runs[mode] = launcher(kv, tiles, ridx, xor, mode, sms, args.reg_regs)
            runs[mode][0]()  # every ring byte must land, or this never returns
            torch.cuda.synchronize()
            log(f"{mode}: compiled and ran once")
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            checks[mode] = f"{type(e).__name__}: {e}"[:800]
            log(f"{mode}: {checks[mode]}")
            runs.pop(mode, None)
    warm_clocks(dev, 1.0)
    times = interleaved_event_times({mode: run for mode, (run, *_rest) in runs.items()}, args.repeats)
    res = {}
    for mode, ts in times.items():
        med = ts[len(ts) // 2]
        _, moved, n_ring, n_reg = runs[mode]
        m = parse_mode(mode)
        in_flight = m["rows"] * m["depth"] * LANES * 2 if m["ring"] else 0
        res[mode] = {"median_us": med, "min_us": ts[0], "max_us": ts[-1], "bytes": moved, "ring_tiles": n_ring,
                     "reg_tiles": n_reg, "ring_bytes_in_flight_max": in_flight, "tb_per_s": moved / med / 1e6,
                     "bytes_per_ns_per_sm": moved / med / 1e3 / sms}
        log(f"{mode:>18}: {med:8.1f} us ({ts[0]:.1f}-{ts[-1]:.1f}), {moved / 1e9:6.2f} GB, "
            f"{moved / med / 1e6:5.2f} TB/s, {moved / med / 1e3 / sms:5.1f} B/ns per SM, ring up to "
            f"{in_flight / 1024:.0f} KB in flight")
    save_results(out_dir, "depth_probe", checks=checks, timing=res, tiles_per_sm=args.tiles_per_sm, skv=args.skv,
                 sms=sms, reg_regs=args.reg_regs)


if __name__ == "__main__":
    main()
