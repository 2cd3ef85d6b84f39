"""Compile a Triton or Gluon kernel for sm_90a without a GPU, specialised as a real launch specialises it.

For the tests that check what the kernels compile to (wgmma, spills, shared memory, conversions). Triton ships
ptxas and cuobjdump, so this needs no CUDA install; run it in a process without TRITON_INTERPRET.
"""

from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

TOOLS = Path(triton.__file__).parent / "backends/nvidia/bin"
PTRS = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "len_ptr": "*i32", "indptr_ptr": "*i32",
        "sink_ptr": "*fp32", "out_ptr": "*bf16", "o_ptr": "*fp32", "lse_ptr": "*fp32",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "redo_ptr": "*i32", "stamp_ptr": "*i64", "count_ptr": "*i32"}
ONES = {"q_s2", "kv_s2", "idx_s1", "o_s2"}  # unit strides: Triton turns an argument equal to 1 into a constant
DIV16 = {"q_s0", "q_s1", "kv_s0", "idx_s0", "o_s0", "o_s1", "skv", "H", "o_ld"}  # 9216, 576, 2048...: multiples of 16


def signature(fn, consts: dict, ptrs: dict[str, str] | None = None) -> tuple[dict, dict, dict]:
    """(signature, attributes, constexprs) for ``triton.compile``, as a launch with these pointer types would give:
    constexprs not named take their defaults, constexprs the kernel lacks are dropped."""
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    ptrs = {**PTRS, **(ptrs or {})}
    for p in fn.params:
        if p.is_constexpr and p.name not in consts and p.default is not inspect.Parameter.empty:
            consts[p.name] = p.default
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = ptrs[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "sm_scale2":
            sig[name] = "fp32"
        elif name in ONES:
            sig[name] = "constexpr"
            consts[name] = 1
        else:
            sig[name] = "i32"
            if name in DIV16:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs, consts


def compile_sm90(fn, consts: dict, ptrs: dict[str, str] | None = None, **options):
    """``fn`` (``@triton.jit`` or ``@gluon.jit``) compiled for sm_90a with ``options`` (num_warps, maxnreg...)."""
    sig, attrs, consts = signature(fn, consts, ptrs)
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    return triton.compile(Source(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def cuobjdump(kernel, what: str, cubin: Path) -> str:
    """``cuobjdump --dump-<what>`` (sass, resource-usage) of a compiled kernel, its cubin written to ``cubin``."""
    cubin.write_bytes(kernel.asm["cubin"])
    return subprocess.run([str(TOOLS / "cuobjdump"), f"--dump-{what}", str(cubin)], capture_output=True, text=True,
                          check=True).stdout


def stack_bytes(kernel, cubin: Path) -> int:
    """The kernel's stack frame (spills) in bytes."""
    return int(re.search(r"STACK:(\d+)", cuobjdump(kernel, "resource-usage", cubin)).group(1))
