"""Kernel tuning lab: time variants of the Triton prefill and split-K decode side by side on one GPU.

Every variant is one kernel with one set of launch options (tile config, split count, PDL,
partial dtype, split-by-width). They are compiled first in parallel worker processes (Triton's
on-disk cache is shared, so this process then loads them), then timed here one after another
with the sweep's GpuTimer (L2 flush and GPU-side hold before each call, median of N), and each
output is checked against the torch reference on the same inputs. Ratios against the first
variant of each group are measured in the same run, so they hold on a noisy machine.

Writes $OUT/lab.json and prints one table per group. Run on the device machine from the
repository root (docs/benchmarks.md gives the exact command):
    python3 scripts/gpu/kernel_lab.py [--only prefill|decode|floor] [--repeats N] [--workers N] [--kv-dtype NAME]
``--kv-dtype float8_e4m3fn`` (or another fp8 name) times tile configs and conversions for an fp8 pool beside the
bf16 q instead (``FP8_CANDIDATES``; sessions 23, 24).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import triton_decode, triton_prefill  # noqa: E402
from dispatcher.kernels.torch_ref import ragged_prefill as torch_ref  # noqa: E402
from dispatcher.kernels.triton_prefill import TileConfig  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import GpuTimer, KernelTimer  # noqa: E402

V32 = Layout(512, 64)
SESSION1 = dict(pdl=False)  # session 1's decode launched its reduce without PDL
# Rounds 1-4 (docs/benchmarks.md, "Kernel tuning, session 2") ran at commits 17c3d0d and 20136d8, whose lab
# also timed two options since dropped for gaining nothing (split-by-width, 16-bit partials). This list
# re-times, at the current code, session 1's configs against the chosen ones and their nearest neighbours.


# Tile configs and conversions for an fp8 pool. Session 23: the bf16 choice spills with ``.to()``'s conversion
# (104-216 bytes of stack). Session 24: the PTX conversion (dispatcher/kernels/fp8_ptx.py) keeps the loads
# asynchronous; (32,4,2) and (64,8,2) with 4 chains then compile without spills, and (32,4,2) became FP8_CONFIG.
# ``kv8`` None is the launch's own choice (the PTX conversion on sm_89+), 0 forces ``.to()``. (S24-1 also timed an
# integer-op e4m3 conversion, since dropped: docs/benchmarks.md, session 24.) FP8_GLUON: the Hopper partial kernel
# reading the pool's bytes (gluon_sm90, session 24), by its stage count.
FP8_GLUON = [("gluon partials, 3 stages (DECODE_SM90_FP8)", (3,)), ("gluon partials, 2 stages", (2,))]
FP8_CANDIDATES = [("bf16's config (64,4,2) 4 chains, .to()", (64, 4, 2, 4), 0),
                  ("(64,4,2) 4 chains, PTX", (64, 4, 2, 4), None), ("(32,4,2) 4 chains, PTX", (32, 4, 2, 4), None),
                  ("(64,8,2) 4 chains, PTX", (64, 8, 2, 4), None), ("(32,4,2) one chain, PTX", (32, 4, 2, 1), None)]


def variants(kv_dtype: str | None = None) -> list[dict]:
    """(group, name, kernel, config, launch kwargs, programs per SM) for every variant timed; with ``kv_dtype``
    (an fp8 pool) the FP8_CANDIDATES for both kernels."""
    if kv_dtype is not None:
        out = [dict(group=g, name=n, kernel=g, config=c, kw={} if kv8 is None else {"kv8": kv8}, per_sm=None,
                    kv_dtype=kv_dtype) for g in ("prefill", "decode") for n, c, kv8 in FP8_CANDIDATES]
        return out + [dict(group="decode", name=n, kernel="decode", impl="gluon", config=c, kw={}, per_sm=None,
                           kv_dtype=kv_dtype) for n, c in FP8_GLUON]
    pre = [("session 1: (64,4,2) one chain", (64, 4, 2, 1)), ("(64,4,2) 2 chains", (64, 4, 2, 2)),
           ("chosen: (64,4,2) 4 chains", (64, 4, 2, 4)), ("(64,4,3) 4 chains", (64, 4, 3, 4)),
           ("(32,2,2) 4 chains", (32, 2, 2, 4))]
    out = [dict(group="prefill", name=n, kernel="prefill", config=c, kw={}, per_sm=None) for n, c in pre]
    dec = [("session 1: (32,4,2) one chain", (32, 4, 2, 1), SESSION1, None),
           ("session 1 + PDL", (32, 4, 2, 1), {}, None),
           ("session 1 + 4 chains", (32, 4, 2, 4), SESSION1, None),
           ("chosen: (64,4,2) 4 chains, PDL", (64, 4, 2, 4), {}, None),
           ("chosen, no PDL", (64, 4, 2, 4), SESSION1, None),
           ("chosen, topk_length given", (64, 4, 2, 4), {"with_length": True}, None),
           ("(32,4,2) 4 chains, PDL", (32, 4, 2, 4), {}, None), ("(64,4,3) 4 chains, PDL", (64, 4, 3, 4), {}, None),
           ("chosen, 1 program/SM", (64, 4, 2, 4), {}, 1), ("chosen, 4 programs/SM", (64, 4, 2, 4), {}, 4)]
    out += [dict(group="decode", name=n, kernel="decode", config=c, kw=kw, per_sm=p) for n, c, kw, p in dec]
    return out


_LENGTHS: dict[int, object] = {}


def with_length(a):
    """The same call with topk_length given (every row full), so the kernel skips counting indices >= 0."""
    key = a.index.indices.data_ptr()
    if key not in _LENGTHS:
        rows, width = a.index.indices.shape
        _LENGTHS[key] = a.index._replace(topk_length=torch.full((rows,), width, dtype=torch.int32, device=a.q.device))
    return a._replace(index=_LENGTHS[key])


def launcher(v: dict):
    if v.get("impl") == "gluon":
        from dispatcher.kernels import gluon_sm90

        sm90 = gluon_sm90.Sm90Config(*v["config"])
        return lambda a: gluon_sm90.launch_decode(a, config=sm90)
    cfg = TileConfig(*v["config"])
    if v["kernel"] == "prefill":
        return lambda a: triton_prefill.launch(a, config=cfg, **v["kw"])

    kw = dict(v["kw"])
    length = kw.pop("with_length", False)

    def fn(a):
        if length:
            a = with_length(a)
        splits = None
        if v["per_sm"]:
            splits = triton_decode.choose_splits(a.q.shape[0], 1, a.index.indices.shape[1], cfg.block_n,
                                                 triton_decode.sm_count(a.q.device), v["per_sm"])
        triton_decode.launch(a, config=cfg, splits=splits, **kw)
    return fn


def _compile(v: dict) -> tuple[str, str | None, float]:
    """Worker: run the variant once on a small call with the timed calls' specialisation (fills the cache)."""
    t0 = time.perf_counter()
    try:
        a = make_sets(2, 2048, 16, V32, default_kv_len(2, 2048), dtype=torch.bfloat16, device=torch.device("cuda"),
                      kv_dtype=pool_dtype(v))[0]
        launcher(v)(a)
        torch.cuda.synchronize()
        return v["name"], None, time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - reported, and the variant is skipped
        return v["name"], f"{exc.__class__.__name__}: {str(exc)[:300]}", time.perf_counter() - t0


