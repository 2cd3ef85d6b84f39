"""Does a gather into registers (ld.global) share the pipe that wgmma's shared-memory operands and cp.async use?

Session 29's question. Sessions 5 to 28 read the 512+64 prefill as bound by the multiprocessor's
shared-memory data pipe: per 64-slot tile the cp.async gather writes the tile (576 wavefronts of 128 B),
the scores' wgmma reads it as its A operand (576), P·V reads its 512 lanes again (512), and q and P add
272. One path not yet weighed: load each tile once from global memory into registers, run the scores
with their A operand in registers, and store only V's 512 lanes into shared memory for P·V. That trades
the scores' 576-wavefront read for a 512-wavefront store: it saves nothing if the loads' data also
passes the data banks on its way to the registers, and about a third if it does not.

The answers (docs/benchmarks.md, "Session 29"): a register gather writes and then reads the banks, and
slows wgmma beside it; cp.async's writes go beside wgmma's reads, which top out at about 0.91 wavefronts
a cycle, so the prefill (reads at 0.57 a cycle) is not bound by shared-memory bandwidth at all.

This probe answers that on the GPU. One program per multiprocessor, two partitions:

- the default warpgroup (and with ``TWO`` a second one beside it) runs scores products from shared
  memory (A = a 64 × 512 bf16 tile, B = qᵀ, as the prefill issues them), or nothing;
- a 4-warp worker gathers ``TILES`` tiles of 64 random rows × 1 KB from an L2-resident pool:
  ``G`` = 1 by cp.async into two shared-memory stages (the prefill's way), 2 by ``ld.global`` into
  registers (kept live by an xor), 3 the same with ``.cg`` (L1 bypassed), or nothing; or, ``G`` = 4,
  runs a chain of dependent steps, each a shared-memory load and a maximum across its 4 warps (the
  kind of step the softmax warpgroups' chain is made of), timing itself by %clock64: how much longer
  such a step takes while wgmma's operand reads hold the banks.

Each is timed alone and beside the other (CUDA events, median of 5). If the gather shares the pipe,
the two together take about the sum of their times alone; if not, about the longer one. Usage:
``python3 scripts/gpu/ldg_probe.py``; under ncu, one program of each gather alone:
``python3 scripts/gpu/ldg_probe.py --once``; the whole grid, cp.async beside the products: ``--full``.
"""

from __future__ import annotations

import statistics
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

POOL_ROWS = 16384  # 16 MB of 1 KB rows: L2-resident, as the targets' pool is
GATHERS = {1: "cp.async into shared memory", 2: "ld.global into registers", 3: "ld.global.cg into registers"}


@gluon.jit
def _products(kv, q, x_ptr, iters, which):
    """A warpgroup's ``iters`` scores products from shared memory, each waited for."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
    acc = gl.zeros([64, 16], gl.float32, mma)
    for i in range(iters):
        acc = warpgroup_mma(kv, q.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
    gl.store(x_ptr + (2 * gl.program_id(0) + which) * 16 + gl.arange(0, 16, gl.SliceLayout(0, mma)),
             gl.sum(acc, axis=0))


@gluon.jit
def _quarter(pool_ptr, slots, lanes, G: gl.constexpr):
    """16 pool rows into registers."""
    if G == 2:
        return gl.load(pool_ptr + slots.to(gl.int64)[:, None] * 512 + lanes)
    return gl.load(pool_ptr + slots.to(gl.int64)[:, None] * 512 + lanes, cache_modifier=".cg")


@gluon.jit
def _slots(idx_ptr, first, t, tiles, offs):
    """Tile t's slot numbers at ``offs`` (0 past the last tile): loaded a tile ahead, so no tile waits on them."""
    return gl.load(idx_ptr + (first + t) * 64 + offs, mask=(offs >= 0) & (t < tiles), other=0)


