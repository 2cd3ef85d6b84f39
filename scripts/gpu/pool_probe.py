"""The split-K decode in a kv pool inside L2 and in one past it: partial kernels side by side (S11, S12).

The sweep's default pool (``default_kv_len``: 8,192 rows at top-k 2048, 9.4 MB at 512+64) fits
in the H200's L2, and rows share kv rows, so after the timer's L2 flush most of a decode's
gathers still hit L2. A serving pool of long contexts does not fit: every gather goes to HBM,
and the one-warpgroup partial kernel keeps one tile's gather in flight per multiprocessor
(S11-1: 20.5 µs at 512+64, 16 rows, against 15.0 in the small pool). This times the default
decode beside the warp-specialised partials (``launch_decode(ws=True)``: a loader three tiles
ahead), side by side by kernel time, in both pools, at 512+64 and 448+64, and checks that their
answers agree with the default's. ``--variants`` picks others: ``config`` is the default's kernel
launched through an explicit ``Sm90Config``, the path a trial config takes (S12-5 used it as a
control). Each variant's calls are one ``KernelTimer.paired`` run, and the event pair of the same
calls reads about 1.2 µs more in every other run, whatever runs (S12-5): compare variants by kernel
time.

    python3 scripts/gpu/pool_probe.py [--repeats 100] [--variants default,ws,config]

Writes $OUT/pool_probe.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
BIG_POOL = 1 << 20  # kv rows: 1.2 GB at 512+64, far past the H200's 60 MiB L2


VARIANTS = {"default": lambda a: gluon_sm90.launch_decode(a, ws=False),
            "ws": lambda a: gluon_sm90.launch_decode(a, ws=True),
            # the default's kernel through the launch path a trial config takes (an explicit config): a control
            "config": lambda a: gluon_sm90.launch_decode(a, config=gluon_sm90.decode_config(a))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--variants", default="default,ws", help="comma-separated, the first the reference: "
                    + ", ".join(VARIANTS))
    opt = ap.parse_args()
    unknown = [n for n in opt.variants.split(",") if n not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    chosen = {n: VARIANTS[n] for n in opt.variants.split(",")}
    ref = next(iter(chosen))
    out, log = lab_output()
    rec = []
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    warm_clocks(DEV, 2.0)
    for lay in (Layout(512, 64), Layout(448, 64)):
        for rows in (2, 16, 64):
            for pool in (default_kv_len(rows, 2048), BIG_POOL):
                sets = make_sets(rows, 2048, 16, lay, pool, dtype=torch.bfloat16, device=DEV)
                answers = {}
                for rnd in range(2):  # twice through, interleaved, so drift shows
                    for name, fn in chosen.items():
                        fn(sets[0])
                        torch.cuda.synchronize()
                        answers.setdefault(name, sets[0].output.clone())
                        k, e = KernelTimer(DEV).paired(fn, sets, warmup=3, repeats=opt.repeats)
                        err = float((answers[name].float() - answers[ref].float()).abs().max())
                        rec.append(dict(layout=str(lay), rows=rows, kv_len=pool, variant=name, round=rnd,
                                        kernel_us=k.median_us, kernel_p20=k.p20_us, kernel_p80=k.p80_us,
                                        events_us=e.median_us, max_abs_diff=err))
                        log(f"{lay} {rows:2} rows pool {pool:8}  {name:8} kernel {k.median_us:6.2f} us "
                            f"(p20 {k.p20_us:.2f}, p80 {k.p80_us:.2f})  events {e.median_us:6.2f}  max |diff| vs {ref} {err:.1e}")
                del sets
                torch.cuda.empty_cache()
    save_results(out, "pool_probe", results=rec)
    log("done")


if __name__ == "__main__":
    main()
