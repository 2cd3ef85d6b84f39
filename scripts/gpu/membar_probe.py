"""Where Triton's shared-memory hazard pass puts barriers in an fp8-to-16-bit tile conversion (session 26).

Compile-only (no GPU): a Gluon kernel that converts a 256-lane half tile of fp8 bytes into a bf16 stage, 2 KB a
step (``fp8_ptx``'s PTX, 32 slots x 64 lanes a step, as ``gluon_sm90_ws_fp8._expand_half`` does), in four
arrangements: the bytes in a separate allocation (a landing ring) or in the stage's own upper half (session
25's in-place landing), the stage indexed at run time (``i % 3``, as the kernel's stage ring) or fixed. Prints
the barriers (``BAR.SYNC``) and shared loads and stores in the SASS. Run it under the device's Triton (3.6):

    python scripts/gpu/membar_probe.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels.gluon_sm90_parts import _fp8_to  # noqa: E402
from dispatcher.kernels.gluon_sm90_ws_fp8 import CP8  # noqa: E402  (the kernel's conversion layout)

TOOLS = Path(triton.__file__).parent / "backends/nvidia/bin"


@gluon.jit
def _probe_kernel(out_ptr, n, RING: gl.constexpr, DYNAMIC: gl.constexpr):
    dt: gl.constexpr = gl.bfloat16
    stage = gl.allocate_shared_memory(dt, [3, 64, 256], gl.NVMMASharedLayout.get_default_for([64, 256], dt))
    ring = gl.allocate_shared_memory(gl.uint8, [4, 64, 256], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    acc = gl.zeros([64, 64], gl.float32, CP8)
    for i in range(n):
        if DYNAMIC:
            dst = stage.index(i % 3)
        else:
            dst = stage.index(0)
        if RING:
            src = ring.index(i % 4)
        else:  # the stage's own upper 16 KB, as 64 x 256 bytes
            src = dst._reinterpret(gl.uint8, [2, 64, 256], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).index(1)
        for c in gl.static_range(2):  # the columns whose bf16 lanes overwrite no fp8 byte
            for r in gl.static_range(2):
                x = src.slice(64 * c, 64, dim=1).slice(32 * r, 32, dim=0).load(CP8)
                dst.slice(64 * c, 64, dim=1).slice(32 * r, 32, dim=0).store(_fp8_to(x, 1))
        fence_async_shared()
        acc += dst.slice(0, 64, dim=1).load(CP8).to(gl.float32)
    offs_r = gl.arange(0, 64, gl.SliceLayout(1, CP8))
    offs_c = gl.arange(0, 64, gl.SliceLayout(0, CP8))
    gl.store(out_ptr + offs_r[:, None] * 64 + offs_c[None, :], acc)


def counts(ring: bool, dynamic: bool) -> dict:
    src = GluonASTSource(fn=_probe_kernel, signature={"out_ptr": "*fp32", "n": "i32", "RING": "constexpr",
                                                      "DYNAMIC": "constexpr"},
                         constexprs={"RING": ring, "DYNAMIC": dynamic})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    cubin = Path("/tmp/_membar_probe.cubin")
    cubin.write_bytes(k.asm["cubin"])
    sass = subprocess.run([str(TOOLS / "cuobjdump"), "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    return {"barriers": sass.count("BAR.SYNC"), "lds": len(re.findall(r"\bLDS", sass)),
            "sts": len(re.findall(r"\bSTS", sass))}


def main() -> None:
    print(f"Triton {triton.__version__}: four 2 KB steps a tile, each a load and two 16-byte stores a thread")
    for ring in (True, False):
        for dynamic in (True, False):
            where = "a landing ring" if ring else "the stage's upper half"
            index = "i % 3" if dynamic else "fixed"
            print(f"bytes in {where:22}, stage {index:6}: {counts(ring, dynamic)}")


if __name__ == "__main__":
    main()
