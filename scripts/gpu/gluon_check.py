"""Compile the Hopper Gluon kernels (dispatcher/kernels/gluon_sm90.py) for sm_90a without a GPU.

Prints shared memory, registers, spills, the wgmma count in the SASS (HGMMA) and the loop's
instruction mix, as compile_check.py does for the Triton kernels. Run it under the Triton the
device machine has (3.6 there): Gluon's API moves between versions, so a check under another
Triton proves little. Usage: python scripts/gpu/gluon_check.py [DB,STAGES,ROPE1,CHAINS[,PIPE[,ABLATE]][:e4m3|:e5m2]
... | ws] (DB: rope lanes, 64 or 0; ROPE1, CHAINS, PIPE, ABLATE as in gluon_sm90.Sm90Config; ``:e4m3``/``:e5m2``: the
partial kernel alone over such a pool, with bf16 q; ``ws``: the warp-specialised
kernel of gluon_sm90_ws, ``ws:A,B,C`` with those worker registers, ``wsh[:A,B,C]`` with its
stages handed over in halves, ``wsh8``/``wsh8e5`` the same over an e4m3fn/e5m2 pool, each with a reference max
(int32 flags) or, with an ``x`` after the kind (``wshx``, ``wsh8x``), the exact running max (an int8 one);
``ws512`` the D = 512 ws kernel of gluon_sm90_ws_d512, with each default partition; default: a few of each).
``--sass-dir DIR`` keeps each variant's SASS as DIR/<variant>.sass, to diff two trees' builds
(``scripts/gpu/sass_diff.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_check import PTRS, sass_loop, signature  # noqa: E402

PTRS = {**PTRS, "trace_ptr": "*i64", "o_ptr": "*bf16"}  # cycle stamps (TRACE; off here); 16-bit partials
from dispatcher.kernels import gluon_sm90  # noqa: E402

TOOLS = Path(triton.__file__).parent / "backends/nvidia/bin"


FP8_POOLS = {"e4m3": ("float8_e4m3fn", "*fp8e4nv"), "e5m2": ("float8_e5m2", "*fp8e5")}


def compile_one(fn, consts: dict, ptrs: dict | None = None, sass_to: Path | None = None, **options) -> dict:
    """Compile one variant for sm_90a; its SASS also into the file ``sass_to`` if given (``--sass-dir``)."""
    sig, attrs, consts = signature(fn, consts, {**PTRS, **(ptrs or {})})
    k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **options})
    cubin = Path("/tmp/_gluon_check.cubin")
    cubin.write_bytes(k.asm["cubin"])
    rep = subprocess.run([str(TOOLS / "cuobjdump"), "--dump-resource-usage", str(cubin)],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([str(TOOLS / "cuobjdump"), "--dump-sass", str(cubin)], capture_output=True, text=True).stdout
    Path(f"/tmp/_gluon_{fn.__name__}.sass").write_text(sass)
    if sass_to is not None:
        sass_to.parent.mkdir(parents=True, exist_ok=True)
        sass_to.write_text(sass)
    Path(f"/tmp/_gluon_{fn.__name__}.ttgir").write_text(k.asm["ttgir"])
    Path(f"/tmp/_gluon_{fn.__name__}.ptx").write_text(k.asm["ptx"])
    regs = rep.split("REG:")[1].split()[0] if "REG:" in rep else "?"
    stack = rep.split("STACK:")[1].split()[0] if "STACK:" in rep else "?"
    return {"shared": k.metadata.shared, "regs": regs, "stack": stack, "hgmma": sass.count("HGMMA"),
            **sass_loop(sass)}


def main(argv: list[str]) -> None:
    sass_dir = None
    if "--sass-dir" in argv:
        i = argv.index("--sass-dir")
        if i + 1 >= len(argv):
            raise SystemExit("--sass-dir takes a folder")
        sass_dir = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]

    def sass_to(label: str) -> Path | None:
        return sass_dir / f"{label}.sass" if sass_dir is not None else None

    specs = argv or ["64,2,0,1", "64,3,1,1", "64,3,1,2", "64,2,0,2", "0,3,0,2", "ws"]
    for spec in specs:
        if spec == "ws512":  # the D = 512 ws kernel (gluon_sm90_ws_d512), each default partition
            from dispatcher.kernels import gluon_sm90_ws_d512 as d512

            for db in (64, 0):
                for pv in (True, False):
                    consts = {"DB": db, "PDL": True, "PV_DEFAULT": pv, "WREGS": d512.REGS[pv]}
                    got = compile_one(d512._ws_kernel, consts, sass_to=sass_to(f"ws512-db{db}-pv{int(pv)}"),
                                      maxnreg=128)
                    print(f"ws512 DB={db} PV_DEFAULT={pv} _ws_kernel", got, flush=True)
            continue
        if spec.startswith("ws"):  # the warp-specialised kernel (gluon_sm90_ws), both head layouts
            from dispatcher.kernels import gluon_sm90_ws

            kind, _, rest = spec.partition(":")
            exact = kind.endswith("x")  # the exact running max: the specialisation an int8 flag pointer picks
            kind = kind.removesuffix("x")
            regs = [int(x) for x in rest.split(",")] if rest else list(gluon_sm90_ws.WORKER_REGS)
            halves = kind.startswith("wsh")  # each stage handed over in two 256-lane halves (STAGE_HALVES)
            pool = {"wsh8": "*fp8e4nv", "wsh8e5": "*fp8e5"}.get(kind)  # an fp8 pool (halves only)
            for db in (64, 0):
                ptrs = {**({"kv_ptr": pool} if pool else {}), **({"redo_ptr": "*i8"} if exact else {})}
                got = compile_one(gluon_sm90_ws._ws_kernel, {"DB": db, "PDL": True, "WREGS": tuple(regs),
                                                             "HALVES": halves}, ptrs or None,
                                  sass_to=sass_to(f"{spec.replace(':', '-').replace(',', '_')}-db{db}"), maxnreg=128)
                print(f"{kind}{' exact max' if exact else ''} DB={db} worker regs {regs} _ws_kernel", got, flush=True)
            continue
        nums, _, fp8 = spec.partition(":")  # ":e4m3" / ":e5m2": the partial kernel over such a pool (bf16 q)
        vals = [int(x) for x in nums.split(",")]
        if not 4 <= len(vals) <= 6:
            raise SystemExit(f"{spec}: a configuration is DB,STAGES,ROPE1,CHAINS[,PIPE[,ABLATE]][:e4m3|:e5m2]")
        db, stages, rr, ch, pipe, ablate = (vals + [0, 0])[:6]
        kernels = [(gluon_sm90._prefill_kernel, {}), (gluon_sm90._partial_kernel, {"PDL": True, "TRACE": False})]
        ptrs = None
        if fp8:  # the one-warpgroup prefill refuses fp8 pools: the decode's partials only
            if fp8 not in FP8_POOLS:
                raise SystemExit(f"{spec}: the pool after ':' is one of {', '.join(FP8_POOLS)}")
            from dispatcher.kernels import fp8_ptx

            kv, ptr = FP8_POOLS[fp8]
            kernels = [(gluon_sm90._partial_kernel, {"PDL": True, "TRACE": False,
                                                     "KV8": fp8_ptx.MODES_BY_NAME[(kv, "bfloat16")]})]
            ptrs = {"kv_ptr": ptr}
        for fn, extra in kernels:
            consts = {"DB": db, "STAGES": stages, "ROPE1": rr, "ABLATE": ablate, "CHAINS": ch, "CNT_BLOCK": 2048,
                      "PIPE": bool(pipe), **extra}
            label = f"{spec.replace(',', '_').replace(':', '-')}-{fn.__name__.strip('_')}"
            print(spec, fn.__name__, compile_one(fn, consts, ptrs, sass_to=sass_to(label)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
