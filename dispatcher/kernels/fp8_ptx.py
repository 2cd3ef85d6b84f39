"""fp8 kv tiles to q's dtype in PTX, four bytes at a time: how the Triton tile loop and the Hopper kernels
(``gluon_sm90_parts._convert_tile``, ``gluon_sm90_ws_fp8``) read an fp8 pool (e4m3fn, e5m2) on NVIDIA GPUs.

Every conversion here is exact (every fp8 value is a bf16 and an fp16 value), NaN and inf included: the kernels
compute on the pool's own values, unscaled. e4m3 goes through ``cvt.rn.f16x2.e4m3x2`` (sm_89 and later); e5m2 is
fp16 cut to its top byte, so a byte permute makes it fp16; bf16 comes from fp16 through fp32.

Why inline PTX rather than ``tl.load(...).to(tl.bfloat16)``: Triton sinks that conversion into each ``tl.dot``
operand layout the tile feeds, so a tile used by the scores (transposed) and by P·V is converted twice, and an
8-bit load with two converted uses is not pipelined: it is read synchronously, then through plain shared loads.
An inline-asm conversion with side effects (``is_pure=False``) cannot be duplicated or moved, so the tile is
converted once, in the layout it was loaded in, and the loads stay asynchronous like a 16-bit pool's. ``cvt``
rather than integer ops (the e4m3 bits placed in bf16's fields, times 2^120, NaN restored), which are slower.
An fp8 tile still costs more than a bf16 one: it lands in shared memory, is read into registers, converted, and
stored to shared memory again for the MMAs, where a bf16 tile goes from its copy straight to the MMAs' operand
loads. Figures: docs/benchmarks.md, "fp8 kv pools".

``kv8_mode`` picks the conversion for a call; TO (0) means ``.to()``: a 16/32-bit pool, Triton's CPU interpreter
(which cannot run PTX), ROCm, or a GPU before sm_89.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import device_capability

# Each asm takes one 32-bit register holding four fp8 bytes ($2, element i in byte i) and writes two 32-bit
# registers of two 16-bit floats each ($0: elements 0, 1; $1: elements 2, 3; the lower element in the lower half).
# prmt 0x1404 / 0x3424 move bytes 0, 1 / 2, 3 into the high byte of each 16-bit half (b << 8): for e5m2
# that is the fp16 with the same value, since e5m2 is fp16 cut to its top byte.
_F16_REGS = ".reg .f16 f0, f1, f2, f3;\n.reg .f32 g0, g1, g2, g3;\n"


def _e4m3_to_f16(d0: str, d1: str) -> str:
    return f"mov.b32 {{lo, hi}}, $2;\ncvt.rn.f16x2.e4m3x2 {d0}, lo;\ncvt.rn.f16x2.e4m3x2 {d1}, hi;\n"


def _e5m2_to_f16(d0: str, d1: str) -> str:
    return f"prmt.b32 {d0}, $2, 0, 0x1404;\nprmt.b32 {d1}, $2, 0, 0x3424;\n"


def _f16_to_bf16(s0: str, s1: str) -> str:
    """Two fp16x2 registers to $0, $1 as bf16x2, through fp32 (exact)."""
    return (f"mov.b32 {{f0, f1}}, {s0};\nmov.b32 {{f2, f3}}, {s1};\n"
            + "".join(f"cvt.f32.f16 g{i}, f{i};\n" for i in range(4))
            + "cvt.rn.bf16x2.f32 $0, g1, g0;\ncvt.rn.bf16x2.f32 $1, g3, g2;\n")


PTX_E4M3_BF16 = tl.constexpr("{\n.reg .b16 lo, hi;\n.reg .b32 h0, h1;\n" + _F16_REGS + _e4m3_to_f16("h0", "h1")
                             + _f16_to_bf16("h0", "h1") + "}")
PTX_E5M2_BF16 = tl.constexpr("{\n.reg .b32 w0, w1;\n" + _F16_REGS + _e5m2_to_f16("w0", "w1")
                             + _f16_to_bf16("w0", "w1") + "}")
PTX_E4M3_F16 = tl.constexpr("{\n.reg .b16 lo, hi;\n" + _e4m3_to_f16("$0", "$1") + "}")
PTX_E5M2_F16 = tl.constexpr("{\n" + _e5m2_to_f16("$0", "$1") + "}")

TO = 0  # tl.load(...).to(q's dtype)
E4M3_BF16 = 1
E5M2_BF16 = 2
E4M3_F16 = 3
E5M2_F16 = 4


@triton.jit
def kv_load(ptrs, mask, DT: tl.constexpr, KV8: tl.constexpr):
    """One kv tile in q's dtype ``DT``: ``.to(DT)`` for KV8 == TO, else the pool's bits (uint8) through PTX.

    ``is_pure=False`` keeps Triton from re-running the conversion in each dot-operand layout (see above)."""
    if KV8 == 0:
        return tl.load(ptrs, mask=mask, other=0.0).to(DT)
    else:
        b = tl.load(ptrs, mask=mask, other=0)
        if KV8 == 1:
            return tl.inline_asm_elementwise(PTX_E4M3_BF16, "=r,=r,r", [b], dtype=tl.bfloat16, is_pure=False, pack=4)
        elif KV8 == 2:
            return tl.inline_asm_elementwise(PTX_E5M2_BF16, "=r,=r,r", [b], dtype=tl.bfloat16, is_pure=False, pack=4)
        elif KV8 == 3:
            return tl.inline_asm_elementwise(PTX_E4M3_F16, "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)
        else:
            return tl.inline_asm_elementwise(PTX_E5M2_F16, "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _convert_kernel(src_ptr, dst_ptr, n, DT: tl.constexpr, KV8: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, kv_load(src_ptr + offs, mask, DT, KV8), mask=mask)


_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def convert(pool: torch.Tensor, dtype: torch.dtype, mode: int | None = None) -> torch.Tensor:
    """``pool`` (1-D, fp8) converted to ``dtype`` through ``kv_load``, as the tile loop converts it: a check of
    each conversion against torch's own (tests/dispatcher/kernels/test_triton_gpu.py)."""
    src, kv8 = kv_operand(pool, dtype, mode)
    out = torch.empty(pool.shape, dtype=dtype, device=pool.device)
    block = 1024
    _convert_kernel[(triton.cdiv(pool.numel(), block),)](src, out, pool.numel(), DT=_TL[dtype], KV8=kv8, BLOCK=block)
    return out


