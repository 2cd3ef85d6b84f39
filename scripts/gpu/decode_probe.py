"""Partial-kernel configs for the split-K decode, checked and timed beside the default (session 17).

``--trial`` (repeatable, at least one) names a ``gluon_sm90.Sm90Config`` (its fields in order, as
``sm90_lab.py --check-decode`` takes them: stages, rope1, ablate, chains, pipe): ``2,0,1,1,0`` is the
2-stage kernel with ABLATE 1, ``3,0,0,1,1`` the pipelined one (D = 512 layouts only).

1. Every decode correctness case (bf16 and fp16, ``dispatcher/sweep/correctness.py``) through each
   trial meant to be right (ablate 0) at the layouts in ``--layouts`` (the default kernel
   takes the other layouts' cases).
2. At each layout and row count (bf16, H = 16, top-k 2048): each variant's error against the torch
   reference, and whether its answer is bit-identical to the default's.
3. Timing in alternating rounds, the default then each trial, by kernel time (``KernelTimer``:
   CUPTI, first kernel start to last kernel end) beside the event pair of the same calls.

    python3 scripts/gpu/decode_probe.py --trial 2,0,1,1,0 [--trial ...] [--layouts 512+64] [--rows 2,16]
                                        [--rounds 3] [--with-len]

Writes $OUT/decode_probe.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, triton_decode  # noqa: E402
from dispatcher.kernels.gluon_sm90 import Sm90Config  # noqa: E402
from dispatcher.kernels.torch_ref import ragged_prefill as torch_ref  # noqa: E402
from dispatcher.sweep.correctness import run_checks  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import answers_of, lab_output, rel_err, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
REAL = (0,)  # the ablate values whose answers are meant to be right (1, 2: gluon_sm90_attend._attend's ablations)


def layout(spec: str) -> Layout:
    a, _, b = spec.partition("+")
    return Layout(int(a), int(b or 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trial", action="append", required=True,
                    help="Sm90Config fields: stages,rope1,ablate,chains,pipe (repeatable)")
    ap.add_argument("--layouts", default="512+64", help="comma-separated, e.g. 512+64,448+64")
    ap.add_argument("--rows", default="2,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--with-len", action="store_true", help="time with topk_length given (every row full)")
    opt = ap.parse_args()
    trials = [Sm90Config(*[int(x) for x in spec.split(",")]) for spec in opt.trial]
    layouts = [layout(s) for s in opt.layouts.split(",")]
    dims = {lay.head_dim for lay in layouts}
    out, log = lab_output()
    log(f"trials {trials} at {[str(lay) for lay in layouts]}")
    rec: list[dict] = []

    def through(cfg_under_test):
        def run(a):  # the trial at the layouts under test, the default elsewhere
            if gluon_sm90.supports(a):
                cfg = cfg_under_test if int(a.q.shape[2]) in dims else None
                gluon_sm90.launch_decode(a, config=cfg, ws=False if cfg else None)
            else:
                triton_decode.launch(a)
        return run

    variants = {"default": gluon_sm90.launch_decode}
    variants.update({",".join(map(str, cfg)): through(cfg) for cfg in trials})
    for cfg in trials:
        if opt.skip_checks or cfg.ablate not in REAL:
            continue
        found = run_checks({"decode": through(cfg)}, (torch.bfloat16, torch.float16), DEV, big=True)
        bad = [c for c in found if not c.ok]
        worst = max((c.rel_err for c in found), default=0.0)
        log(f"decode checks through {cfg}: {len(found) - len(bad)}/{len(found)} pass (worst rel err {worst:.2e})")
        for c in bad:
            log(f"FAIL {c}")
        rec.append(dict(trial=list(cfg), checks=len(found), failed=len(bad), worst_rel_err=worst))
    warm_clocks(DEV, 2.0)
    for lay in layouts:
        for rows in (int(r) for r in opt.rows.split(",")):
            sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
            if opt.with_len:  # no count in the kernels: the length is loaded
                full = torch.full((rows,), 2048, dtype=torch.int32, device=DEV)
                sets = [s._replace(index=s.index._replace(topk_length=full)) for s in sets]
            ref = sets[0]._replace(output=torch.empty(sets[0].output.shape, dtype=torch.float32, device=DEV))
            torch_ref(ref)
            answers = answers_of(variants, sets[0])
            for name, got in answers.items():
                same = bool(torch.equal(answers["default"], got))
                err = rel_err(got, ref.output)
                log(f"{lay} {rows} rows: {name:10} rel err {err:.2e}, bit-identical to the default: {same}")
                rec.append(dict(layout=str(lay), rows=rows, variant=name, identical=same, rel_err=err))
            for rnd in range(opt.rounds):
                for name, fn in variants.items():
                    k, e = KernelTimer(DEV).paired(fn, sets, warmup=3, repeats=opt.repeats)
                    rec.append(dict(layout=str(lay), rows=rows, variant=name, round=rnd, kernel_us=k.median_us,
                                    kernel_p20=k.p20_us, kernel_p80=k.p80_us, events_us=e.median_us))
                    log(f"{lay} {rows:3} rows round {rnd} {name:10} kernel {k.median_us:6.2f} us (p20 {k.p20_us:.2f}, "
                        f"p80 {k.p80_us:.2f}); events {e.median_us:6.2f} us")
    save_results(out, "decode_probe", trials=[list(cfg) for cfg in trials], with_len=opt.with_len, results=rec)
    log("done")


if __name__ == "__main__":
    main()
