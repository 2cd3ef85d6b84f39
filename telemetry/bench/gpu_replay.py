"""GPU replay: what telemetry at default sampling costs in throughput, and how close its event timing is to CUPTI.

    python -m telemetry.bench.gpu_replay --out gpu_replay.json

Three phases on one GPU, the same mixed prefill/decode calls through the real dispatcher:

1. throughput: telemetry off vs on (default sampling), in alternating blocks, under
   ``torch.cuda.set_sync_debug_mode("error")`` (any host-device sync raises); loss % of calls/s;
   then the same comparison with both arms bare (an A/A control, ``throughput_aa``): when the mix
   is host-bound, interference on the host moves the comparison by several percent (S4-12/13 in
   docs/benchmarks.md), and the control says how much a reading can be trusted;
2. accuracy: every call timed (sample_every=1) under torch.profiler with CUDA activity;
   per call, telemetry's event time vs the call's CUPTI kernel time (its ``record_function``
   range on the GPU: first kernel start to last kernel end, ``dispatcher.sweep.cupti``); median
   error per rows size;
3. graph capture: one decode call captured in a CUDA graph with telemetry on; the call is
   counted as captured and no event is recorded (replays run without Python).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Any

import torch

from dispatcher import Dispatcher, Policy, detect
from dispatcher.sweep.cupti import call_name, call_seconds, spans
from dispatcher.types import GuardMode

from ..config import TelemetryConfig
from ..core import Telemetry
from .workload import make_calls


def _mix(prefill_rows: list[int], decode_rows: list[int], decodes_per_prefill: int) -> tuple:
    """A serving-like stream: each prefill (mixed with 4 decode rows) followed by pure-decode calls."""
    mix: list = []
    for i, r in enumerate(prefill_rows):
        mix.append((r, {"num_decodes": 4, "num_decode_tokens": 4, "num_prefills": 1}, "dsv4"))
        for j in range(decodes_per_prefill):
            d = decode_rows[(i + j) % len(decode_rows)]
            mix.append((d, {"num_decodes": d, "num_decode_tokens": d, "num_prefills": 0}, "glm"))
    return tuple(mix)


@contextmanager
def sync_debug_error():
    """Raise on any synchronizing CUDA call inside the block."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _replay(d: Dispatcher, calls: list, iters: int, *, strict: bool = True) -> float:
    """Seconds for ``iters`` passes; ``strict``: under sync debug mode "error" (warm-up runs without it,
    so one-time work such as Triton compilation or autotuning may synchronize)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if strict:
        with sync_debug_error():
            for _ in range(iters):
                for args, kw in calls:
                    d(*args, **kw)
    else:
        for _ in range(iters):
            for args, kw in calls:
                d(*args, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def throughput(calls: list, *, policy: Policy, blocks: int, iters: int, aa: bool = False) -> dict[str, Any]:
    """Calls per second without and with telemetry, in alternating blocks; ``aa``: both arms bare (an A/A
    control: what the comparison reads when nothing differs)."""
    platform = detect()
    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4")), platform=platform, policy=policy)
    off = Dispatcher(platform=platform, policy=policy)
    on = Dispatcher(platform=platform, policy=policy) if aa else tel.instrument(Dispatcher(platform=platform,
                                                                                          policy=policy))
    tel.start()
    try:
        _replay(off, calls, 2, strict=False)
        _replay(on, calls, 2, strict=False)
        _replay(off, calls, 1)
        _replay(on, calls, 1)
        t_off, t_on = [], []
        for b in range(blocks):
            for name in (("off", "on") if b % 2 == 0 else ("on", "off")):
                try:
                    dt = _replay(off if name == "off" else on, calls, iters)
                except RuntimeError as exc:  # e.g. a sync caught by sync debug mode: say which arm
                    raise RuntimeError(f"telemetry {name} arm: {exc}") from exc
                (t_off if name == "off" else t_on).append(dt)
        snap = tel.snapshot()
    finally:
        tel.close()
    n = len(calls) * iters
    thr_off, thr_on = n * len(t_off) / sum(t_off), n * len(t_on) / sum(t_on)
    paired = [100.0 * (b - a) / a for a, b in zip(t_off, t_on)]
    return {
        "calls_per_block": n, "blocks": blocks,
        "calls_per_s_off": thr_off, "calls_per_s_on": thr_on,
        "throughput_loss_pct": 100.0 * (thr_off - thr_on) / thr_off,
        "median_block_slowdown_pct": statistics.median(paired),
        "block_seconds_off": t_off, "block_seconds_on": t_on,
        "sync_debug_mode": "error (no sync raised)", "aa_control": aa,
        "telemetry_counts": sum(c["calls"] for c in snap["counts"]),
        "telemetry_samples": sum(x["samples"] for x in snap["latency"]),
        "telemetry_health": snap["health"], "timing": snap["timing"],
    }


def accuracy(calls: list, *, policy: Policy, repeats: int, hold_us: float = 0.0) -> dict[str, Any]:
    """Each call timed by telemetry's events and by CUPTI; ``hold_us`` > 0 keeps the GPU busy before each call.

    Without a hold, a call issued to an idle GPU has its start event run at once while the host
    is still launching, so the event span includes that wait (the host-bound case). With a hold
    (a ``torch.cuda._sleep`` queued before the call, outside its profiler range), the stream has
    work queued as in a serving loop whose host runs ahead, and the events time the kernels.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    platform = detect()
    cfg = TelemetryConfig(models=("glm", "dsv4"), sample_first=1 << 30, sample_every=1, keep_samples=True,
                          timing_pool=max(4096, 2 * len(calls) * repeats), decisions_maxlen=0)
    tel = Telemetry(cfg, platform=platform, policy=policy)
    d = tel.instrument(Dispatcher(platform=platform, policy=policy))
    for args, kw in calls:  # warm up outside the profiler
        d(*args, **kw)
    torch.cuda.synchronize()
    tel.drain_samples()
    rows_of: list[int] = []
    cycles = int(hold_us * 1e-6 * _sm_clock_hz()) if hold_us > 0 else 0
    # CUPTI's kernel records need CUDA; without it (the CPU test of this script) only CPU activity is asked for.
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            for args, kw in calls:
                if cycles:
                    torch.cuda._sleep(cycles)
                with record_function(call_name(len(rows_of))):
                    d(*args, **kw)
                rows_of.append(int(args[0].shape[0]))
        torch.cuda.synchronize()
    samples = tel.drain_samples()
    tel.close()
    cupti = call_seconds(spans(prof.events()))
    per_size: dict[int, list[tuple[float, float]]] = {}
    if len(samples) == len(rows_of):
        for i, s in enumerate(samples):
            if i in cupti and cupti[i] > 0:
                per_size.setdefault(rows_of[i], []).append((s["seconds"], cupti[i]))
    table = []
    for rows, pairs in sorted(per_size.items()):
        err = [e - c for e, c in pairs]
        rel = [100.0 * (e - c) / c for e, c in pairs]
        table.append({"rows": rows, "calls": len(pairs),
                      "event_median_s": statistics.median(e for e, _ in pairs),
                      "cupti_median_s": statistics.median(c for _, c in pairs),
                      "median_error_s": statistics.median(err), "median_error_pct": statistics.median(rel)})
    return {"timed_calls": len(samples), "profiled_calls": len(rows_of), "matched": len(samples) == len(rows_of),
            "cupti_calls_found": len(cupti), "hold_us": hold_us, "per_size": table}


