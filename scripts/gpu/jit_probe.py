"""Which of the demo's calls compile a kernel on the GPU, and what in them asked for it (session 23).

On an H200 the demo's latency histograms held one sample of 0.43-2.3 s (S21-1, session 2's demo run):
a call whose event pair spanned a Triton JIT compile. This runs the demo's own traffic
(``DemoRunner``, the service's dispatcher and telemetry, no HTTP server) for ``--seconds`` and
records every compile through Triton's ``jit_cache_hook`` (called on a cache miss, before the
compile): when, which kernel, the call that asked for it (model, entry, rows, kind) and how its
specialisation differs from that kernel's previous one (the arguments whose type or divisibility
changed, the constexprs that changed).

Usage (device machine, repository root, wheels carried as for the demo):
    TRITON_CACHE_DIR=$(mktemp -d) python3 scripts/gpu/jit_probe.py [--seconds 40] [--warm]
``--warm`` runs the demo's warm-up first (``DemoRunner.warm_up``), as ``serve --demo`` does, so the
compiles it leaves to the traffic show. Writes $OUT/jit_probe.json.
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
    ap.add_argument("--warm", action="store_true", help="run the demo's warm-up before its traffic")
    opt = ap.parse_args()
    out, log = lab_output()
    settings = ServiceSettings(demo=True)
    dispatcher = Dispatcher(platform=detect().with_aiter_status(probe_aiter()), policy=settings.policy())
    telemetry = build_telemetry(settings, dispatcher)
    runner = build_demo(settings, dispatcher, telemetry)
    now = {"spec": None, "phase": "set-up"}
    compiles: list[dict] = []
    last_repr: dict[str, str] = {}
    t0 = time.perf_counter()

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 - Triton's names
        name = fn.name
        spec = now["spec"]
        compiles.append({
            "t_s": round(time.perf_counter() - t0, 3), "phase": now["phase"], "kernel": name,
            "call": None if spec is None else {"model": spec.model, "entry": spec.entry, "rows": spec.rows,
                                               "kind": spec.kind},
            "constexprs": {str(k): str(v) for k, v in compile["constants"].items()},
            "changed": arg_diff(last_repr[name], repr) if name in last_repr else ["(first)"],
        })
        last_repr[name] = repr
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

    runner.launch = traced
    telemetry.start(flush_interval_s=settings.flush_interval_s)
    if opt.warm:
        now["phase"] = "warm-up"
        t = time.perf_counter()
        runner.warm_up()
        log(f"warm-up: {len(compiles)} compiles in {time.perf_counter() - t:.1f} s")
    now["phase"] = "traffic"
    runner.start()
    time.sleep(opt.seconds)
    runner.stop()
    telemetry.close()
    c = runner.counts
    log(f"{c.prefill_calls} prefill-entry and {c.decode_path_calls} decode-entry calls; errors {c.errors} "
        f"({c.last_error})")
    for rec in compiles:
        log(f"compile at {rec['t_s']:7.2f}s [{rec['phase']}] {rec['kernel']:<22} call {rec['call']} "
            f"changed {rec['changed'][:6]}")
    for rec in slow:
        log(f"slow call at {rec['t_s']:7.2f}s: {rec}")
    save_results(out, "jit_probe", warm=opt.warm, seconds=opt.seconds, compiles=compiles, slow_calls=slow,
                 counts={"prefill": c.prefill_calls, "decode": c.decode_path_calls, "errors": c.errors})


if __name__ == "__main__":
    main()
