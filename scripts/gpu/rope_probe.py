"""The 512+64 prefill with its rope lanes through the loader's registers, beside the default (S13).

``gluon_sm90_ws``'s loader gathers a tile's 64 rope lanes into a buffer only once P·V has read the
P written over that buffer's previous lanes, so each tile's rope product waits for a gather issued
about one tile earlier. ``_load_part_rr`` (``launch_prefill_ws(rope_in_regs=True)``) loads them
into registers before it waits for the stage, and stores them once the buffer is free. This times
both side by side by kernel time (``KernelTimer``, as ``routescope sweep --timer cupti``), in
alternating rounds, at 512+64, bf16, H = 16, top-k 2048, with a few worker-register splits, and
checks that every variant's answer is bit-identical to the default's (only the data path of the
rope lanes differs, not the math).

    python3 scripts/gpu/rope_probe.py [--repeats 20] [--rows 16384,2048] [--rounds 2]

Writes $OUT/rope_probe.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90_ws  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
VARIANTS = {
    "default": lambda a: gluon_sm90_ws.launch_prefill_ws(a, rope_in_regs=False),
    "rope-in-regs": lambda a: gluon_sm90_ws.launch_prefill_ws(a, rope_in_regs=True),
    "rope-in-regs 160/128/72": lambda a: gluon_sm90_ws.launch_prefill_ws(a, rope_in_regs=True,
                                                                        worker_regs=(160, 128, 72)),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows", default="16384,2048")
    ap.add_argument("--rounds", type=int, default=2)
    opt = ap.parse_args()
    out, log = lab_output()
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    warm_clocks(DEV, 2.0)
    lay = Layout(512, 64)
    rec = []
    for rows in (int(r) for r in opt.rows.split(",")):
        sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
        answers = {}
        for name, fn in VARIANTS.items():
            sets[0].output.fill_(float("nan"))
            fn(sets[0])
            torch.cuda.synchronize()
            answers[name] = sets[0].output.clone()
        for name, got in answers.items():
            same = bool(torch.equal(got, answers["default"]))
            log(f"{rows} rows {name}: bit-identical to the default: {same}; finite: {bool(got.isfinite().all())}")
            rec.append(dict(rows=rows, variant=name, identical=same))
        for rnd in range(opt.rounds):
            for name, fn in VARIANTS.items():
                k = KernelTimer(DEV).time(fn, sets, warmup=3, repeats=opt.repeats)
                rec.append(dict(rows=rows, variant=name, round=rnd, kernel_us=k.median_us, p20_us=k.p20_us,
                                p80_us=k.p80_us))
                log(f"{rows:5} rows round {rnd} {name:24} kernel {k.median_us:9.1f} us "
                    f"(p20 {k.p20_us:.1f}, p80 {k.p80_us:.1f})")
        del sets
        torch.cuda.empty_cache()
    (out / "rope_probe.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": rec},
                                                    indent=1))
    log("done")


if __name__ == "__main__":
    main()
