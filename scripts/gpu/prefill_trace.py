"""Who waits for whom in the warp-specialised prefill, from cycle stamps (``gluon_sm90_ws_parts.TRACE``; session 14).

The prefill's parts timed alone do not overlap as they might: products, softmax and hand-overs
without gathers take 4.82 ms at 512+64, the sum of their parts (S14-4). Here the kernel stamps
%clock64 (``TRACE`` set before anything compiles, in a Triton cache of its own) as P·V receives
each tile's P and as its product is done. Every program keeps its last item's stamps: tiles 0-6,
and the last tile in slot 7. Per program and tile t (1-6), in cycles:

- ``period``: P·V done (t) - P·V done (t - 1);
- ``P after P·V free``: P ready (t) - P·V done (t - 1). Above zero, P·V sat waiting for the
  softmax; below, P waited for P·V;
- ``P·V once both are in``: P·V done (t) - max(P ready (t), P·V done (t - 1)).

bf16, H = 16, top-k 2048, 16,384 rows, ``gluon_sm90_ws`` with halves at 512+64 and at 512+0.
Every call of this build is traced; its answer's digest (sum, sum of magnitudes) is printed, to set
beside ``ablate_probe.py``'s for the untraced kernel (the stamps change no answer: the GPU test
``test_sm90_decode_trace_stamps_are_ordered_and_change_no_answer`` checks that for the decode).
Writes $OUT/prefill_trace.json.

    python3 scripts/gpu/prefill_trace.py [--left-out NO_GATHER,NO_SCORES,NO_PV]

(S14-12 ran it with ``--pv-default``, since removed: P·V became the default partition in every build.)

``--left-out`` builds the traced kernel with those parts left out, as ``ablate_probe.py`` does (its
answers are then wrong; the digest shows it), and names the output prefill_trace_<flags>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # the traced build must not share a cache with the production one
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="prefill_trace_cache_")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90_ws  # noqa: E402
from dispatcher.kernels.triton_decode import sm_count  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks, ws_flags_on  # noqa: E402

DEV = torch.device("cuda")


def launch(a, trace: torch.Tensor) -> None:
    gluon_sm90_ws.launch_kernel(gluon_sm90_ws._ws_kernel, a, 1, None, None, False,
                                WREGS=tuple(gluon_sm90_ws.WORKER_REGS), HALVES=True, trace_ptr=trace)


def intervals(stamps: torch.Tensor) -> dict[str, list[float]]:
    """Medians over programs of each tile's intervals (cycles), from [programs, 24] stamps."""
    s = stamps.double()
    ready = lambda t: s[:, 3 + 2 * t]  # noqa: E731
    done = lambda t: s[:, 4 + 2 * t]  # noqa: E731
    out = {"period": [], "P after P·V free": [], "P·V once both are in": []}
    for t in range(1, 7):
        out["period"].append(float((done(t) - done(t - 1)).median()))
        out["P after P·V free"].append(float((ready(t) - done(t - 1)).median()))
        out["P·V once both are in"].append(float((done(t) - torch.maximum(ready(t), done(t - 1))).median()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--left-out", default="", help="comma-separated NO_* flags of gluon_sm90_ws_parts")
    opt = ap.parse_args()
    flags = [f for f in opt.left_out.split(",") if f]
    try:
        ws_flags_on(flags + ["TRACE"])  # before anything compiles
    except ValueError as e:
        raise SystemExit(str(e)) from None
    out, log = lab_output()
    warm_clocks(DEV, 1.0)
    programs = sm_count(DEV)
    rec = []
    for spec in ("512+64", "512+0"):
        lay = Layout(*(int(x) for x in spec.split("+")))
        a = make_sets(16384, 2048, 16, lay, default_kv_len(16384, 2048), dtype=torch.bfloat16, device=DEV)[0]
        runs = []
        for _ in range(5):
            trace = torch.zeros((programs, 24), dtype=torch.int64, device=DEV)
            a.output.zero_()
            launch(a, trace)
            torch.cuda.synchronize()
            runs.append(intervals(trace))
        o = a.output.double()
        digest = (float(o.sum()), float(o.abs().sum()))
        summary = {k: [statistics.median(r[k][i] for r in runs) for i in range(6)] for k in runs[0]}
        rec.append(dict(layout=spec, left_out=flags, out_sum=digest[0], out_abs_sum=digest[1], runs=runs, median=summary))
        log(f"{spec}: output sum {digest[0]:.6e}, |sum| {digest[1]:.6e}")
        for k, v in summary.items():
            log(f"  {k:22} tiles 1-6: " + " ".join(f"{x:7.0f}" for x in v) + " cycles")
    save_results(out, "_".join(["prefill_trace"] + flags), results=rec)


if __name__ == "__main__":
    main()
