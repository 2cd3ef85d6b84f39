"""How fast Hopper's wgmma runs at the shapes the sparse MLA kernels use (N = 16 heads), on one GPU.

One program per multiprocessor loops over one product from shared memory (contents irrelevant),
issued as the kernels issue it, and the rate per multiprocessor comes from CUDA events:

- ``scores``: Sᵀ[64 × 16] = KV[64 × 512] · qᵀ (A and B in shared memory, 32 k-steps of m64n16k16);
- ``pv``: Oᵀ[512 × 16] += Vᵀ · Pᵀ (A the transposed tile: 8 row blocks × 4 k-steps of m64n16k16);
- ``scores_n64``: the scores with the heads padded to 64 as M and the slots as N = 64
  (A = q in shared memory, 32 k-steps of m64n64k16): four times the arithmetic, a quarter the
  instructions per FLOP;
- ``scores e4m3``: the scores over an e4m3 tile with q's two e4m3 terms (hi, lo) side by side as N = 32
  (16 k-steps of m64n32k32): what an fp8-product prefill would issue (session 28);
- ``pv e4m3``: P·V in e4m3, which wgmma takes only K-major, so from a transposed tile Vᵀ[512 × 64]
  (8 row blocks × 2 k-steps of m64n16k32);
- ``pv e4m3, A from registers``: the same product with Vᵀ loaded into wgmma's register operand straight from
  the tile as gathered (its transposed view), one 64-lane row block at a time: no transposed copy, but the
  compiler loads such an operand a byte at a time (``LDS.U8``);
- ``pv e4m3, Vᵀ ... converted``: the same with Vᵀ loaded in a blocked layout (4 slots × 16 lanes or 16 × 4 a
  thread) and ``convert_layout`` to wgmma's, which Gluon 3.6 does through a scratch buffer;
- ``e4m3 tile transposed``: the step that would make that Vᵀ, an e4m3 tile as gathered ([64 slots, 512 lanes])
  rewritten [512 lanes, 64 slots] through registers, a quarter of the lanes at a time, in three register layouts
  (``TRANSPOSE``: 4 slots × 16 lanes a thread with a warp over 64 slots × 32 lanes, so each 4-byte store
  reaches 2 rows of Vᵀ; the same with a warp over 16 slots × 128 lanes, 8 rows 16 apart a store; 1 slot × 16
  lanes a thread, single-byte stores);
- each at one program per multiprocessor and at two (two warpgroups issuing at once, as the
  warp-specialised kernel's scores and P·V partitions do).

Prints cycles per wgmma instruction (per tile for the transposes) and the implied time for the 16,384-row prefill's products
(16384 × 32 tiles over 132 multiprocessors). Usage: python3 scripts/gpu/wgmma_rate.py; under ncu, to count
one program's shared-memory wavefronts: ``python3 scripts/gpu/wgmma_rate.py --once 5:2,6,4`` (MODE[:TRANSPOSE],...).
"""

from __future__ import annotations

import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

ITERS = 4000


