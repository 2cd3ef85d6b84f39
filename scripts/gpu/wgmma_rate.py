"""How fast Hopper's wgmma runs at the shapes the sparse MLA kernels use (N = 16 heads), on one GPU.

One program per multiprocessor loops over one product from shared memory (contents irrelevant),
issued as the kernels issue it, and the rate per multiprocessor comes from CUDA events:

- ``scores``: Sᵀ[64 × 16] = KV[64 × 512] · qᵀ (A and B in shared memory, 32 k-steps of m64n16k16);
- ``pv``: Oᵀ[512 × 16] += Vᵀ · Pᵀ (A the transposed tile: 8 row blocks × 4 k-steps of m64n16k16);
- ``scores_n64``: the scores with the heads padded to 64 as M and the slots as N = 64
  (A = q in shared memory, 32 k-steps of m64n64k16): four times the arithmetic, a quarter the
  instructions per FLOP;
- each at one program per multiprocessor and at two (two warpgroups issuing at once, as the
  warp-specialised kernel's scores and P·V partitions do).

Prints cycles per wgmma instruction and the implied time for the 16,384-row prefill's products
(16384 × 32 tiles over 132 multiprocessors). Usage: python3 scripts/gpu/wgmma_rate.py
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

ITERS = 4000


@gluon.jit
def _scores(x_ptr, iters, MODE: gl.constexpr):
    dt: gl.constexpr = gl.bfloat16
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
    mma64: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    kv = gl.allocate_shared_memory(dt, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
    if MODE == 0:  # scores, SS m64n16k16
        q = gl.allocate_shared_memory(dt, [16, 512], gl.NVMMASharedLayout.get_default_for([16, 512], dt))
        acc = gl.zeros([64, 16], gl.float32, mma)
        for i in range(iters):
            acc = warpgroup_mma(kv, q.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
        gl.store(x_ptr + gl.arange(0, 16, gl.SliceLayout(0, mma)), gl.sum(acc, axis=0))
    elif MODE == 1:  # pv, SS m64n16k16 with A transposed
        p = gl.allocate_shared_memory(dt, [64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], dt))
        o = gl.zeros([512, 16], gl.float32, mma)
        for i in range(iters):
            o = warpgroup_mma(kv.permute((1, 0)), p, o, is_async=True)
            o = warpgroup_mma_wait(0, deps=(o,))
        gl.store(x_ptr + gl.arange(0, 16, gl.SliceLayout(0, mma)), gl.sum(o, axis=0))
    else:  # scores with heads padded to 64 as M, slots as N = 64
        q64 = gl.allocate_shared_memory(dt, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], dt))
        acc = gl.zeros([64, 64], gl.float32, mma64)
        for i in range(iters):
            acc = warpgroup_mma(q64, kv.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
        gl.store(x_ptr + gl.arange(0, 64, gl.SliceLayout(0, mma64)), gl.sum(acc, axis=0))


def main() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    x = torch.zeros(64, device=dev)
    clock_ghz = 1.98  # the H200's boost clock: cycles below are nanoseconds times this
    rows = {0: ("scores m64n16k16 (SS)", 32), 1: ("pv m64n16k16 (SS, A transposed)", 32),
            2: ("scores as m64n64k16 (heads padded)", 32)}
    for mode, (name, per_iter) in rows.items():
        for programs in (sms, 2 * sms):  # two per SM fit for the first two (80 / 66 KB), not the third (128 KB)
            _scores[(programs,)](x, ITERS, MODE=mode, num_warps=4)  # compile with the timed call's specialisation
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            _scores[(programs,)](x, ITERS, MODE=mode, num_warps=4)
            b.record()
            torch.cuda.synchronize()
            ms = a.elapsed_time(b)
            per_sm = programs / sms
            instr = ITERS * per_iter * per_sm
            ns = ms * 1e6 / instr
            tiles_ms = 16384 * 32 / sms * per_iter * ns * 1e-6  # per_iter instructions per tile's product
            print(f"{name:38} {programs:4} programs: {ns:6.2f} ns per wgmma per SM "
                  f"(~{ns * clock_ghz:5.1f} clk at {clock_ghz:.2f} GHz); 16,384-row prefill: "
                  f"{tiles_ms:5.2f} ms per product of this kind", flush=True)


if __name__ == "__main__":
    main()
