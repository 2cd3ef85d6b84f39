"""Which of the demo's calls compile a kernel on the GPU, and what in them asked for it (session 23).

On an H200 the demo's latency histograms held one sample of 0.43-2.3 s (S21-1, session 2's demo run):
a call whose event pair spanned a Triton JIT compile. This runs the demo's own traffic
(``DemoRunner``, the service's dispatcher and telemetry, no HTTP server) for ``--seconds`` and
records every compile through Triton's ``jit_cache_hook`` (called on a cache miss, before the
compile): when, which kernel, the call that asked for it (model, entry, rows, kind) and how its
specialisation differs from that kernel's previous one (the arguments whose type or divisibility
changed, the constexprs that changed).

The demo warms up first on a GPU, as ``serve --demo`` does (``DemoRunner``'s warm-up: one uncounted
call of each kind the traffic makes); ``--no-warm-up`` leaves it out, to see what the traffic alone
compiles. Each compile is marked with the demo's state then (``warming up`` or ``running``).

Usage (device machine, repository root, wheels carried as for the demo):
    TRITON_CACHE_DIR=$(mktemp -d) python3 scripts/gpu/jit_probe.py [--seconds 40] [--no-warm-up]
Writes $OUT/jit_probe.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def arg_diff(prev: str, now: str) -> list[str]:
    """The ``name: type`` entries of a kernel's argument list that differ between two of Triton's reprs."""

    def args(r: str) -> dict[str, str]:
        inner = r[r.index("](") + 2: r.rindex(")")] if "](" in r else r
        out = {}
        for part in inner.split(", "):
            name, _, ty = part.partition(": ")
            out[name] = ty
        return out

    a, b = args(prev), args(now)
    return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in b if a.get(k) != b.get(k)]


def main() -> None:
    import torch
    from triton import knobs

    from kernel_lab import lab_output, save_results
    from service.app import build_demo, build_telemetry
    from service.settings import ServiceSettings
    from dispatcher import Dispatcher, detect, probe_aiter

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--no-warm-up", action="store_true", help="leave out the demo's warm-up")
    opt = ap.parse_args()
    out, log = lab_output()
    settings = ServiceSettings(demo=True, demo_warm_up=False if opt.no_warm_up else None)
    dispatcher = Dispatcher(platform=detect().with_aiter_status(probe_aiter()), policy=settings.policy())
    telemetry = build_telemetry(settings, dispatcher)
    runner = build_demo(settings, dispatcher, telemetry)
    now = {"spec": None}
    compiles: list[dict] = []
    last_repr: dict[str, str] = {}
    last_consts: dict[str, dict[str, str]] = {}
    t0 = time.perf_counter()

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 - Triton's names
        name = fn.name
        spec = now["spec"]
        names = getattr(fn.jit_function, "arg_names", [])
        consts = {}
        for k, v in compile["constants"].items():  # keyed by (argument index,) in Triton 3.6
            i = k[0] if isinstance(k, tuple) and len(k) == 1 and isinstance(k[0], int) else None
            consts[names[i] if i is not None and i < len(names) else str(k)] = str(v)
        if name in last_repr:
            before = last_consts[name]
            changed = arg_diff(last_repr[name], repr) + [f"{k}: {before.get(k)} -> {v}" for k, v in consts.items()
                                                         if before.get(k) != v]
        else:
            changed = ["(first)"]
        compiles.append({
            "t_s": round(time.perf_counter() - t0, 3), "phase": runner.state, "kernel": name,
            "call": None if spec is None else {"model": spec.model, "entry": spec.entry, "rows": spec.rows,
                                               "kind": spec.kind},
            "constexprs": consts, "changed": changed,
        })
        last_repr[name], last_consts[name] = repr, consts
        return None  # compile as usual

    knobs.runtime.jit_cache_hook = hook
    launch = runner.launch
    slow: list[dict] = []

    def traced(spec):
        now["spec"] = spec
        n = len(compiles)
        t = time.perf_counter()
        launch(spec)
        if runner.device != "cpu":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        if len(compiles) > n or dt > 0.1:
            slow.append({"t_s": round(t - t0, 3), "model": spec.model, "entry": spec.entry, "rows": spec.rows,
                         "kind": spec.kind, "wall_s": round(dt, 4), "compiles": len(compiles) - n})
        now["spec"] = None

    runner.launch = traced  # the traffic's calls (the warm-up's go through DemoRunner._launch)
    telemetry.start(flush_interval_s=settings.flush_interval_s)
    runner.start()
    time.sleep(opt.seconds)
    runner.stop()
    telemetry.close()
    c = runner.counts
    log(f"{c.prefill_calls} prefill-entry and {c.decode_path_calls} decode-entry calls; errors {c.errors} "
        f"({c.last_error}); warm-up {runner.info()['warm_up']}")
    lat = [row for row in telemetry.snapshot()["latency"] if row.get("samples")]
    # A compile inside a sampled call shows as a mean far above the bucket's p90 (quantiles come from buckets).
    outliers = [row for row in lat if row["mean_s"] > 3 * (row["p90_s"] or 0)]
    log(f"telemetry: {len(lat)} latency rows, {sum(r['samples'] for r in lat)} samples; rows whose mean is over 3x "
        f"their p90: {[(r['model'], r['rows_bucket'], r['samples'], round(r['mean_s'], 4)) for r in outliers]}")
    for rec in compiles:
        log(f"compile at {rec['t_s']:7.2f}s [{rec['phase']}] {rec['kernel']:<22} call {rec['call']} "
            f"changed {rec['changed'][:6]}")
    for rec in slow:
        log(f"slow call at {rec['t_s']:7.2f}s: {rec}")
    save_results(out, "jit_probe", warm_up=runner.info()["warm_up"], seconds=opt.seconds, compiles=compiles,
                 slow_calls=slow, latency=lat,
                 counts={"prefill": c.prefill_calls, "decode": c.decode_path_calls, "errors": c.errors})


if __name__ == "__main__":
    main()