def _sm_clock_hz() -> float:
    """The GPU's peak SM clock (what ``torch.cuda._sleep`` counts cycles of); 1.98 GHz if torch cannot say."""
    try:
        return float(torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate) * 1e3
    except Exception:  # noqa: BLE001 - older torch without clock_rate
        return 1.98e9


def graph_capture(calls: list, *, policy: Policy) -> dict[str, Any]:
    platform = detect()
    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), sample_first=1 << 30), platform=platform, policy=policy)
    d = tel.instrument(Dispatcher(platform=platform, policy=policy))
    args, kw = next(c for c in calls if c[0][0].shape[0] <= 16)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            d(*args, **kw)  # warm up on the side stream, as torch.cuda.graph requires
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            d(*args, **kw)
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
        snap = tel.snapshot()
        result = {"ok": True, "graph_captured": snap["graph_captured"], "health": snap["health"]}
    except Exception as exc:  # noqa: BLE001 - report, do not hide
        result = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
    tel.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the JSON result here")
    ap.add_argument("--prefill-rows", default="512,1024,2048", help="comma-separated prefill call sizes")
    ap.add_argument("--decode-rows", default="2,4,16", help="comma-separated pure-decode call sizes")
    ap.add_argument("--decodes-per-prefill", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--kv-rows", type=int, default=65536)
    ap.add_argument("--blocks", type=int, default=10, help="alternating off/on blocks")
    ap.add_argument("--iters", type=int, default=20, help="passes over the call mix per block")
    ap.add_argument("--profile-repeats", type=int, default=5)
    ap.add_argument("--guard", choices=[g.value for g in GuardMode], default="observe")
    ap.add_argument("--aa", action="store_true",
                    help="only the A/A control: both throughput arms without telemetry (every run also measures it "
                         "after the comparison, as throughput_aa: what the comparison reads when nothing differs)")
    ap.add_argument("--hold-us", type=float, default=300.0,
                    help="GPU busy-wait queued before each accuracy call, so the host's launch time stays outside "
                         "the events (0: none); the unheld, host-bound table is measured as well")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_replay needs a CUDA/ROCm device", file=sys.stderr)
        return 2
    mix = _mix([int(x) for x in a.prefill_rows.split(",")], [int(x) for x in a.decode_rows.split(",")],
               a.decodes_per_prefill)
    calls = make_calls(len(mix), heads=a.heads, nope=512, rope=64, topk=a.topk, kv_rows=a.kv_rows,
                       dtype=torch.bfloat16, device="cuda", mix=mix)
    policy = Policy(guard=GuardMode(a.guard))
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "platform": detect().to_dict(),
        "policy": policy.to_dict(), "mix_calls": len(calls),
        "command": " ".join(["python -m telemetry.bench.gpu_replay"] + (argv if argv is not None else sys.argv[1:])),
    }
    phases = (("throughput", lambda: throughput(calls, policy=policy, blocks=a.blocks, iters=a.iters, aa=a.aa)),
              ("throughput_aa", lambda: throughput(calls, policy=policy, blocks=a.blocks, iters=a.iters, aa=True)),
              ("accuracy", lambda: accuracy(calls, policy=policy, repeats=a.profile_repeats, hold_us=a.hold_us)),
              ("accuracy_unheld", lambda: accuracy(calls, policy=policy, repeats=a.profile_repeats)),
              ("graph_capture", lambda: graph_capture(calls, policy=policy)))
    if a.aa:
        phases = phases[:1]
    failed = False
    for name, run in phases:
        try:
            result[name] = run()
        except Exception as exc:  # noqa: BLE001 - one phase failing still reports the others
            failed = True
            result[name] = {"error": f"{exc.__class__.__name__}: {exc}"}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    _print(result)
    return 1 if failed else 0


