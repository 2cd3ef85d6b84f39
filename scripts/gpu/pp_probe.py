"""Two whole-pipeline warpgroups (``gluon_sm90_pp``) against the default prefill, side by side (session 15).

For each layout (512+64, 448+64, 512+0): checks ``gluon_sm90_pp`` against the torch reference on
a small call (64 rows, edge cases from the sweep's inputs) and against the default prefill at
full size (the largest difference, and each output's digest), then times both by kernel time
(``KernelTimer``, CUPTI), bf16, H = 16, top-k 2048, alternately, ``--rounds`` rounds each.

    python3 scripts/gpu/pp_probe.py [--rows 16384] [--rounds 2] [--repeats 20] [--regs 224,56 ...]
        [--left-out FLAG ...] [--tag NAME]

``--regs`` adds a timed variant per worker-register pair. ``--left-out`` sets experiment flags of
``gluon_sm90_pp`` (NO_ROPE_MMA) or of ``gluon_sm90_ws`` (NO_GATHER, ...: the loader is that
module's, so NO_GATHER leaves the gathers out of both kernels) before anything compiles; run
each set in its own process and Triton cache. Writes $OUT/pp_probe[_NAME].json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, gluon_sm90_pp  # noqa: E402
from dispatcher.kernels.torch_ref import ragged_prefill as torch_prefill  # noqa: E402
from dispatcher.sweep.correctness import build  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")


def digest(t: torch.Tensor) -> tuple[float, float]:
    o = t.double()
    return float(o.sum()), float(o.abs().sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--layouts", default="512+64,448+64,512+0")
    ap.add_argument("--regs", nargs="*", default=[])
    ap.add_argument("--left-out", nargs="*", default=[])
    ap.add_argument("--tag", default="")
    opt = ap.parse_args()
    from triton.experimental.gluon import language as gl

    from dispatcher.kernels import gluon_sm90_ws

    for flag in opt.left_out:  # before anything compiles
        mod = gluon_sm90_pp if hasattr(gluon_sm90_pp, flag) else gluon_sm90_ws
        if not hasattr(mod, flag):
            raise SystemExit(f"no experiment flag {flag} in gluon_sm90_pp or gluon_sm90_ws")
        setattr(mod, flag, gl.constexpr(True))
    out, log = lab_output()
    warm_clocks(DEV, 1.0)
    rec = []
    variants = {"default": gluon_sm90.launch_prefill, "pp": gluon_sm90_pp.launch_prefill_pp,
                "pp pingpong": lambda a: gluon_sm90_pp.launch_prefill_pp(a, pingpong=True)}
    for spec in opt.regs:
        regs = tuple(int(x) for x in spec.split(","))
        variants[f"pp{spec}"] = lambda a, r=regs: gluon_sm90_pp.launch_prefill_pp(a, worker_regs=r)
    for lspec in opt.layouts.split(","):
        lay = Layout(*(int(x) for x in lspec.split("+")))
        # the small check: the reference's answer, with -1 slots and lengths as the sweep's checks build them
        for dtype in (torch.bfloat16, torch.float16):
            small = build(64, layout=lay, dtype=dtype, device=DEV, topk=2048)
            if "NO_ROPE_MMA" in opt.left_out:  # the reference without rope lanes is what that build computes
                small.q[..., lay.nope:] = 0
            ref = small._replace(output=torch.zeros_like(small.output))
            torch_prefill(ref)
            got = small._replace(output=torch.full_like(small.output, float("nan")))
            gluon_sm90_pp.launch_prefill_pp(got, pingpong=True)
            torch.cuda.synchronize()
            e = (got.output.float() - ref.output.float()).abs().nan_to_num(float("inf"))
            err = float(e.max())
            scale = float(ref.output.float().abs().max())
            by_row = e.amax(dim=(1, 2))
            halves = [float(e[:, :, :256].max()), float(e[:, :, 256:].max())]
            bad_rows = [int(i) for i in torch.nonzero(by_row > 0.05).flatten()[:16]]
            rec.append(dict(check="reference", layout=lspec, dtype=str(dtype), max_abs_err=err, ref_max=scale,
                            finite=bool(torch.isfinite(got.output.float()).all()), err_by_half=halves,
                            bad_rows=bad_rows, n_bad_rows=int((by_row > 0.05).sum())))
            log(f"{lspec} {dtype}: pp pingpong against the reference, 64 rows: max |err| {err:.3e} (|ref| max {scale:.3e}); "
                f"by lane half {halves[0]:.2e} / {halves[1]:.2e}; rows over 0.05: {int((by_row > 0.05).sum())} "
                f"{bad_rows}")
        sets = make_sets(opt.rows, 2048, 16, lay, default_kv_len(opt.rows, 2048), dtype=torch.bfloat16, device=DEV)
        outs = {}
        for name, fn in variants.items():
            sets[0].output.zero_()
            fn(sets[0])
            torch.cuda.synchronize()
            outs[name] = sets[0].output.clone()
            d = digest(outs[name])
            diff = float((outs[name].float() - outs["default"].float()).abs().max())
            rec.append(dict(check="default", layout=lspec, variant=name, max_abs_diff=diff, out_sum=d[0],
                            out_abs_sum=d[1]))
            log(f"{lspec} {name:10}: max |diff| against the default {diff:.3e}; output sum {d[0]:.6e}, |sum| {d[1]:.6e}")
        del outs
        kv_bytes = opt.rows * 2048 * (lay.nope + lay.rope) * 2
        for r in range(opt.rounds):
            for name, fn in variants.items():
                k = KernelTimer(DEV).time(fn, sets, warmup=3, repeats=opt.repeats)
                rec.append(dict(layout=lspec, rows=opt.rows, variant=name, round=r, kernel_us=k.median_us,
                                p20_us=k.p20_us, p80_us=k.p80_us, kv_tb_per_s=kv_bytes / k.median_us / 1e6))
                log(f"{lspec} {opt.rows} rows, round {r}, {name:10}: kernel {k.median_us:9.1f} us "
                    f"(p20 {k.p20_us:.1f}, p80 {k.p80_us:.1f}); kv at {kv_bytes / k.median_us / 1e6:.2f} TB/s")
        del sets
        torch.cuda.empty_cache()
    save_results(out, "pp_probe" + (f"_{opt.tag}" if opt.tag else ""), left_out=opt.left_out, results=rec)


if __name__ == "__main__":
    main()
