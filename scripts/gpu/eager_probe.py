"""The 2-stage decode (512+64) with an eager prologue, beside the default (session 16).

The one-warpgroup partial kernel (``gluon_sm90._attend``, two stages at 512+64) starts tile 0's
gather in its prologue and tile 1's only once tile 0 has landed, at the top of tile 0's
iteration; at 16 rows that first wave comes from HBM and lands about 3.5 µs in (S6). With
``Sm90Config(2, ablate=3)`` (an experiment: real work, correct answers) the prologue starts tiles
0 and 1 together, and tile 0's iteration refills nothing: its products run with no copies issued
beside them, and tile 1 is in flight from the start.

This checks every decode correctness case through the trial config (bf16 and fp16), then times
the decode at 2 and 16 rows (bf16, H = 16, top-k 2048) in alternating rounds by kernel time
(``KernelTimer``) and by the event pair of the same calls, and compares the answers.

    python3 scripts/gpu/eager_probe.py [--rounds 3] [--repeats 100]

Writes $OUT/eager_probe.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, triton_decode  # noqa: E402
from dispatcher.kernels.gluon_sm90 import Sm90Config  # noqa: E402
from dispatcher.sweep.correctness import run_checks  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
TRIAL = Sm90Config(2, ablate=3)
VARIANTS = {"default": lambda a: gluon_sm90.launch_decode(a),
            "eager prologue": lambda a: gluon_sm90.launch_decode(a, config=TRIAL, ws=False)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=100)
    opt = ap.parse_args()
    out, log = lab_output()
    rec = []

    def trial(a):  # the trial where it applies (rope lanes: two stages), the default elsewhere
        if gluon_sm90.supports(a):
            cfg = TRIAL if a.q.shape[2] != gluon_sm90.LANES_A else None
            gluon_sm90.launch_decode(a, config=cfg, ws=False if cfg else None)
        else:
            triton_decode.launch(a)
    found = run_checks({"decode": trial}, (torch.bfloat16, torch.float16), DEV, big=True)
    bad = [c for c in found if not c.ok]
    log(f"decode checks through the trial: {len(found) - len(bad)}/{len(found)} pass")
    for c in bad:
        log(f"FAIL {c}")
    rec.append(dict(checks=len(found), failed=len(bad)))
    warm_clocks(DEV, 2.0)
    lay = Layout(512, 64)
    for rows in (2, 16):
        sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
        answers = {}
        for name, fn in VARIANTS.items():
            sets[0].output.fill_(float("nan"))
            fn(sets[0])
            torch.cuda.synchronize()
            answers[name] = sets[0].output.clone()
        same = bool(torch.equal(answers["default"], answers["eager prologue"]))
        log(f"{rows} rows: eager prologue bit-identical to the default: {same}")
        rec.append(dict(rows=rows, identical=same))
        for rnd in range(opt.rounds):
            for name, fn in VARIANTS.items():
                k, e = KernelTimer(DEV).paired(fn, sets, warmup=3, repeats=opt.repeats)
                rec.append(dict(rows=rows, variant=name, round=rnd, kernel_us=k.median_us, kernel_p20=k.p20_us,
                                kernel_p80=k.p80_us, events_us=e.median_us))
                log(f"{rows:3} rows round {rnd} {name:15} kernel {k.median_us:6.2f} us (p20 {k.p20_us:.2f}, "
                    f"p80 {k.p80_us:.2f}); events {e.median_us:6.2f} us")
    save_results(out, "eager_probe", results=rec)
    log("done")


if __name__ == "__main__":
    main()