# The PTX conversion for each (pool, q) pair, by torch's dtype names: ASM_MODES here, and the Gluon
# kernels' compile-time choice (gluon_sm90_ws_fp8._kv8_mode), read this one table.
MODES_BY_NAME = {("float8_e4m3fn", "bfloat16"): E4M3_BF16, ("float8_e5m2", "bfloat16"): E5M2_BF16,
                 ("float8_e4m3fn", "float16"): E4M3_F16, ("float8_e5m2", "float16"): E5M2_F16}


def _asm_modes() -> dict[tuple[torch.dtype, torch.dtype], int]:
    return {(getattr(torch, kv), getattr(torch, q)): mode for (kv, q), mode in MODES_BY_NAME.items()
            if hasattr(torch, kv)}


ASM_MODES = _asm_modes()
MIN_CAPABILITY = (8, 9)  # cvt.rn.f16x2.e4m3x2: Ada and Hopper onwards


def kv8_mode(kv_dtype: torch.dtype, q_dtype: torch.dtype, backend: str, capability: tuple[int, int] | None) -> int:
    """How the tile loop reads a ``kv_dtype`` pool beside a ``q_dtype`` q: an ASM_MODES conversion on an NVIDIA
    GPU (``backend`` "cuda") of ``MIN_CAPABILITY`` or later, else TO. Pure: the caller reads the device."""
    if backend != "cuda" or capability is None or tuple(capability) < MIN_CAPABILITY:
        return TO
    return ASM_MODES.get((kv_dtype, q_dtype), TO)


def kv_operand(kv: torch.Tensor, q_dtype: torch.dtype, mode: int | None = None) -> tuple[torch.Tensor, int]:
    """(the pool as the kernel takes it, KV8): its uint8 bits for a PTX conversion, else itself.

    ``mode`` overrides the choice (tests; the Triton launches' ``kv8``). A 16-bit pool, every call's case in bf16
    serving, returns before any device query."""
    if mode is None:
        if (kv.dtype, q_dtype) not in ASM_MODES or kv.device.type != "cuda" or torch.version.hip:
            mode = TO
        else:
            mode = kv8_mode(kv.dtype, q_dtype, "cuda", device_capability(kv.device))
    return (kv.view(torch.uint8), mode) if mode != TO else (kv, TO)
