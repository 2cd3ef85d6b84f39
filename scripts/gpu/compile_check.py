"""Compile the Triton kernels for sm_90 on a machine without a GPU; print registers, stack, shared memory, MMA kind.

    python scripts/gpu/compile_check.py [BLOCK_N,WARPS,STAGES,CHUNKS,MAXNREG ...]

Costs no device time: Triton carries ptxas and cuobjdump, so a config that spills, overflows shared memory or
misses Hopper's wgmma is found here before a GPU run. Integer arguments are specialised the way a real launch
specialises them (unit strides become constants, multiples of 16 carry that fact), or the loads would not
vectorise and the report would mislead. Each line also gives the SASS size and the longest loop's length and
instruction mix (``loop=``: the tile loop, per warp per tile). ``signature`` is shared with the kernels' compile tests
(tests/dispatcher/kernels/sm90_build.py).
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import triton_decode, triton_prefill  # noqa: E402

PTRS = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "len_ptr": "*i32", "indptr_ptr": "*i32",
        "sink_ptr": "*fp32", "out_ptr": "*bf16", "o_ptr": "*fp32", "lse_ptr": "*fp32",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "redo_ptr": "*i32", "stamp_ptr": "*i64", "count_ptr": "*i32",
        "cnt_ptr": "*i32"}
ONES = {"q_s2", "kv_s2", "idx_s1", "o_s2"}  # unit strides: Triton turns an argument equal to 1 into a constant
DIV16 = {"q_s0", "q_s1", "kv_s0", "idx_s0", "o_s0", "o_s1", "skv", "H", "o_ld"}  # 9216, 576, 2048, ...: multiples of 16
TOOLS = Path(triton.__file__).parent / "backends/nvidia/bin"


def signature(fn, consts: dict, ptrs: dict[str, str] | None = None) -> tuple[dict, dict, dict]:
    """(signature, attributes, constexprs) for ``triton.compile``, as a launch with these pointer types (over
    ``PTRS``) would give: constexprs not named take their defaults, constexprs the kernel lacks are dropped."""
    sig, attrs = {}, {}
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    ptrs = {**PTRS, **(ptrs or {})}
    for p in fn.params:  # a constexpr left out takes its default, as at a launch (KV8: a 16-bit pool)
        if p.is_constexpr and p.name not in consts and p.default is not inspect.Parameter.empty:
            consts[p.name] = p.default
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


def compile_one(fn, consts: dict, num_warps: int, num_stages: int, maxnreg: int | None = None) -> dict:
    """Compile one kernel variant for sm_90 and read its resource use from the cubin."""
    sig, attrs, consts = signature(fn, consts)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    cubin = Path("/tmp/_compile_check.cubin")
    cubin.write_bytes(k.asm["cubin"])
    rep = subprocess.run([str(TOOLS / "cuobjdump"), "--dump-resource-usage", str(cubin)],
                         capture_output=True, text=True).stdout
    ttgir = k.asm["ttgir"]
    sass = subprocess.run([str(TOOLS / "cuobjdump"), "--dump-sass", str(cubin)], capture_output=True, text=True).stdout

    def num(key: str) -> int:
        m = re.search(key + r":(\d+)", rep)
        return int(m.group(1)) if m else -1

    return {"shared": k.metadata.shared, "regs": num("REG"), "stack": num("STACK"),
            "wgmma": ttgir.count("warp_group_dot "), "mma_v2": ttgir.count("tt.dot "),
            "async_copies": ttgir.count("async_copy_global_to_local"), **sass_loop(sass)}


def sass_loop(sass: str) -> dict:
    """SASS instruction count, and the longest backward-branch loop's length and top opcodes."""
    ops = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*)", line)
        if m:
            ops.append((int(m.group(1), 16), m.group(2).split(".")[0], m.group(3)))
    best = (0, 0)
    for addr, op, rest in ops:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr and addr - int(target.group(1), 16) > best[1] - best[0]:
            best = (int(target.group(1), 16), addr)
    body = Counter(op for addr, op, _ in ops if best[0] <= addr <= best[1]) if best[1] else Counter()
    return {"sass": len(ops), "loop": sum(body.values()),
            "loop_mix": ",".join(f"{op}:{n}" for op, n in body.most_common(6))}


def main(argv: list[str]) -> None:
    configs = [tuple(int(x) for x in a.split(",")) for a in argv] or [
        (32, 4, 2, 1, 0), (64, 4, 2, 1, 0), (32, 4, 2, 4, 0), (64, 4, 2, 4, 0), (64, 4, 2, 2, 0)]
    base = {"D": 576, "BLOCK_B": 64, "HAS_B": True, "V_B": False, "HB": 16, "IEEE": False, "CNT_BLOCK": 2048}
    for bn, warps, stages, chunks, maxnreg in configs:
        for name, fn, extra in (("prefill", triton_prefill._prefill_kernel, {}),
                                ("redo", triton_prefill._redo_kernel, {"SPAN": triton_prefill.REDO_SPAN}),
                                ("partial", triton_decode._partial_kernel, {"PDL": False})):
            consts = {**base, **extra, "BLOCK_N": bn, "CH": 512 // chunks, "NCH": chunks}
            r = compile_one(fn, consts, warps, stages, maxnreg or None)
            print(f"{name:8} BN={bn:3} warps={warps} stages={stages} chunks={chunks} maxnreg={maxnreg or '-':>3}: "
                  + " ".join(f"{k}={v}" for k, v in r.items()))
    for s_block, l_block in ((64, 64), (16, 256), (2, 1024)):
        r = compile_one(triton_decode._reduce_kernel, {"S_BLOCK": s_block, "L_BLOCK": l_block, "PDL": False}, 4, 1)
        print(f"reduce   S_BLOCK={s_block} L_BLOCK={l_block}: " + " ".join(f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
