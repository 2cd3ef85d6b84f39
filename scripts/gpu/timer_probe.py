"""Does the CUDA event pair read the same call the same way run after run? (S12)

S12-5 timed one decode call six times in a row with ``KernelTimer.paired`` (CUPTI's kernel time
and the event pair of the same calls): the kernel time held within 0.05 µs, but the event pair
read 4.1 µs over it in runs 1, 3 and 5 and 2.9 µs in runs 2, 4 and 6, whatever was launched. This
times one call (the default split-K decode, 512+64, top-k 2048) eight times in a row with each
timer, a fresh timer per run or one timer for all, so the pattern shows per clock:

- ``events``: ``GpuTimer`` (the sweep's default clock, no profiler);
- ``paired``: ``KernelTimer.paired`` (kernel time and, beside it, the profiled event pair);
- ``kept``: ``GpuTimer`` with one set of CUDA events created once and recorded again in every run
  (``GpuTimer`` creates 2 x repeats events a run and drops them after it);
- ``spaced``: ``GpuTimer`` with a run of 101 calls in between every timed run, untimed;
  ``spacedN``: N calls instead of 101;
- ``sweep``: as ``routescope sweep`` times a point's two kernels (one untimed call, then
  ``GpuTimer.time``), with the same decode as both "A" and "B": any difference is the order's.

``--call`` picks what is timed: the default decode (two kernels, the reduce launched by PDL),
the same without PDL, or the prefill (one kernel).

    python3 scripts/gpu/timer_probe.py [--runs 8] [--repeats 100] [--clocks events,paired,kept,spaced]
                                       [--call decode|decode-nopdl|prefill]

Writes $OUT/timer_probe.json.
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
from dispatcher.sweep.timing import GpuTimer, KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, save_results, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
CALLS = {"decode": gluon_sm90.launch_decode,
         "decode-nopdl": lambda a: gluon_sm90.launch_decode(a, pdl=False),
         "prefill": gluon_sm90.launch_prefill}


class KeptEvents(GpuTimer):
    """GpuTimer's protocol with the same event objects in every run."""

    def _run(self, calls, repeats, around):
        if getattr(self, "_kept", None) is None or len(self._kept[0]) < repeats:
            self._kept = ([torch.cuda.Event(enable_timing=True) for _ in range(repeats)],
                          [torch.cuda.Event(enable_timing=True) for _ in range(repeats)])
        starts, ends = self._kept
        stream = torch.cuda.current_stream(self.device)
        for i in range(repeats):
            self.flush.zero_()
            torch.cuda._sleep(self.hold_cycles)
            starts[i].record(stream)
            calls[i % len(calls)]()
            ends[i].record(stream)
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts[:repeats], ends[:repeats])]


def sweep_like(sets, opt, rows, rec, log) -> None:
    """One timer; per run, "A" then "B" (the same call), each after one untimed call, as runner.run_sweep."""
    timer = GpuTimer(DEV)
    launch = CALLS[opt.call]
    for run in range(opt.runs):
        for name in ("A", "B"):
            launch(sets[0])
            e = timer.time(launch, sets, warmup=3, repeats=opt.repeats)
            rec.append(dict(call=opt.call, rows=rows, clock="sweep", timer=name, run=run, events_us=e.median_us,
                            events_p20=e.p20_us, events_p80=e.p80_us, kernel_us=None))
            log(f"{rows:2} rows sweep  kernel {name} run {run}  events {e.median_us:6.2f} us "
                f"(p20 {e.p20_us:.2f}, p80 {e.p80_us:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--clocks", default="events,paired", help="comma-separated: events, paired, kept, spaced[N], "
                    "sweep")
    ap.add_argument("--call", choices=list(CALLS), default="decode")
    opt = ap.parse_args()
    bad = [c for c in opt.clocks.split(",") if c not in ("events", "paired", "kept", "sweep")
           and not (c.startswith("spaced") and (c[6:] == "" or c[6:].isdigit()))]
    if bad:
        ap.error(f"--clocks: unknown {', '.join(bad)}; known: events, paired, kept, spaced[N], sweep")
    out, log = lab_output()
    rec = []
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    warm_clocks(DEV, 2.0)
    launch = CALLS[opt.call]
    log(f"call: {opt.call}")
    for rows in (2, 16):
        sets = make_sets(rows, 2048, 16, Layout(512, 64), default_kv_len(rows, 2048), dtype=torch.bfloat16,
                         device=DEV)
        make = {"events": GpuTimer, "paired": KernelTimer, "kept": KeptEvents}
        for clock in opt.clocks.split(","):
            if clock == "sweep":
                sweep_like(sets, opt, rows, rec, log)
                continue
            spaced = int(clock[6:] or 101) if clock.startswith("spaced") else 0
            for reuse in (False, True):
                shared = make.get(clock, GpuTimer)(DEV)
                for run in range(opt.runs):
                    timer = shared if reuse else make.get(clock, GpuTimer)(DEV)
                    for i in range(spaced):  # untimed calls first, back to back
                        launch(sets[i % len(sets)])
                    if clock == "paired":
                        k, e = timer.paired(launch, sets, warmup=3, repeats=opt.repeats)
                    else:
                        k, e = None, timer.time(launch, sets, warmup=3, repeats=opt.repeats)
                    row = dict(call=opt.call, rows=rows, clock=clock, timer="one for all" if reuse else "fresh", run=run,
                               events_us=e.median_us, events_p20=e.p20_us, events_p80=e.p80_us,
                               kernel_us=k.median_us if k else None)
                    rec.append(row)
                    kern = f"kernel {k.median_us:6.2f}  lead {e.median_us - k.median_us:5.2f}" if k else ""
                    log(f"{rows:2} rows {clock:6} {row['timer']:11} run {run}  events {e.median_us:6.2f} us "
                        f"(p20 {e.p20_us:.2f}, p80 {e.p80_us:.2f})  {kern}")
    save_results(out, "timer_probe", results=rec)
    log("done")


if __name__ == "__main__":
    main()