@gluon.jit
def _gathers(stages, pool_ptr, idx_ptr, y_ptr, tiles, G: gl.constexpr):
    """The worker: ``tiles`` tiles of 64 pool rows (1 KB each), by cp.async (G 1) or into registers (G 2, 3)."""
    cp: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 16 bytes a thread, 8 threads a row
    lanes = gl.arange(0, 512, gl.SliceLayout(0, cp))[None, :]
    first = gl.program_id(0) * tiles
    if G == 1:  # two stages: a tile's copies in flight while the next one's are issued
        offs = gl.arange(0, 64, gl.SliceLayout(1, cp))
        slots = _slots(idx_ptr, first, 0, tiles, offs)
        for t in range(tiles):
            nxt = _slots(idx_ptr, first, t + 1, tiles, offs)
            async_copy.async_copy_global_to_shared(stages.index(t % 2), pool_ptr + slots.to(gl.int64)[:, None] * 512
                                                   + lanes)
            async_copy.commit_group()
            async_copy.wait_group(1)
            slots = nxt
        async_copy.wait_group(0)
        last = stages.index((tiles + 1) % 2).slice(0, 16, dim=0).load(cp)  # the last tile's first 16 rows
        gl.store(y_ptr + gl.program_id(0) * 512 + lanes, gl.xor_sum(last, axis=0)[None, :])
    else:  # a tile as four 16-row quarters (32 registers each), all four loads issued before any is used
        rows = gl.arange(0, 16, gl.SliceLayout(1, cp))
        s0 = _slots(idx_ptr, first, 0, tiles, rows)
        s1 = _slots(idx_ptr, first, 0, tiles, rows + 16)
        s2 = _slots(idx_ptr, first, 0, tiles, rows + 32)
        s3 = _slots(idx_ptr, first, 0, tiles, rows + 48)
        acc = gl.zeros([16, 512], gl.int16, cp)
        for t in range(tiles):
            x0 = _quarter(pool_ptr, s0, lanes, G)
            x1 = _quarter(pool_ptr, s1, lanes, G)
            x2 = _quarter(pool_ptr, s2, lanes, G)
            x3 = _quarter(pool_ptr, s3, lanes, G)
            s0 = _slots(idx_ptr, first, t + 1, tiles, rows)
            s1 = _slots(idx_ptr, first, t + 1, tiles, rows + 16)
            s2 = _slots(idx_ptr, first, t + 1, tiles, rows + 32)
            s3 = _slots(idx_ptr, first, t + 1, tiles, rows + 48)
            acc = acc ^ x0 ^ x1 ^ x2 ^ x3
        gl.store(y_ptr + gl.program_id(0) * 512 + lanes, gl.xor_sum(acc, axis=0)[None, :])


@gluon.jit
def _chain(buf, y_ptr, z_ptr, steps):
    """The worker for G 4: ``steps`` dependent steps, each a 512-byte shared-memory load and a maximum across
    the 4 warps (through the compiler's scratch and a barrier), the kind of step the softmax's chain is made
    of. Its cycles go to ``z_ptr``."""
    row: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])  # thread t holds entry t of a row
    zeros = gl.zeros([1, 128], gl.int32, row)
    for i in range(64):  # row i's every entry names row i + 37 (mod 64): one cycle through all 64 rows
        buf.index(i).store(zeros + (i + 37) % 64)  # each thread reads back only what it wrote: no barrier needed
    cur = gl.program_id(0) * 0
    t0 = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    for k in range(steps):
        cur = gl.max(gl.max(buf.index(cur).load(row), axis=1), axis=0)
    t1 = gl.inline_asm_elementwise("mov.u64 $0, %clock64; // after $1", "=l,r", [cur], dtype=gl.int64, is_pure=False,
                                   pack=1)
    gl.store(z_ptr + gl.program_id(0), t1 - t0)
    gl.store(y_ptr + gl.program_id(0), cur.to(gl.int16))


