"""Compile the Triton kernels for sm_90 on a machine without a GPU; print registers, spills and shared memory.

Costs no device time: Triton carries ptxas, so a config that spills or overflows shared memory
is found here before a run. Usage: python scripts/gpu/compile_check.py [BLOCK_N,WARPS,STAGES ...]
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import triton_decode, triton_prefill  # noqa: E402

PTRS = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "len_ptr": "*i32", "indptr_ptr": "*i32",
        "sink_ptr": "*fp32", "out_ptr": "*bf16", "o_ptr": "*fp32", "lse_ptr": "*fp32"}


def compile_one(fn, consts: dict, num_warps: int, num_stages: int) -> dict:
    """Compile one kernel variant for sm_90 and read its resource use from ptxas."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in PTRS:
            sig[name] = PTRS[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "sm_scale2":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    cubin = Path("/tmp/_cc.cubin")
    cubin.write_bytes(k.asm["cubin"])
    rep = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(cubin)], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", rep)
    local = re.search(r"LOCAL:(\d+)", rep)
    return {"shared": k.metadata.shared, "regs": int(regs.group(1)) if regs else -1,
            "spill": int(local.group(1)) if local else -1,
            "async": k.asm["ttgir"].count("async_copy_global_to_local")}


def main(argv: list[str]) -> None:
    configs = [tuple(int(x) for x in a.split(",")) for a in argv] or [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 8, 2)]
    layouts = {"512+64": (576, 512, 64, True), "512+0": (512, 512, 16, False)}
    for lname, (d, da, bb, has_b) in layouts.items():
        for bn, warps, stages in configs:
            base = {"D": d, "BLOCK_A": da, "BLOCK_B": bb, "HAS_B": has_b, "V_B": False, "BLOCK_N": bn,
                    "HB": 16, "IEEE": False, "CNT_BLOCK": 256}
            for v_b in (False, True) if has_b else (False,):
                for name, fn in (("prefill", triton_prefill._prefill_kernel), ("partial", triton_decode._partial_kernel)):
                    r = compile_one(fn, {**base, "V_B": v_b}, warps, stages)
                    print(f"{lname:7} {name:8} V_B={v_b:d} BN={bn:3} warps={warps} stages={stages}: "
                          f"shared={r['shared']:7} regs={r['regs']:4} local={r['spill']} async_copies={r['async']}")
    for s_block, l_block in ((64, 64), (16, 256), (2, 1024)):
        r = compile_one(triton_decode._reduce_kernel, {"S_BLOCK": s_block, "L_BLOCK": l_block}, 4, 1)
        print(f"reduce S_BLOCK={s_block} L_BLOCK={l_block}: shared={r['shared']} regs={r['regs']} local={r['spill']}")


if __name__ == "__main__":
    main(sys.argv[1:])
