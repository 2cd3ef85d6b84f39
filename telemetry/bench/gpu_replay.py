"""GPU replay: what telemetry at default sampling costs in throughput.

    python -m telemetry.bench.gpu_replay --out gpu_replay.json

The same mixed prefill/decode calls through the real dispatcher, telemetry off vs on (default
sampling), in alternating blocks, under ``torch.cuda.set_sync_debug_mode("error")`` (any
host-device sync raises); loss % of calls/s; then the same comparison with both arms bare (an
A/A control, ``throughput_aa``): when the mix is host-bound, interference on the host moves the
comparison by several percent (docs/benchmarks.md, "Telemetry on the GPU"), and the control says
how much a reading can be trusted. How true telemetry's latencies are is ``routescope bench
fidelity``; what graph replays cost and count, ``routescope bench graphs``.
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
from dispatcher.outputs import OutputPathError, check_file, write_or_keep
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


def throughput(calls: list, *, policy: Policy, blocks: int, iters: int, aa: bool = False,
               stamps: bool = True) -> dict[str, Any]:
    """Calls per second without and with telemetry, in alternating blocks; ``aa``: both arms bare (an A/A
    control: what the comparison reads when nothing differs); ``stamps=False``: the kernels write none, so sampled
    calls are timed by gated event pairs, as vLLM's and AITER's are."""
    from .fidelity import unstamped_registry

    platform = detect()
    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4")), platform=platform, policy=policy)

    def bare() -> Dispatcher:
        return Dispatcher(platform=platform, policy=policy, registry=None if stamps else unstamped_registry())

    off = bare()
    on = bare() if aa else tel.instrument(bare())
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m telemetry.bench.gpu_replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="write the JSON result here")
    ap.add_argument("--prefill-rows", default="512,1024,2048", help="comma-separated prefill call sizes")
    ap.add_argument("--decode-rows", default="2,4,16", help="comma-separated pure-decode call sizes")
    ap.add_argument("--decodes-per-prefill", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--kv-rows", type=int, default=65536)
    ap.add_argument("--blocks", type=int, default=10, help="alternating off/on blocks")
    ap.add_argument("--iters", type=int, default=20, help="passes over the call mix per block")
    ap.add_argument("--guard", choices=[g.value for g in GuardMode], default="observe")
    ap.add_argument("--no-stamps", action="store_true",
                    help="the kernels write no stamps (as vLLM's and AITER's): sampled calls are timed by gated pairs")
    ap.add_argument("--aa", action="store_true",
                    help="only the A/A control: both throughput arms without telemetry (every run also measures it "
                         "after the comparison, as throughput_aa: what the comparison reads when nothing differs)")
    a = ap.parse_args(argv)
    try:
        out = check_file(a.out, "--out")
    except OutputPathError as exc:
        ap.exit(2, f"{ap.prog}: {exc}\n")
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
    stamps = not a.no_stamps
    phases = (("throughput", lambda: throughput(calls, policy=policy, blocks=a.blocks, iters=a.iters, aa=a.aa,
                                                stamps=stamps)),
              ("throughput_aa", lambda: throughput(calls, policy=policy, blocks=a.blocks, iters=a.iters, aa=True,
                                                   stamps=stamps)))
    if a.aa:
        phases = phases[:1]
    failed = False
    for name, run in phases:
        try:
            result[name] = run()
        except Exception as exc:  # noqa: BLE001 - one phase failing still reports the others
            failed = True
            result[name] = {"error": f"{exc.__class__.__name__}: {exc}"}
    _, write_failed = write_or_keep(out, json.dumps(result, indent=2), "--out")
    _print(result)
    if write_failed:
        print(f"{ap.prog}: {write_failed}", file=sys.stderr)
    return 1 if failed or write_failed else 0


def _print(r: dict[str, Any]) -> None:
    for name in ("throughput", "throughput_aa"):
        if "error" in r.get(name, {}):
            print(f"{name}: FAILED {r[name]['error']}")
    t = r["throughput"]
    if "error" in t:
        return
    print(f"device {r['device']}  torch {r['torch']}  timing {t['timing']}  mix {r['mix_calls']} calls")
    for tt in (t, r.get("throughput_aa")):
        if not tt or "error" in tt:
            continue
        print(f"throughput{' (A/A control: both arms bare)' if tt.get('aa_control') else ''}  "
              f"off {tt['calls_per_s_off']:.0f} calls/s  on {tt['calls_per_s_on']:.0f} calls/s  "
              f"loss {tt['throughput_loss_pct']:.2f}%  (median block {tt['median_block_slowdown_pct']:.2f}%)  "
              f"sync debug: {tt['sync_debug_mode']}")


if __name__ == "__main__":
    raise SystemExit(main())
