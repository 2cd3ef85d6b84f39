"""How fast an SM turns fp8 bytes into 16-bit floats, by each conversion an fp8 pool's tile could take.

The warp-specialised prefill converts each fp8 tile (36,864 values at 512+64) on its softmax warpgroups
(session 25). Whether that costs instructions or latency decides what to try next, so this times each
conversion alone: a Triton kernel whose threads hold 16 independent 32-bit words (four fp8 bytes each) and
convert them over and over, each result (its two output words xor-ed) the next input. Many warps on every
SM make it a throughput figure: values converted per SM per clock.

Modes: ``fp8_ptx``'s four conversions as the kernels use them (e4m3/e5m2 to bf16/f16; to bf16 through f16
and f32), and an integer one for e4m3 to bf16 (``INT_E4M3_BF16``: the byte's exponent and mantissa shifted
into bf16's fields, times 2^120 in one bf16x2 multiply, the sign or-ed back, NaN restored), with and without
its NaN step. ``xor`` alone is the loop's own cost.

``--check`` first converts all 256 bytes through each mode's PTX (as the kernels call it: four bytes in,
two words out) and compares the bits with torch's own conversion (NaN as NaN).

    python3 scripts/gpu/cvt_rate.py [--check] [--iters 4096]

Writes $OUT/cvt_rate.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import fp8_ptx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

_HALF = ("prmt.b32 p{i}, $2, 0, {sel};\n"  # bytes 2i, 2i + 1 into the high byte of each 16-bit half
         "shr.b32 e{i}, p{i}, 4;\nand.b32 e{i}, e{i}, 0x07F007F0;\n"  # exponent and mantissa into bf16's fields
         "mul.rn.bf16x2 v{i}, e{i}, c;\n"  # times 2^120: e4m3's bias (7) to bf16's (127), subnormals included
         "and.b32 p{i}, p{i}, 0x80008000;\nor.b32 v{i}, v{i}, p{i};\n")  # the sign
_NAN = ("add.u32 n{i}, e{i}, 0x00100010;\nand.b32 n{i}, n{i}, 0x08000800;\n"  # bit 11 of a half: byte 0x7f/0xff
        "shr.b32 n{i}, n{i}, 1;\nmul.lo.u32 n{i}, n{i}, 15;\nor.b32 v{i}, v{i}, n{i};\n")  # 480 -> all-ones exp.


def int_e4m3_bf16(nan: bool = True) -> str:
    """e4m3fn to bf16 without a ``cvt``: four bytes ($2) in, two bf16x2 words ($0, $1) out."""
    body = "".join((_HALF + (_NAN if nan else "")).format(i=i, sel=sel) for i, sel in ((0, "0x1404"), (1, "0x3424")))
    return ("{\n.reg .b32 c, p0, p1, e0, e1, v0, v1, n0, n1;\nmov.b32 c, 0x7B807B80;\n" + body
            + "mov.b32 $0, v0;\nmov.b32 $1, v1;\n}")


MODES = {  # name: (PTX taking $2, writing $0, $1; the pool's dtype; the output dtype)
    "e4m3_bf16": (fp8_ptx.PTX_E4M3_BF16.value, torch.float8_e4m3fn, torch.bfloat16),
    "e5m2_bf16": (fp8_ptx.PTX_E5M2_BF16.value, torch.float8_e5m2, torch.bfloat16),
    "e4m3_f16": (fp8_ptx.PTX_E4M3_F16.value, torch.float8_e4m3fn, torch.float16),
    "e5m2_f16": (fp8_ptx.PTX_E5M2_F16.value, torch.float8_e5m2, torch.float16),
    "int_e4m3_bf16": (int_e4m3_bf16(True), torch.float8_e4m3fn, torch.bfloat16),
    "int_e4m3_bf16_nonan": (int_e4m3_bf16(False), torch.float8_e4m3fn, torch.bfloat16),
}


def as_loop_step(ptx: str) -> str:
    """A mode's PTX as one step of the timing loop: a word in ($1), the xor of its two output words out ($0)."""
    body = ptx.replace("$1", "o1").replace("$0", "o0").replace("$2", "$1")
    return "{\n.reg .b32 o0, o1;\n" + body + "\nxor.b32 $0, o0, o1;\n}"


@triton.jit
def _rate_kernel(x_ptr, out_ptr, iters, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in range(iters):
        x = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out_ptr + offs, x)


@triton.jit
def _convert_kernel(src_ptr, dst_ptr, ASM: tl.constexpr, F16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    b = tl.load(src_ptr + offs)
    if F16:
        y = tl.inline_asm_elementwise(ASM, "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)
    else:
        y = tl.inline_asm_elementwise(ASM, "=r,=r,r", [b], dtype=tl.bfloat16, is_pure=False, pack=4)
    tl.store(dst_ptr + offs, y)


def check(name: str, dev: torch.device) -> dict:
    ptx, pool, out_dtype = MODES[name]
    src = torch.arange(256, dtype=torch.uint8, device=dev)
    got = torch.empty(256, dtype=out_dtype, device=dev)
    _convert_kernel[(1,)](src, got, ASM=ptx, F16=out_dtype == torch.float16, BLOCK=256)
    want = src.view(pool).to(out_dtype)
    nan = want.isnan()
    same = (got.view(torch.int16) == want.view(torch.int16)) | (nan & got.isnan())
    bad = [f"0x{i:02x}: {float(got[i])} not {float(want[i])}" for i in (~same).nonzero().flatten().tolist()]
    return {"mode": name, "right": int(same.sum()), "of": 256, "bad": bad[:8]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    opt = ap.parse_args()
    out, log = lab_output()
    dev = torch.device("cuda")
    checks = []
    if opt.check:
        for name in MODES:
            checks.append(check(name, dev))
            log(f"check {name:20} {checks[-1]['right']}/256 bytes right {checks[-1]['bad']}")
    warm_clocks(dev, 1.0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    warps, per_thread = 8, 16
    block = 32 * warps * per_thread
    grid = sms * 4  # four programs an SM (8 warps each)
    x = torch.randint(0, 2**31 - 1, (grid * block,), dtype=torch.int32, device=dev)
    y = torch.empty_like(x)
    steps = {"xor": "xor.b32 $0, $1, 0x5a5a5a5a;"} | {n: as_loop_step(m[0]) for n, m in MODES.items()}
    rec = []
    for name, asm in steps.items():
        _rate_kernel[(grid,)](x, y, 2, ASM=asm, BLOCK=block, num_warps=warps)  # compile, warm
        times = []
        for _ in range(opt.repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            _rate_kernel[(grid,)](x, y, opt.iters, ASM=asm, BLOCK=block, num_warps=warps)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e6)  # ns
        ns = sorted(times)[len(times) // 2]
        values = 4 * grid * block * opt.iters  # four fp8 values a word, every step
        rate = values / ns / sms  # values a ns per SM
        rec.append({"mode": name, "median_ns": ns, "values_per_ns_per_sm": rate,
                    "tile_576_ns": 64 * 576 / rate if name != "xor" else None})
        log(f"{name:20} {ns / 1e6:8.3f} ms  {rate:7.2f} values/ns/SM"
            + (f"  a 64 x 576 tile: {64 * 576 / rate:7.1f} ns of one SM" if name != "xor" else ""))
    save_results(out, "cvt_rate", results=rec, checks=checks, iters=opt.iters, grid=grid, block=block)


if __name__ == "__main__":
    main()
