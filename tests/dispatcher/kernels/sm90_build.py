"""Compile a Triton or Gluon kernel for sm_90a without a GPU, specialised as a real launch specialises it.

For the tests that check what the kernels compile to (wgmma, spills, shared memory, conversions). Triton ships
ptxas and cuobjdump, so this needs no CUDA install; run it in a process without TRITON_INTERPRET.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget


def _compile_check():
    """scripts/gpu/compile_check.py, which owns how a launch specialises a kernel's arguments."""
    path = Path(__file__).resolve().parents[3] / "scripts" / "gpu" / "compile_check.py"
    spec = importlib.util.spec_from_file_location("gpu_script_compile_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SCRIPT = _compile_check()
TOOLS, PTRS, signature = _SCRIPT.TOOLS, _SCRIPT.PTRS, _SCRIPT.signature


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