@gluon.jit
def _mma_loop(a, b, acc, iters):
    """``iters`` dependent wgmma of one shape, each waited for: the rate of that product alone."""
    for i in range(iters):
        acc = warpgroup_mma(a, b, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
    return acc


@gluon.jit
def _scores(x_ptr, iters, MODE: gl.constexpr, TRANSPOSE: gl.constexpr = 2):
    dt: gl.constexpr = gl.bfloat16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    kv = gl.allocate_shared_memory(dt, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
    if MODE == 0:  # scores, SS m64n16k16
        q = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        acc = gl.zeros([64, 16], gl.float32, mma)
        acc = _mma_loop(kv, q.permute((1, 0)), acc, iters)
        gl.store(x_ptr + gl.arange(0, 16, gl.SliceLayout(0, mma)), gl.sum(acc, axis=0))
    elif MODE == 1:  # pv, SS m64n16k16 with A transposed
        p = gl.allocate_shared_memory(dt, [64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], dt))
        o = gl.zeros([512, 16], gl.float32, mma)
        o = _mma_loop(kv.permute((1, 0)), p, o, iters)
        gl.store(x_ptr + gl.arange(0, 16, gl.SliceLayout(0, mma)), gl.sum(o, axis=0))
    elif MODE == 3:  # scores in e4m3, q's two terms (hi, lo) side by side: SS m64n32k32
        f8: gl.constexpr = gl.float8e4nv
        mma32: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 32, 32])
        kv8 = gl.allocate_shared_memory(f8, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], f8))
        q2 = gl.allocate_shared_memory(f8, [32, 512], gl.NVMMASharedLayout.get_default_for([32, 512], f8))
        acc = gl.zeros([64, 32], gl.float32, mma32)
        acc = _mma_loop(kv8, q2.permute((1, 0)), acc, iters)
        gl.store(x_ptr + gl.arange(0, 32, gl.SliceLayout(0, mma32)), gl.sum(acc, axis=0))
    elif MODE == 4:  # pv in e4m3: A = Vᵀ K-major (the slots contiguous: a transposed tile), SS m64n16k32
        f8: gl.constexpr = gl.float8e4nv
        mma8: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 32])
        vt = gl.allocate_shared_memory(f8, [512, 64], gl.NVMMASharedLayout.get_default_for([512, 64], f8))
        pt = gl.allocate_shared_memory(f8, [16, 64], gl.NVMMASharedLayout.get_default_for([16, 64], f8))
        o = gl.zeros([512, 16], gl.float32, mma8)
        o = _mma_loop(vt, pt.permute((1, 0)), o, iters)
        gl.store(x_ptr + gl.arange(0, 16, gl.SliceLayout(0, mma8)), gl.sum(o, axis=0))
    elif MODE == 6 or MODE == 7:  # pv in e4m3 with A = Vᵀ in registers, from the tile as gathered
        f8: gl.constexpr = gl.float8e4nv
        mma8: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 32])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma8, k_width=4)
        if TRANSPOSE == 2:  # MODE 7: 4 slots x 16 lanes a thread, 16-byte loads
            rows: gl.constexpr = gl.BlockedLayout([4, 16], [16, 2], [1, 4], [1, 0])
        else:  # MODE 7: 16 slots x 4 lanes a thread, 4-byte loads
            rows: gl.constexpr = gl.BlockedLayout([16, 4], [2, 16], [1, 4], [1, 0])
        tile = gl.allocate_shared_memory(f8, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], f8))
        pt = gl.allocate_shared_memory(f8, [16, 64], gl.NVMMASharedLayout.get_default_for([16, 64], f8))
        o = gl.zeros([64, 16], gl.float32, mma8)
        for i in range(iters):
            for m in gl.static_range(8):  # 8 row blocks of 64 lanes, each its own 64 x 64 A in registers
                if MODE == 6:  # straight from the tile's transposed view
                    a = tile.slice(64 * m, 64, dim=1).permute((1, 0)).load(a_l)
                else:  # a blocked load converted to wgmma's layout (through the compiler's scratch)
                    a = gl.convert_layout(gl.permute(tile.slice(64 * m, 64, dim=1).load(rows), (1, 0)), a_l)
                o = warpgroup_mma(a, pt.permute((1, 0)), o, is_async=True)
                o = warpgroup_mma_wait(0, deps=(o,))
        gl.store(x_ptr + gl.arange(0, 16, gl.SliceLayout(0, mma8)), gl.sum(o, axis=0))
    elif MODE == 5:  # an e4m3 tile as gathered ([slots, lanes]) rewritten transposed ([lanes, slots]) for MODE 4
        f8: gl.constexpr = gl.float8e4nv
        if TRANSPOSE == 2:  # 4 slots x 16 lanes a thread, a warp all 64 slots of 32 lanes: 2 rows of vt a store
            rows: gl.constexpr = gl.BlockedLayout([4, 16], [16, 2], [1, 4], [1, 0])
        elif TRANSPOSE == 1:  # 4 slots x 16 lanes a thread, a warp 16 slots of 128 lanes: 8 rows of vt a store
            rows: gl.constexpr = gl.BlockedLayout([4, 16], [4, 8], [4, 1], [1, 0])
        else:  # 1 slot x 16 lanes a thread: single-byte stores
            rows: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        src = gl.allocate_shared_memory(f8, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], f8))
        vt = gl.allocate_shared_memory(f8, [512, 64], gl.NVMMASharedLayout.get_default_for([512, 64], f8))
        for i in range(iters):
            for h in gl.static_range(4):  # a quarter of the lanes at a time, as registers allow
                x = src.slice(128 * h, 128, dim=1).load(rows)
                vt.slice(128 * h, 128, dim=0).store(gl.permute(x, (1, 0)))
            gl.thread_barrier()
        y = vt.slice(0, 16, dim=0).load(rows)
        gl.store(x_ptr + gl.arange(0, 64, gl.SliceLayout(0, rows)), gl.sum(y.to(gl.float32), axis=0))
    else:  # scores with heads padded to 64 as M, slots as N = 64
        q64 = gl.allocate_shared_memory(dt, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        acc = gl.zeros([64, 64], gl.float32, mma64)
        acc = _mma_loop(q64, kv.permute((1, 0)), acc, iters)
        gl.store(x_ptr + gl.arange(0, 64, gl.SliceLayout(0, mma64)), gl.sum(acc, axis=0))


def once(specs: list[str]) -> None:
    """One program of each MODE[:TRANSPOSE], 10 iterations: the launches to count under ncu (S28-1 to S28-3)."""
    x = torch.zeros(64, device="cuda")
    for spec in specs:
        mode, _, t = spec.partition(":")
        _scores[(1,)](x, 10, MODE=int(mode), TRANSPOSE=int(t or 2), num_warps=4)
    torch.cuda.synchronize()


def main() -> None:
    if sys.argv[1:2] == ["--once"]:
        return once(sys.argv[2].split(","))
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    x = torch.zeros(64, device=dev)
    clock_ghz = 1.98  # the H200's boost clock: cycles below are nanoseconds times this
    # (name, instructions a loop iteration, constexprs): each iteration is one 64-slot tile's product over 512 lanes
    rows = [("scores m64n16k16 (SS)", 32, {"MODE": 0}), ("pv m64n16k16 (SS, A transposed)", 32, {"MODE": 1}),
            ("scores as m64n64k16 (heads padded)", 32, {"MODE": 2}),
            ("scores e4m3 m64n32k32 (q hi|lo)", 16, {"MODE": 3}), ("pv e4m3 m64n16k32 (A = V K-major)", 16, {"MODE": 4}),
            ("pv e4m3 m64n16k32 (A = Vᵀ in registers)", 16, {"MODE": 6}),
            ("pv e4m3, Vᵀ 4x16 a thread, converted", 16, {"MODE": 7, "TRANSPOSE": 2}),
            ("pv e4m3, Vᵀ 16x4 a thread, converted", 16, {"MODE": 7, "TRANSPOSE": 1}),
            ("e4m3 tile transposed, 4x16, warp 64x32", 1, {"MODE": 5, "TRANSPOSE": 2}),
            ("e4m3 tile transposed, 4x16, warp 16x128", 1, {"MODE": 5, "TRANSPOSE": 1}),
            ("e4m3 tile transposed, 1x16, warp 4x128", 1, {"MODE": 5, "TRANSPOSE": 0})]
    for name, per_iter, consts in rows:
        for programs in (sms, 2 * sms):  # two per SM fit for all but the padded scores (128 KB)
            _scores[(programs,)](x, ITERS, num_warps=4, **consts)  # compile with the timed call's specialisation
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            _scores[(programs,)](x, ITERS, num_warps=4, **consts)
            b.record()
            torch.cuda.synchronize()
            ms = a.elapsed_time(b)
            per_sm = programs / sms
            ns_tile = ms * 1e6 / (ITERS * per_sm)
            ns = ns_tile / per_iter
            tiles_ms = 16384 * 32 / sms * ns_tile * 1e-6
            what = "wgmma" if per_iter > 1 else "tile"
            print(f"{name:38} {programs:4} programs: {ns:7.2f} ns per {what} per SM "
                  f"(~{ns * clock_ghz:6.1f} clk at {clock_ghz:.2f} GHz); 16,384-row prefill: "
                  f"{tiles_ms:5.2f} ms of this step", flush=True)


if __name__ == "__main__":
    main()
