"""The warp-specialised prefill with its gathers or products left out (``gluon_sm90_ws_parts.NO_*``; session 14).

The 16,384-row prefill at 512+64 moves its kv at about 7.1 TB/s; the same gathers alone, in
``tma_probe.py``'s ring of stages with nothing computing, move 8.8 TB/s (S14-2). This times, by
kernel time (``KernelTimer``), bf16, H = 16, top-k 2048, 16,384 rows (by default), the kernel as built with
the parts of ``--ablate N`` left out (one process per N: the flags are globals read when the
kernel compiles, so each needs its own Triton cache); every wait and hand-over stays:

- 0: the kernel itself;
- 1: no gathers (the loader hands each stage over untouched): products, softmax and hand-overs;
- 2: no products (scores zero, no P·V): gathers, softmax and hand-overs;
- 3: neither: softmax and hand-overs;
- 4: no gathers, no P·V products: the scores' products, softmax and hand-overs;
- 5: no gathers, no scores' products: P·V's products, softmax and hand-overs;
- 6: (S14-5, commit 199a6fa, since removed: warpgroup 0 asking L2 for the next item's q; no gain);
- 7: P·V leaves Oᵀ unrescaled; 8: each softmax warpgroup keeps its own max; 9: both;
- 10: (S14-6, commit dde21fe, since reverted: a P·V warpgroup per 256-lane half; 3.5% slower);
- 11: (S14-7, commit 8c87fb1, since reverted: the kernel without its lazy rescaling, the kernel of session 13;
  lazy rescaling was 4.3% slower);
- 12: (S14-12, commit fd1e43c: P·V as the default partition, both softmax warpgroups workers; 1.9% faster at
  512+64, 3.0% at 512+0, bit-identical: the kernel's layout since);
- 13: no P·V products (gathers, scores, softmax, hand-overs): a bound for any faster P·V;
- 14: no scores' products (gathers, P·V, softmax over zero scores, hand-overs): a bound for any faster scores;
- 15: (S19-1, commit dc1d08f, since reverted: P·V by mma.sync, ``gluon_sm90_ws.PV_SYNC``, P read once a warp
  into registers instead of by every wgmma; right, and 30% slower);
- 16: no tile max across the softmax warpgroup's warps (P relative to the larger of the running max and 0; the
  reduction's shared-memory round trip and barriers left out, session 29); 17: that and each softmax warpgroup
  keeping its own max (both timed before the prefill kept a reference max, S29-6);
- 18: (S30-1, commit 38837d9, the kernel's since session 30: the prefill's running max passed between the softmax
  warpgroups only until the item's reference is set, session 29's ``MCHAIN_ONCE`` trial; 2.8% faster at 512+64,
  answers bit-identical).

Each build is timed with its reference max (``launch_prefill_ws(redo=True)``), which the prefill keeps by default
only where it pays since session 31 (``gluon_sm90_ws.reference_pays``). ``--layouts`` picks the layouts (default
512+64,512+0), ``--topk`` the row widths (default 2048) and ``--rows`` the row counts (default 16384), each a
comma list: every layout x top-k x rows is timed. ``--no-redo``
also times the build with its reference max switched off at run time (``launch_prefill_ws(redo=False)``: the
exact running max, no flags, no redo launch), after each timing with it.
``--beside-d512`` (a build without flags) also times the D = 512 kernel ``gluon_sm90_ws_d512`` at each D = 512
layout, before and after this one, in the same process (session 30).

``--check`` first runs every correctness case (bf16 and fp16) through the build's prefill at any layout and its
ws decode's partials, for a build meant to give right answers (0, or a variant under trial).

Through ``gluon_sm90_ws.launch_prefill_ws``, the prefill's kernel at every layout where its reference pays
(``gluon_sm90_ws_d512``, not ablated, takes the other calls at D = 512). The answers
of 1 and 2 are wrong on purpose; their timings are real.

    TRITON_CACHE_DIR=$(mktemp -d) python3 scripts/gpu/ablate_probe.py --ablate N [--repeats 20] [--check]
        [--layouts 512+64,448+64,512+0] [--topk 128,512] [--rows 256,16384] [--beside-d512] [--no-redo]

Writes $OUT/ablate_probe_N.json.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90_ws  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks, ws_flags_on  # noqa: E402

DEV = torch.device("cuda")
NAMES = {0: "the kernel", 1: "no gathers", 2: "no products", 3: "neither", 4: "scores only", 5: "P·V only",
         7: "no rescale", 8: "no m chain", 9: "no rescale, no m chain", 13: "no P·V products",
         14: "no scores' products", 16: "no tile max", 17: "no tile max, no m chain"}
LEFT_OUT = {0: (), 1: ("NO_GATHER",), 2: ("NO_SCORES", "NO_PV"), 3: ("NO_GATHER", "NO_SCORES", "NO_PV"),
            4: ("NO_GATHER", "NO_PV"), 5: ("NO_GATHER", "NO_SCORES"), 7: ("NO_RESCALE",),
            8: ("NO_MCHAIN",), 9: ("NO_RESCALE", "NO_MCHAIN"), 13: ("NO_PV",), 14: ("NO_SCORES",),
            16: ("NO_TMAX",), 17: ("NO_TMAX", "NO_MCHAIN")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ablate", type=int, choices=sorted(NAMES), required=True)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows", type=_ints, default=[16384])
    ap.add_argument("--check", action="store_true", help="every correctness case through this build first")
    ap.add_argument("--layouts", type=lambda v: v.split(","), default=["512+64", "512+0"])
    ap.add_argument("--topk", type=_ints, default=[2048])
    ap.add_argument("--no-redo", action="store_true", help="also time the build with redo=False (the exact max)")
    ap.add_argument("--beside-d512", action="store_true",
                    help="also time gluon_sm90_ws_d512 at each D = 512 layout, before and after this build")
    opt = ap.parse_args()
    if opt.beside_d512 and opt.ablate:
        ap.error("--beside-d512 compares the kernels as built: with --ablate 0 only")
    ws_flags_on(LEFT_OUT[opt.ablate])  # before anything compiles
    out, log = lab_output()
    checks = check_build(log) if opt.check else None
    warm_clocks(DEV, 1.0)
    rec = []
    for spec in opt.layouts:
        for topk in opt.topk:
            for rows in opt.rows:
                rec += time_point(opt, spec, rows, topk, log)
    save_results(out, f"ablate_probe_{opt.ablate}", results=rec, checks=checks)


def _ints(v: str) -> list[int]:
    return [int(x) for x in v.split(",")]


def time_point(opt, spec: str, rows: int, topk: int, log) -> list[dict]:
    """Every run of one layout (``spec``, e.g. 512+64) x top-k x rows, by kernel time, with a digest of each run's
    answer."""
    lay = Layout(*(int(x) for x in spec.split("+")))
    rec = []
    sets = make_sets(rows, topk, 16, lay, default_kv_len(rows, topk), dtype=torch.bfloat16, device=DEV)
    runs = [(NAMES[opt.ablate], partial(gluon_sm90_ws.launch_prefill_ws, redo=True))]  # the reference max
    if opt.no_redo:
        runs.append((NAMES[opt.ablate] + ", exact max", partial(gluon_sm90_ws.launch_prefill_ws, redo=False)))
    if opt.beside_d512 and lay.nope + lay.rope == 512:
        from dispatcher.kernels import gluon_sm90_ws_d512

        d512 = ("gluon_sm90_ws_d512", gluon_sm90_ws_d512.launch_prefill_ws)
        runs = [d512, *runs, d512]
    for name, launch in runs:
        sets[0].output.zero_()
        launch(sets[0])
        o = sets[0].output.double()
        digest = (float(o.sum()), float(o.abs().sum()))  # equal across runs where the answers are the same
        k = KernelTimer(DEV).time(launch, sets, warmup=3, repeats=opt.repeats)
        kv_bytes = rows * topk * (lay.nope + lay.rope) * 2
        rec.append(dict(layout=spec, rows=rows, topk=topk, ablate=opt.ablate, name=name,
                        kernel_us=k.median_us, p20_us=k.p20_us, p80_us=k.p80_us,
                        kv_tb_per_s=kv_bytes / k.median_us / 1e6, out_sum=digest[0], out_abs_sum=digest[1]))
        log(f"ablate {opt.ablate} ({name:22}) {spec:6} {rows} rows, top-k {topk}: kernel {k.median_us:9.1f} us "
            f"(p20 {k.p20_us:.1f}, p80 {k.p80_us:.1f}); kv at {kv_bytes / k.median_us / 1e6:.2f} TB/s; "
            f"output sum {digest[0]:.6e}, |sum| {digest[1]:.6e}")
    del sets
    torch.cuda.empty_cache()
    return rec


def check_build(log) -> dict:
    """Every correctness case (bf16, fp16) this kernel takes: the prefill at any layout, the ws decode's partials."""
    from dispatcher.kernels import gluon_sm90
    from dispatcher.kernels.torch_ref import ragged_prefill
    from dispatcher.sweep.correctness import run_checks

    took = []  # per check, in run_checks' order: whether this build ran it (else the torch reference did)

    def guarded(launch):
        def fn(a):
            took.append(gluon_sm90.supports(a))
            (launch if took[-1] else ragged_prefill)(a)
        return fn

    launchers = {"prefill": guarded(gluon_sm90_ws.launch_prefill_ws),
                 "decode": guarded(lambda a: gluon_sm90.launch_decode(a, ws=True, pdl=False))}
    found = [c for c, ran in zip(run_checks(launchers, (torch.bfloat16, torch.float16), DEV, big=False), took)
             if ran]
    bad = [str(c) for c in found if not c.ok]
    log(f"checks: {len(found) - len(bad)}/{len(found)} right" + "".join(f"\n  {b}" for b in bad))
    return {"total": len(found), "bad": bad, "worst_rel_err": max((c.rel_err for c in found), default=None)}


if __name__ == "__main__":
    main()
