"""What clock the SMs run the targets' calls at, and what holds it there (S13).

docs/benchmarks.md turns the prefill's shared-memory wavefronts into milliseconds at 1.80 GHz,
the rate Nsight Compute saw in S5-1, and the decode's stamps ran at 1.76 GHz (S6); the H200's
top clock is 1.98 GHz. Whether the timed calls run below it, and why (the power cap, heat, or
the driver's application clock), decides how far a kernel's time is the kernel's and how far the
card's. This samples ``nvidia-smi`` every 20 ms while it runs, in phases:

- ``idle``: nothing launched;
- ``matmul``: 8192³ bf16 matrix products back to back (``warm_clocks``, as the labs start);
- ``prefill-timed`` / ``decode-timed``: the 16,384-row prefill and the 16-row split-K decode
  (bf16, H = 16, top-k 2048) timed by ``KernelTimer`` as ``routescope sweep --timer cupti`` times
  them (an L2 flush and a GPU hold before each call), at 512+64 and 448+64;
- ``prefill-loop``: the 512+64 prefill back to back, nothing in between.

For each phase: the median SM clock, power draw and temperature, and the clock-event reasons
nvidia-smi reported (the bits it sets when the clock is held below its top), with the kernel time
that phase measured. It changes no setting of the card: it only reads them.

    python3 scripts/gpu/clock_probe.py [--loop-s 3]

Writes $OUT/clock_probe.json and $OUT/clocks.csv (every sample).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import time
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
FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def parse_samples(text: str) -> list[dict]:
    """nvidia-smi's CSV lines (no header, no units) as dicts; lines it could not fill are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue
        try:
            when = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append(dict(t=when, sm_mhz=float(parts[1]), mem_mhz=float(parts[2]), power_w=float(parts[3]),
                            temp_c=float(parts[4]), reasons=parts[5]))
        except ValueError:
            continue
    return out


def summarise(samples: list[dict], t0: float, t1: float) -> dict:
    """Median clock, power and temperature of the samples in [t0, t1], and every reason seen with its count."""
    inside = [s for s in samples if t0 <= s["t"] <= t1]
    if not inside:
        return {"samples": 0}
    reasons: dict[str, int] = {}
    for s in inside:
        reasons[s["reasons"]] = reasons.get(s["reasons"], 0) + 1
    return dict(samples=len(inside), sm_mhz=statistics.median(s["sm_mhz"] for s in inside),
                sm_mhz_min=min(s["sm_mhz"] for s in inside), sm_mhz_max=max(s["sm_mhz"] for s in inside),
                power_w=statistics.median(s["power_w"] for s in inside),
                power_w_max=max(s["power_w"] for s in inside),
                temp_c=max(s["temp_c"] for s in inside), reasons=reasons)


def timed(launch, sets, repeats: int) -> dict:
    """Kernel time by CUPTI under the sweep's protocol: median, p20 and p80 in µs."""
    t = KernelTimer(DEV).time(launch, sets, warmup=3, repeats=repeats)
    return {"kernel_us": round(t.median_us, 2), "p20_us": round(t.p20_us, 2), "p80_us": round(t.p80_us, 2)}


def run_layout(lay: Layout, phase, loop_s: float) -> None:
    """The layout's timed prefill and decode phases, then (loop_s > 0) its prefill back to back."""
    big = make_sets(16384, 2048, 16, lay, default_kv_len(16384, 2048), dtype=torch.bfloat16, device=DEV)
    small = make_sets(16, 2048, 16, lay, default_kv_len(16, 2048), dtype=torch.bfloat16, device=DEV)
    phase(f"prefill-timed {lay}", lambda: timed(gluon_sm90.launch_prefill, big, 20))
    phase(f"decode-timed {lay}", lambda: timed(gluon_sm90.launch_decode, small, 100))
    if loop_s <= 0:
        return

    def loop() -> dict:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < loop_s:
            for _ in range(20):
                gluon_sm90.launch_prefill(big[n % len(big)])
                n += 1
            torch.cuda.synchronize()
        return {"calls": n, "ms_per_call": round((time.perf_counter() - t0) * 1e3 / n, 3)}

    phase(f"prefill-loop {lay}", loop)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loop-s", type=float, default=3.0, help="seconds of back-to-back prefills")
    opt = ap.parse_args()
    out, log = lab_output()
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for q in ("CLOCK", "POWER", "PERFORMANCE"):
        log(subprocess.run(["nvidia-smi", "-q", "-d", q], capture_output=True, text=True).stdout)
    csv = out / "clocks.csv"
    with csv.open("w") as fh:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "20"],
                               stdout=fh, stderr=subprocess.DEVNULL)
        phases: list[dict] = []

        def phase(name: str, fn) -> None:
            torch.cuda.synchronize()
            t0 = time.time()
            extra = fn() or {}
            torch.cuda.synchronize()
            phases.append(dict(phase=name, t0=t0, t1=time.time(), **extra))
            log(f"{name}: {time.time() - t0:.2f} s {extra}")

        try:
            time.sleep(1.0)
            phase("idle", lambda: time.sleep(1.0))
            phase("matmul", lambda: warm_clocks(DEV, 3.0))
            for lay in (Layout(512, 64), Layout(448, 64)):
                run_layout(lay, phase, opt.loop_s if lay == Layout(512, 64) else 0.0)
                torch.cuda.empty_cache()
            time.sleep(0.2)
        finally:
            smi.terminate()
            smi.wait()
    samples = parse_samples(csv.read_text())
    log(f"{len(samples)} clock samples")
    for p in phases:
        p["clocks"] = summarise(samples, p["t0"], p["t1"])
        c = p["clocks"]
        if c["samples"]:
            log(f"{p['phase']:26} SM {c['sm_mhz']:6.0f} MHz (min {c['sm_mhz_min']:.0f}, max {c['sm_mhz_max']:.0f})  "
                f"power {c['power_w']:5.0f} W (max {c['power_w_max']:.0f})  {c['temp_c']:.0f} C  "
                f"reasons {c['reasons']}  {({k: v for k, v in p.items() if k.endswith('_us') or k.startswith('ms')})}")
        else:
            log(f"{p['phase']:26} no samples")
    save_results(out, "clock_probe", phases=phases)
    log("done")


if __name__ == "__main__":
    main()