def pool_dtype(v: dict) -> torch.dtype | None:
    """The kv pool's dtype a variant is timed with (None: q's, bf16)."""
    return getattr(torch, v["kv_dtype"]) if v.get("kv_dtype") else None


def warm_clocks(dev: torch.device, seconds: float) -> None:
    """Run bf16 matrix products for ``seconds`` so the GPU's clocks are up before anything is timed."""
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            x @ x
        torch.cuda.synchronize()


WS_TRIALS = ("TRACE",)  # the flags besides NO_*: a trace, or a variant on trial (right answers; session 29's
# MCHAIN_ONCE, the default since session 30)


def ws_flags_on(flags) -> None:
    """Turn on the warp-specialised kernel's experiment flags (``NO_*``, ``WS_TRIALS``; globals of
    ``gluon_sm90_ws_parts``, which its partitions read): before anything compiles.

    A name that is not such a flag fails here, instead of setting an attribute no kernel reads.
    """
    from triton.experimental.gluon import language as gl

    from dispatcher.kernels import gluon_sm90_ws_parts

    for flag in flags:
        if not (flag.startswith("NO_") or flag in WS_TRIALS) or not isinstance(getattr(gluon_sm90_ws_parts, flag, None),
                                                                             gl.constexpr):
            raise ValueError(f"gluon_sm90_ws_parts has no timing flag {flag!r}")
        setattr(gluon_sm90_ws_parts, flag, gl.constexpr(True))


