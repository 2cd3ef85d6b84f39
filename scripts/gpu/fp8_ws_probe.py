"""The warp-specialised prefill on an fp8 pool (session 25): checks, then kernel time beside the other paths.

``gluon_sm90_ws`` reads an e4m3fn or e5m2 pool: each tile's bytes land in the upper half of the q-dtype
stage they become, and the softmax warpgroup whose tile it is converts them there. (Session 25 also ran a
variant in which the loader converted them, ``--variant loader`` at commit 366efac: right, and slower, S25-2;
it was removed.)

``--check`` runs every correctness case (bf16 and fp16 q, both fp8 formats; small shapes, and with
``--big`` full ones) through the kernel's prefill and its ws decode partials. The timings (``KernelTimer``,
CUPTI kernel time, H = 16, top-k 2048) put at each layout and row count: the kernel on an e4m3fn and an
e5m2 pool, the Triton prefill on the same pools (the registry's choice before session 25), and the default
prefill on a bf16 pool (``gluon_sm90.launch_prefill``). It also compares the kernel's output with Triton's on
the same fp8 pool (largest absolute difference).

    python3 scripts/gpu/fp8_ws_probe.py [--check] [--big] [--rows 16384,2048] [--layouts 512+64,512+0,448+64]
        [--q-dtypes bfloat16,float16] [--no-triton]

With ``--q-dtypes`` each q dtype is timed on both fp8 pools and on a pool of its own dtype (``default_16bit``).

Writes $OUT/fp8_ws_probe.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, gluon_sm90_ws, triton_prefill  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_kernel(log, big: bool) -> dict:
    from dispatcher.sweep.correctness import run_checks

    took = []

    def guarded(launch):
        def fn(a):
            took.append(gluon_sm90.supports(a, fp8=True))
            assert took[-1] or a.output.shape[2] > 512, "a case this kernel should take"
            (launch if took[-1] else triton_prefill.launch)(a)
        return fn

    launchers = {"prefill": guarded(gluon_sm90_ws.launch_prefill_ws),
                 "decode": guarded(lambda a: gluon_sm90.launch_decode(a, ws=True, pdl=False))}
    found = []
    for kv_dtype in FP8:
        took.clear()
        got = run_checks(launchers, (torch.bfloat16, torch.float16), DEV, big=big, kv_dtype=kv_dtype)
        found += [c for c, ran in zip(got, took) if ran]
        log(f"checks with a {kv_dtype} pool done: {sum(c.ok for c in found)}/{len(found)} right so far")
    bad = [str(c) for c in found if not c.ok]
    log(f"checks: {len(found) - len(bad)}/{len(found)} right; worst rel err "
        f"{max((c.rel_err for c in found), default=float('nan')):.2e}" + "".join(f"\n  {b}" for b in bad))
    return {"total": len(found), "bad": bad, "worst_rel_err": max((c.rel_err for c in found), default=None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--big", action="store_true", help="the checks at full shapes too")
    ap.add_argument("--rows", default="16384,2048")
    ap.add_argument("--layouts", default="512+64,512+0,448+64")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--q-dtypes", default="bfloat16", help="q's dtypes to time (bfloat16, float16)")
    ap.add_argument("--no-triton", action="store_true", help="leave the Triton prefill out of the timings")
    opt = ap.parse_args()
    out, log = lab_output()
    q_dtypes = [getattr(torch, name) for name in opt.q_dtypes.split(",")]
    checks = check_kernel(log, opt.big) if opt.check else None
    warm_clocks(DEV, 1.0)
    timer = KernelTimer(DEV)
    rec = []
    for spec in opt.layouts.split(","):
        lay = Layout(*(int(x) for x in spec.split("+")))
        for rows in (int(r) for r in opt.rows.split(",")):
            kv_len = default_kv_len(rows, 2048)
            for q_dtype, kv_dtype in ((q, kv) for q in q_dtypes for kv in (*FP8, q)):
                sets = make_sets(rows, 2048, 16, lay, kv_len, dtype=q_dtype, device=DEV,
                                 kv_dtype=None if kv_dtype == q_dtype else kv_dtype)
                paths = ({"ws_fp8": gluon_sm90_ws.launch_prefill_ws, "triton": triton_prefill.launch}
                         if kv_dtype != q_dtype else {"default_16bit": gluon_sm90.launch_prefill})
                if opt.no_triton:
                    paths.pop("triton", None)
                outs = {}
                for name, launch in paths.items():
                    sets[0].output.zero_()
                    launch(sets[0])
                    outs[name] = sets[0].output.float().clone()
                    k = timer.time(launch, sets, warmup=3, repeats=opt.repeats)
                    rec.append(dict(layout=spec, rows=rows, q_dtype=str(q_dtype).split(".")[-1],
                                    kv_dtype=str(kv_dtype).split(".")[-1], path=name, kernel_us=k.median_us, p20_us=k.p20_us, p80_us=k.p80_us))
                    log(f"{spec:6} {rows:6} {rec[-1]['q_dtype']:9} {rec[-1]['kv_dtype']:14} {name:12} "
                        f"{k.median_us:9.1f} us (p20 {k.p20_us:.1f}, p80 {k.p80_us:.1f})")
                if len(outs) == 2:
                    diff = float((outs["ws_fp8"] - outs["triton"]).abs().max())
                    rec[-1]["max_abs_diff_vs_triton"] = diff
                    log(f"        largest |ws_fp8 - triton| = {diff:.3e}")
                del sets, outs
                torch.cuda.empty_cache()
    save_results(out, "fp8_ws_probe", results=rec, checks=checks)


if __name__ == "__main__":
    main()
