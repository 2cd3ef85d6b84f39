"""Why a decode with topk_length given reads 0.3-0.6 µs more at 512+64, 16 rows (S9-S10): four layouts of the lengths.

The kernel's code is the same whether or not ``topk_length`` is given (``has_len`` is a runtime
flag), except that Triton specialises an integer argument equal to 1 (and one divisible by 16):
a contiguous int32 ``topk_length`` has stride 1, so that call runs a build with ``len_s0`` a
constant, while without lengths ``len_s0`` is 0 (the divisible-by-16 build). This times the
default decode (``gluon_sm90.launch_decode``) by kernel time and by the event pair with:

- no topk_length (the kernel counts each row's valid indices);
- int32 lengths, contiguous (stride 1: the specialised build);
- int32 lengths, stride 16 (each row's length on its own 64-byte span; the no-length build);
- int32 lengths, stride 3 (no specialisation of the stride);
- int64 lengths, contiguous.

Every row is full (length = top-k), so the answers are the same. Each call's kernels are also
read one by one from the profiler (S11): the partial pass's own duration, when the PDL-launched
reduce starts and how long after the partials it ends, and the gap from the timer's hold kernel
to the partials' start, so the extra time can be placed. Writes $OUT/len_probe.json.

    python3 scripts/gpu/len_probe.py [--repeats 100]
    python3 scripts/gpu/len_probe.py --prefill [--repeats 30]   # the default prefill at 16,384 rows instead
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90  # noqa: E402
from dispatcher.sweep.cupti import Span, call_kernels  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import KernelTimer, summarize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
LAYOUTS = {"none": None, "int32 stride 1": (torch.int32, 1), "int32 stride 16": (torch.int32, 16),
           "int32 stride 3": (torch.int32, 3), "int64": (torch.int64, 1)}  # (dtype, stride) of topk_length


def lengths(rows: int, width: int, kind: str) -> torch.Tensor | None:
    """The call's topk_length in one of ``LAYOUTS`` (every row full)."""
    if LAYOUTS[kind] is None:
        return None
    dtype, stride = LAYOUTS[kind]
    return torch.full((rows * stride,), width, dtype=dtype, device=DEV)[::stride]


def per_call_kernels(found: list[Span], repeats: int) -> dict[str, float]:
    """Medians over the calls, µs: the partial kernel's duration, the reduce's start and end after the partial's
    start and end, and the gap from the kernel before the call (the timer's hold) to the partial's start."""
    parts: dict[str, list[float]] = {"partial_us": [], "reduce_start_us": [], "reduce_tail_us": [],
                                     "reduce_us": [], "lead_us": []}
    for i, (mine, before) in call_kernels(found).items():
        if i >= repeats or len(mine) != 2:
            continue
        part, red = mine
        parts["partial_us"].append(part.end_us - part.start_us)
        parts["reduce_start_us"].append(red.start_us - part.start_us)
        parts["reduce_tail_us"].append(red.end_us - part.end_us)
        parts["reduce_us"].append(red.end_us - red.start_us)
        if before is not None:
            parts["lead_us"].append(part.start_us - before.end_us)
    return {k: round(summarize(v, "cupti").median_us, 3) for k, v in parts.items() if v}


def run_with_lengths(launch, sets, rows: int, kind: str, ref):
    """``sets`` with topk_length of ``kind``, after one call of ``launch``: (the calls, the reference output
    (this call's if ``ref`` is None), whether this call's output equals it)."""
    calls = [a._replace(index=a.index._replace(topk_length=lengths(rows, 2048, kind))) for a in sets]
    launch(calls[0])
    torch.cuda.synchronize()
    got = calls[0].output.float().clone()
    ref = got if ref is None else ref
    return calls, ref, bool(torch.equal(got, ref))


def prefill_lengths(repeats: int, rec: list, log) -> None:
    """The default prefill (warp-specialised) at 16,384 rows, without topk_length and with it, by kernel time."""
    rows = 16384
    for lay in (Layout(512, 64), Layout(448, 64), Layout(512, 0)):
        sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
        ref = None
        for rnd in range(2):
            for kind in ("none", "int32 stride 1"):
                calls, ref, same = run_with_lengths(gluon_sm90.launch_prefill, sets, rows, kind, ref)
                k, e = KernelTimer(DEV).paired(gluon_sm90.launch_prefill, calls, warmup=2, repeats=repeats)
                rec.append(dict(layout=str(lay), rows=rows, lengths=kind, round=rnd, kernel_us=k.median_us,
                                kernel_p20=k.p20_us, kernel_p80=k.p80_us, events_us=e.median_us, same_answer=same))
                log(f"prefill {lay} {kind:16} kernel {k.median_us:8.1f} us (p20 {k.p20_us:.1f}, p80 {k.p80_us:.1f})"
                    f"  same answer as no lengths: {same}")
        del sets
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--prefill", action="store_true", help="time the default prefill at 16,384 rows, no lengths "
                                                           "against contiguous int32 ones, three layouts")
    opt = ap.parse_args()
    out, log = lab_output()
    rec = []
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    warm_clocks(DEV, 2.0)
    if opt.prefill:
        prefill_lengths(opt.repeats, rec, log)
        save_results(out, "len_probe_prefill", results=rec)
        log("done")
        return
    for lay in (Layout(512, 64), Layout(512, 0)):
        for rows in (2, 16):
            sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
            ref = None
            for rnd in range(2):  # twice through, interleaved, so drift shows
                for kind in LAYOUTS:
                    calls, ref, same = run_with_lengths(gluon_sm90.launch_decode, sets, rows, kind, ref)
                    k, e, found = KernelTimer(DEV).paired_spans(gluon_sm90.launch_decode, calls, warmup=3,
                                                                  repeats=opt.repeats)
                    parts = per_call_kernels(found, opt.repeats)
                    rec.append(dict(layout=str(lay), rows=rows, lengths=kind, round=rnd, kernel_us=k.median_us,
                                    kernel_p20=k.p20_us, kernel_p80=k.p80_us, events_us=e.median_us, same_answer=same,
                                    **parts))
                    log(f"{lay} {rows:2} rows  {kind:16} kernel {k.median_us:5.2f} us (p20 {k.p20_us:.2f}, "
                        f"p80 {k.p80_us:.2f})  events {e.median_us:5.2f}  same answer as no lengths: {same}")
                    log("    " + "  ".join(f"{n} {v:.2f}" for n, v in parts.items()))
            del sets
    save_results(out, "len_probe", results=rec)
    log("done")


if __name__ == "__main__":
    main()