def _print(r: dict[str, Any]) -> None:
    for name in ("throughput", "throughput_aa", "accuracy", "accuracy_unheld", "graph_capture"):
        if "error" in r.get(name, {}):
            print(f"{name}: FAILED {r[name]['error']}")
    t = r["throughput"]
    if "error" in t or "error" in r.get("accuracy", {}):
        print(json.dumps(r, indent=2)[:4000])
        return
    print(f"device {r['device']}  torch {r['torch']}  timing {t['timing']}  mix {r['mix_calls']} calls")
    for tt in (t, r.get("throughput_aa")):
        if not tt or "error" in tt:
            continue
        print(f"throughput{' (A/A control: both arms bare)' if tt.get('aa_control') else ''}  "
              f"off {tt['calls_per_s_off']:.0f} calls/s  on {tt['calls_per_s_on']:.0f} calls/s  "
              f"loss {tt['throughput_loss_pct']:.2f}%  (median block {tt['median_block_slowdown_pct']:.2f}%)  "
              f"sync debug: {tt['sync_debug_mode']}")
    for key, what in (("accuracy", "GPU kept busy before each call"), ("accuracy_unheld", "calls as issued")):
        acc = r.get(key) or {}
        if "per_size" not in acc:
            continue
        print(f"event timing against CUPTI, {what} (hold {acc.get('hold_us', 0):.0f} µs):")
        print(f"{'rows':>6} {'calls':>6} {'event p50 µs':>13} {'CUPTI p50 µs':>13} {'err p50 µs':>11} {'err p50 %':>10}")
        for row in acc["per_size"]:
            print(f"{row['rows']:>6} {row['calls']:>6} {row['event_median_s'] * 1e6:>13.1f} "
                  f"{row['cupti_median_s'] * 1e6:>13.1f} {row['median_error_s'] * 1e6:>11.1f} "
                  f"{row['median_error_pct']:>10.1f}")
        if not acc["matched"]:
            print(f"{key}: {acc['timed_calls']} timed vs {acc['profiled_calls']} profiled calls: not matched")
    if "graph_capture" in r:
        print(f"graph capture: {r['graph_capture']}")


if __name__ == "__main__":
    raise SystemExit(main())