def interleaved_event_times(runs: dict, repeats: int) -> dict[str, list[float]]:
    """Each launch's time by a CUDA event pair, µs, sorted: ``repeats`` rounds, each launching every run in turn.

    Interleaving puts every run under the same clocks and neighbours, so their ratios hold in one process.
    """
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) * 1e3)
    return {name: sorted(ts) for name, ts in times.items()}


def answers_of(variants: dict, args) -> dict[str, torch.Tensor]:
    """Each launcher's output for the same call (the output NaN-filled before each), by name: for side-by-side labs."""
    answers = {}
    for name, fn in variants.items():
        args.output.fill_(float("nan"))
        fn(args)
        torch.cuda.synchronize()
        answers[name] = args.output.clone()
    return answers


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    d = (got.float() - ref.float()).norm()
    return float(d / ref.float().norm().clamp_min(1e-30))


def time_group(timers: dict[str, GpuTimer], group: list[dict], rows: list[int], repeats: int, log) -> list[dict]:
    dev = torch.device("cuda")
    found = []
    for r in rows:
        sets = make_sets(r, 2048, 16, V32, default_kv_len(r, 2048), dtype=torch.bfloat16, device=dev,
                         kv_dtype=pool_dtype(group[0]) if group else None)
        ref_args = sets[0]._replace(output=torch.empty(sets[0].output.shape, dtype=torch.float32, device=dev))
        torch_ref(ref_args)
        ref = ref_args.output.clone()
        base = None
        for v in group:
            if v.get("error"):
                continue
            fn = launcher(v)
            a = sets[0]._replace(output=torch.full_like(sets[0].output, float("nan")))
            fn(a)
            err = rel_err(a.output, ref)
            for how, timer in timers.items():
                t = timer.time(fn, sets, warmup=3, repeats=repeats if r < 4096 else max(10, repeats // 5))
                base = base or {}
                base.setdefault(how, t.median_us)
                row = dict(group=v["group"], name=v["name"], config=list(v["config"]), kw=v["kw"],
                           per_sm=v["per_sm"], rows=r, timer=t.timer, median_us=t.median_us, p20_us=t.p20_us,
                           p80_us=t.p80_us, rel_err=err, ok=err < 1e-2, vs_first=t.median_us / base[how])
                found.append(row)
                log(f"{v['group']:7} {r:6} rows {how:6} {v['name']:28} {t.median_us:9.1f} us  (p20 {t.p20_us:.1f}, "
                    f"p80 {t.p80_us:.1f})  x{row['vs_first']:.3f}  err {err:.1e}{'' if row['ok'] else '  WRONG'}")
    return found


@triton.jit
def _touch(p, PDL: tl.constexpr, WAIT: tl.constexpr):
    if PDL:
        triton_decode.gdc_launch_dependents()
    if WAIT:
        triton_decode.gdc_wait()
    tl.store(p + tl.program_id(0), 1.0)


@torch.no_grad()
def floor(timers: dict[str, GpuTimer], repeats: int) -> list[dict]:
    """What an empty call costs: one tiny Triton launch, and two (with and without PDL), by each timer given."""
    buf = torch.zeros(1024, device="cuda")
    one = lambda a: _touch[(132,)](buf, PDL=False, WAIT=False)  # noqa: E731
    two = lambda a: (_touch[(132,)](buf, PDL=False, WAIT=False), _touch[(132,)](buf, PDL=False, WAIT=False))  # noqa: E731
    pdl = lambda a: (_touch[(132,)](buf, PDL=True, WAIT=False),  # noqa: E731
                     _touch[(132,)](buf, PDL=False, WAIT=True, launch_pdl=True))
    sets = [None]
    found = []
    for name, fn in (("one empty launch", one), ("two empty launches", two), ("two, second by PDL", pdl)):
        for how, timer in timers.items():
            t = timer.time(fn, sets, warmup=3, repeats=repeats)
            found.append(dict(group="floor", name=f"{name} [{how}]", timer=t.timer, median_us=t.median_us,
                              p20_us=t.p20_us, p80_us=t.p80_us))
    return found


def lab_output():
    """($OUT, created; a log that prints each line with the seconds since this call), for the GPU labs."""
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    return out, log


def save_results(out: Path, name: str, **payload) -> Path:
    """Write ``{"device": this GPU's name, **payload}`` to $OUT/``name``.json, as every GPU lab does at its end."""
    path = out / f"{name}.json"
    path.write_text(json.dumps({"device": torch.cuda.get_device_name(), **payload}, indent=1))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["prefill", "decode", "floor"])
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    ap.add_argument("--warm-s", type=float, default=2.0, help="seconds of matrix products first, to raise clocks")
    ap.add_argument("--kv-dtype", help="time FP8_CANDIDATES with a pool of this fp8 dtype (e.g. float8_e4m3fn)")
    opt = ap.parse_args()
    if opt.kv_dtype is not None and not str(opt.kv_dtype).startswith("float8"):
        ap.error(f"--kv-dtype takes an fp8 dtype name; got {opt.kv_dtype!r}")
    out, log = lab_output()
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"PDL {'available' if triton_decode.pdl_supported(torch.device('cuda')) else 'unavailable'}")
    vs = [v for v in variants(opt.kv_dtype) if opt.only in (None, v["group"])]
    with mp.get_context("spawn").Pool(opt.workers) as pool:
        for name, err, secs in pool.imap_unordered(_compile, vs):
            log(f"compiled {name} in {secs:.1f} s" + (f": FAILED {err}" if err else ""))
            for v in vs:
                if v["name"] == name:
                    v["error"] = err
    dev = torch.device("cuda")
    timer = GpuTimer(dev)
    warm_clocks(dev, opt.warm_s)
    found: list[dict] = []
    if opt.only in (None, "floor"):
        floors = {"eager": timer, "graph": GpuTimer(dev, graphs=True), "kernel": KernelTimer(dev)}
        found += floor(floors, opt.repeats)
        for r in found:
            log(f"floor   {r['name']:32} {r['median_us']:9.1f} us")
    if opt.only in (None, "decode"):
        found += time_group({"eager": timer, "graph": GpuTimer(dev, graphs=True)},
                            [v for v in vs if v["group"] == "decode"], [2, 16], opt.repeats, log)
    if opt.only in (None, "prefill"):
        found += time_group({"eager": timer}, [v for v in vs if v["group"] == "prefill"], [16384], opt.repeats, log)
    failed = [dict(name=v["name"], error=v["error"]) for v in vs if v.get("error")]
    (out / "lab.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "kv_dtype": opt.kv_dtype,
                                              "results": found, "failed": failed}, indent=1))
    print("\n==== best ====")
    for g, rows in (("decode", (2, 16)), ("prefill", (16384,))):
        ok = [r for r in found if r["group"] == g and r["ok"] and r["timer"] == "cuda-events"]
        names = {r["name"] for r in ok}
        if not names:
            continue
        score = {n: sum(r["median_us"] for r in ok if r["name"] == n) for n in names
                 if all(any(r["name"] == n and r["rows"] == k for r in ok) for k in rows)}
        for n in sorted(score, key=score.get)[:4]:
            print(g, n, " ".join(f"{r['rows']}: {r['median_us']:.1f} us" for r in ok if r["name"] == n))
    log("done")


if __name__ == "__main__":
    main()