@gluon.jit
def _probe(pool_ptr, idx_ptr, x_ptr, y_ptr, z_ptr, iters, tiles, G: gl.constexpr, TWO: gl.constexpr = False):
    dt: gl.constexpr = gl.bfloat16
    kv = gl.allocate_shared_memory(dt, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
    q = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
    zero = gl.program_id(0) * 0  # partition arguments must be values, not Python ints
    p0 = (kv, q, x_ptr, iters, zero)
    p1 = (kv, q, x_ptr, iters, zero + 1)  # with TWO, a second warpgroup's products, as the prefill's scores and P·V
    if G == 4:  # (warp_specialize takes its functions only as written: one call for each worker and TWO)
        buf = gl.allocate_shared_memory(gl.int32, [64, 1, 128], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        if TWO:
            gl.warp_specialize([(_products, p0), (_products, p1), (_chain, (buf, y_ptr, z_ptr, tiles))], [4, 4],
                               [64, 152])
        else:
            gl.warp_specialize([(_products, p0), (_chain, (buf, y_ptr, z_ptr, tiles))], [4], [152])
    else:
        stages = gl.allocate_shared_memory(gl.int16, [2, 64, 512],
                                           gl.NVMMASharedLayout.get_default_for([64, 512], gl.int16))
        gargs = (stages, pool_ptr, idx_ptr, y_ptr, tiles, G)
        if TWO:
            gl.warp_specialize([(_products, p0), (_products, p1), (_gathers, gargs)], [4, 4], [64, 152])
        else:
            gl.warp_specialize([(_products, p0), (_gathers, gargs)], [4], [152])


def _setup(programs: int, tiles: int):
    pool = torch.randint(-2**15, 2**15, (POOL_ROWS, 512), dtype=torch.int16, device="cuda")
    idx = torch.randint(0, POOL_ROWS, (programs * tiles * 64,), dtype=torch.int32, device="cuda")
    x = torch.zeros(programs * 32, device="cuda")
    y = torch.zeros(programs * 512, dtype=torch.int16, device="cuda")
    z = torch.zeros(programs, dtype=torch.int64, device="cuda")
    return pool, idx, x, y, z


def _time(programs: int, args, iters: int, tiles: int, g: int, two: bool = False, reps: int = 5) -> float:
    """Median milliseconds of one launch (after one warm-up)."""
    out = []
    for r in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        _probe[(programs,)](*args, iters, tiles, G=g, TWO=two, num_warps=4)
        b.record()
        torch.cuda.synchronize()
        if r:
            out.append(a.elapsed_time(b))
    return statistics.median(out)


def once() -> None:
    """One program of each gather alone, 64 tiles (for ncu's wavefront counts), then the products alone."""
    args = _setup(1, 64)
    for g in GATHERS:
        _probe[(1,)](*args, 0, 64, G=g, num_warps=4)
    _probe[(1,)](*args, 64, 0, G=1, num_warps=4)
    torch.cuda.synchronize()


def full() -> None:
    """The whole grid, cp.async beside one and two warpgroups' products and each alone (for ncu's cycle counts)."""
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    args = _setup(programs, 1000)
    for iters, tiles, two in ((3000, 0, False), (0, 1000, False), (3000, 1000, False), (3000, 0, True), (3000, 1000, True)):
        _probe[(programs,)](*args, iters, tiles, G=1, TWO=two, num_warps=4)
    torch.cuda.synchronize()


def main() -> None:
    if sys.argv[1:2] in (["--once"], ["--full"]):
        once() if sys.argv[1] == "--once" else full()
        return
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    args = _setup(programs, tiles)
    print(f"{torch.cuda.get_device_name(0)}; {programs} programs; {tiles} tiles of 64 rows x 1 KB each "
          f"({programs * tiles * 64 / 2**20:.1f} Mi rows, pool {POOL_ROWS} rows); ms, median of 5")
    for two, iters in ((False, tiles), (False, 3 * tiles), (True, 3 * tiles)):
        p = _time(programs, args, iters, 0, 1, two)
        who = "two warpgroups'" if two else "one warpgroup's"
        print(f"\nscores products alone, {who} {iters} a program: {p:.3f} ms")
        print(f"{'gather':<30} {'alone':>8} {'beside':>8} {'beside/(sum)':>13} {'beside/(max)':>13}")
        for g, name in GATHERS.items():
            alone = _time(programs, args, 0, tiles, g, two)
            both = _time(programs, args, iters, tiles, g, two)
            print(f"{name:<30} {alone:8.3f} {both:8.3f} {both / (alone + p):13.2f} {both / max(alone, p):13.2f}")
    print(f"\n{'a chain of shared-memory steps (G 4), 5,000 steps':<52} {'cycles a step':>14} {'launch ms':>10}")
    for two, iters in ((False, 0), (False, 6000), (True, 6000)):
        ms = _time(programs, args, iters, 5000, 4, two)
        per_step = args[4].double().median().item() / 5000
        who = "alone" if not iters else f"beside {'two warpgroups' if two else 'one warpgroup'} of products"
        print(f"{who:<52} {per_step:14.1f} {ms:10.3f}")
    pool, idx, x, y, z = args
    print(f"\ngathered bytes a launch: {programs * tiles * 64 * 1024 / 1e9:.2f} GB; checksum {int(y.sum())}")


if __name__ == "__main__":
    main()
