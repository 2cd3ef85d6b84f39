"""The warp-specialised prefill with each kv stage handed over in two 256-lane halves, beside the default (S13).

The 16,384-row prefill runs at 69.5% of L2's throughput and 74% of L1's (Nsight Compute, S13-4),
within 1% of the same time at a 1.80 GHz and a 1.98 GHz SM clock, and moving its gathers' issue
later made it 8-24% slower (S13-2, S13-3): how soon a freed stage is gathered again matters. ``gluon_sm90_ws.launch_prefill_ws(halves=True)`` hands
each stage over in halves: P·V frees lanes 0-255 before its second product, the loader refills
them at once, and the scores start on a stage's first half before its second has landed (the
default since S13-5). This times, by kernel time (``KernelTimer``, as ``routescope sweep --timer
cupti``), in alternating rounds, bf16, H = 16, top-k 2048:

- ``default``: ``gluon_sm90.launch_prefill``, the registry's kernel (``gluon_sm90_ws`` at 512+64,
  ``gluon_sm90_ws_d512`` at 448+64 and 512+0);
- ``ws whole`` and ``ws halves``: ``gluon_sm90_ws`` with whole stages and with halves, at every
  layout. (S13-6 also timed ``gluon_sm90_ws_d512`` in halves: 1.1-1.7% slower than whole stages at
  D = 512, so that kernel, the default there, keeps whole stages; the switch was removed.)

Each variant's answer is compared with the default's (bit-identical where the products' per-element
order is the same; the largest difference is printed).

- ``d512 pv``, ``d512 pv 168`` and ``d512 softmax`` (session 15, D = 512 only): ``gluon_sm90_ws_d512``
  with P·V as the default partition (softmax warpgroups at 160 or 168 registers) or with the first
  softmax warpgroup as the default, session 4's order.

    python3 scripts/gpu/halves_probe.py [--repeats 20] [--rows 16384,2048] [--rounds 2] [--variants a,b,...]

Writes $OUT/halves_probe.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, gluon_sm90_ws, gluon_sm90_ws_d512  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import answers_of, lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
VARIANTS = {
    "default": gluon_sm90.launch_prefill,
    "ws whole": lambda a: gluon_sm90_ws.launch_prefill_ws(a, halves=False),
    "ws halves": lambda a: gluon_sm90_ws.launch_prefill_ws(a, halves=True),
    # S15: gluon_sm90_ws_d512 (D = 512 only) with P·V or the first softmax warpgroup as the default partition
    "d512 pv": lambda a: gluon_sm90_ws_d512.launch_prefill_ws(a, pv_default=True),
    "d512 pv 168": lambda a: gluon_sm90_ws_d512.launch_prefill_ws(a, pv_default=True, worker_regs=(168, 168, 48)),
    "d512 softmax": lambda a: gluon_sm90_ws_d512.launch_prefill_ws(a, pv_default=False),
}


def probe(lay: Layout, rows: int, repeats: int, rounds: int, log, names: list[str]) -> list[dict]:
    """One layout and row count: each variant's answer against the default's, then ``rounds`` of timings."""
    sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
    rec = []
    variants = {name: VARIANTS[name] for name in ["default"] + [n for n in names if n != "default"]}
    answers = answers_of(variants, sets[0])
    for name, got in answers.items():
        same = bool(torch.equal(got, answers["default"]))
        diff = float((got.float() - answers["default"].float()).abs().max())
        log(f"{lay} {rows} rows {name}: bit-identical to the default {same}, max |diff| {diff:.2e}, "
            f"finite {bool(got.isfinite().all())}")
        rec.append(dict(layout=str(lay), rows=rows, variant=name, identical=same, max_abs_diff=diff))
    for rnd in range(rounds):
        for name, fn in variants.items():
            k = KernelTimer(DEV).time(fn, sets, warmup=3, repeats=repeats)
            rec.append(dict(layout=str(lay), rows=rows, variant=name, round=rnd, kernel_us=k.median_us,
                            p20_us=k.p20_us, p80_us=k.p80_us))
            log(f"{lay} {rows:5} rows round {rnd} {name:10} kernel {k.median_us:9.1f} us "
                f"(p20 {k.p20_us:.1f}, p80 {k.p80_us:.1f})")
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows", default="16384,2048")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layouts", default="512+64,448+64,512+0")
    ap.add_argument("--variants", default="default,ws whole,ws halves",
                    help=f"comma-separated, of: {', '.join(VARIANTS)} (the d512 ones at D = 512 only)")
    opt = ap.parse_args()
    names = [n.strip() for n in opt.variants.split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    out, log = lab_output()
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    warm_clocks(DEV, 2.0)
    rec = []
    for spec in opt.layouts.split(","):
        lay = Layout(*(int(x) for x in spec.split("+")))
        for rows in (int(r) for r in opt.rows.split(",")):
            rec += probe(lay, rows, opt.repeats, opt.rounds, log, names)
            torch.cuda.empty_cache()
    save_results(out, "halves_probe", results=rec)
    log("done")


if __name__ == "__main__":
    main()
