"""Hopper lab: the Gluon wgmma kernels (dispatcher/kernels/gluon_sm90.py) against the Triton ones, on one GPU.

1. A smoke call per kernel (small shapes), so a broken kernel shows before anything long runs.
2. Correctness at full shapes: every case of dispatcher/sweep/correctness.py in bf16 and fp16,
   through launchers that take the Hopper kernel where ``gluon_sm90.supports()`` and Triton
   elsewhere (the log says how many cases each took).
3. Timing, side by side in this run: the prefill at 16,384 rows and the split-K decode at 2 and
   16 rows (bf16, H=16, top-k 2048), eager and CUDA-graph replayed, with the sweep's GpuTimer, and
   by kernel time (the sweep's KernelTimer: CUPTI, first kernel start to last kernel end, with the
   event pair of the same profiled calls beside it as "eager-profiled").
   Beside the real kernels, rows with parts of the work taken out (every index -1, no products,
   only the first tile gathered, the partial pass without its reduce) place the floors; their
   answers are wrong on purpose, their timings are real (docs/benchmarks.md, S7-3).

Writes $OUT/sm90_lab.json. Usage (device machine, repository root):
    python3 scripts/gpu/sm90_lab.py [--skip-checks] [--only prefill|decode] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, gluon_sm90_ws, gluon_sm90_ws_d512, triton_decode, triton_prefill  # noqa: E402
from dispatcher.kernels.gluon_sm90 import Sm90Config  # noqa: E402
from dispatcher.kernels.torch_ref import ragged_prefill as torch_ref  # noqa: E402
from dispatcher.sweep.correctness import run_checks  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import GpuTimer, KernelTimer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import lab_output, rel_err, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
ROUTED = {"sm90": 0, "triton": 0}


def either(sm90, fallback):
    def fn(a):
        if gluon_sm90.supports(a):
            ROUTED["sm90"] += 1
            sm90(a)
        else:
            ROUTED["triton"] += 1
            fallback(a)
    return fn


def variants(only: str | None) -> list[tuple[str, str, object, list[int], Layout]]:
    """(group, name, launch, rows, layout)."""
    v32, v0 = Layout(512, 64), Layout(512, 0)
    out = []

    def pre(cfg):
        return lambda a: gluon_sm90.launch_prefill(a, config=cfg)

    def dec(splits, cfg, pdl=None, ws=None):
        return lambda a: gluon_sm90.launch_decode(a, splits=splits, config=cfg, pdl=pdl, ws=ws)

    if only in (None, "prefill"):
        for lay, tag in ((v32, "512+64"), (v0, "512+0")):
            out.append(("prefill " + tag, "triton (64,4,2) 4 chains", triton_prefill.launch, [16384], lay))
            out.append(("prefill " + tag, "ws, rope buffers (gluon_sm90_ws)", gluon_sm90_ws.launch_prefill_ws, [16384], lay))
            out.append(("prefill " + tag, "ws, session 4's (gluon_sm90_ws_d512)", gluon_sm90_ws_d512.launch_prefill_ws,
                        [16384], lay))
            out.append(("prefill " + tag, "default (ws_module)", pre(None), [2, 16384], lay))
            for regs in REGS:
                out.append(("prefill " + tag, f"ws worker regs {regs}", ws_regs(regs), [16384], lay))
            out.append(("prefill " + tag, "ws default, indices all -1", invalid(pre(None)), [16384], lay))
    if only in (None, "decode"):
        d = [("triton (64,4,2) 4 chains, PDL", triton_decode.launch),
             ("one warpgroup, 2 stages", dec(None, gluon_sm90.Sm90Config(2), ws=False)),
             ("default", dec(None, None)), ("default, topk_length given", with_len(dec(None, None))),
             ("ws", dec(None, None, ws=True)), ("ws, session 4's", ws4_decode)]
        out += [("decode 512+64", n, f, [2, 16], v32) for n, f in d]
        # D = 512 (GLM's layout): the default pipelines tile t - 1's P·V under tile t's softmax (S9).
        out += [("decode 512+0", "default (pipelined, 3 stages)", dec(None, None), [2, 16], v0),
                ("decode 512+0", "default, topk_length given", with_len(dec(None, None)), [2, 16], v0),
                ("decode 512+0", "2 stages, not pipelined", dec(None, Sm90Config(2), ws=False), [2, 16], v0)]
        out.append(("decode 512+64", "default, indices all -1", invalid(dec(None, None)), [16], v32))
        # Where the floor is (answers wrong, timings real): each half of the work taken out in turn, then both.
        for name, cfg in (("products only (tiles after the first stale)", Sm90Config(2, ablate=1)),
                          ("gathers only (no products)", Sm90Config(2, ablate=2))):
            out.append(("decode 512+64", name, dec(None, cfg, ws=False), [2, 16], v32))
        out.append(("decode 512+64", "neither: no products, indices all -1", invalid(dec(None, Sm90Config(2, ablate=2),
                                                                                          ws=False)), [2, 16], v32))
        out.append(("decode 512+64", "partials only (no reduce launch)", partials_only, [2, 16], v32))
        # fp32 partials (the default until S8), and the reduce two heads a program (S8-3: no faster).
        out.append(("decode 512+64", "fp32 partials", decode_with(default_partials, part_dtype=torch.float32),
                    [2, 16], v32))
        out.append(("decode 512+64", "reduce 2 heads a program, 8192 values", decode_with(
            default_partials, reduce_values=8192, reduce_heads=2), [2, 16], v32))
    return out


REGS = [(128, 152, 64)]  # worker register splits timed beside gluon_sm90_ws.WORKER_REGS (session 4's)


def ws_regs(regs):
    return lambda a: gluon_sm90_ws.launch_prefill_ws(a, worker_regs=regs)


def decode_with(partials, *, reduce: bool = True, part_dtype: torch.dtype | None = None,
                reduce_values: int | None = None, reduce_heads: int = 1):
    """A split-K decode with another partial pass: the default's splits (one program per SM) and buffers,
    then Triton's PDL-launched reduce, or (``reduce=False``) the partial pass alone. ``part_dtype``,
    ``reduce_values`` and ``reduce_heads`` (the reduce's program size and heads a program) vary what the
    default fixes."""
    def run(a):
        p = triton_prefill.pack(a)
        rows, heads, _ = a.q.shape
        splits = triton_decode.choose_splits(rows, 1, p.width, 64, triton_decode.sm_count(a.q.device), per_sm=1)
        dtype = part_dtype or gluon_sm90.partial_dtype(a.q.dtype)  # the default's unless told
        part_o = torch.empty((rows, splits, heads, p.lanes), dtype=dtype, device=a.q.device)
        part_lse = torch.empty((rows, splits, heads), dtype=torch.float32, device=a.q.device)
        partials(a, part_o, part_lse, splits, pdl=reduce)
        if reduce:
            triton_decode.reduce_partials(part_o, part_lse, p, a.output, splits, True, reduce_values,
                                          heads_per_program=reduce_heads)
    return run


def default_partials(a, part_o, part_lse, splits, pdl):
    gluon_sm90.launch_partials(a, part_o, part_lse, splits, config=gluon_sm90.DECODE_SM90, pdl=pdl)


ws4_decode = decode_with(gluon_sm90_ws_d512.launch_partials_ws)
# The default decode's partial pass alone: what the reduce adds is the default's time minus this.
partials_only = decode_with(default_partials, reduce=False)


def invalid(fn):
    """The same call with every index -1: nothing gathered (cp.async zero-fills), every other step as usual."""
    made: dict = {}

    def run(a):
        key = a.index.indices.data_ptr()
        if key not in made:
            made[key] = a.index._replace(indices=torch.full_like(a.index.indices, -1))
        fn(a._replace(index=made[key]))
    return run


def with_len(fn):
    """The same call with topk_length given (every row full): no count of valid indices in the kernel."""
    made: dict = {}

    def run(a):
        key = a.index.indices.data_ptr()
        if key not in made:  # built once per input set, outside the timed calls after the first
            rows, width = a.index.indices.shape
            made[key] = a.index._replace(topk_length=torch.full((rows,), width, dtype=torch.int32, device=a.q.device))
        fn(a._replace(index=made[key]))
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["prefill", "decode"])
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--check-decode", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="also run the decode checks with Sm90Config(*these), e.g. 3,1,0,2 or 3,0,0,1,1 (pipe)")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--warm-s", type=float, default=2.0)
    opt = ap.parse_args()
    out, log = lab_output()

    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"gluon {gluon_sm90.HAVE_GLUON}")
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}

    # 1. smoke
    for rows, lay, topk in ((3, Layout(512, 64), 300), (3, Layout(512, 0), 300), (3, Layout(448, 64), 300),
                            (5, Layout(512, 64), 100), (2, Layout(512, 64), 64), (4, Layout(512, 0), 190)):
        a = make_sets(rows, topk, 20, lay, 1000, dtype=torch.bfloat16, device=DEV)[0]
        ref_a = a._replace(output=torch.empty(a.output.shape, dtype=torch.float32, device=DEV))
        torch_ref(ref_a)
        for name, fn in (("prefill", gluon_sm90.launch_prefill), ("decode", gluon_sm90.launch_decode),
                         ("decode one warpgroup", lambda b: gluon_sm90.launch_decode(b, ws=False)),
                         ("decode ws 1 split", lambda b: gluon_sm90.launch_decode(b, splits=1, ws=True)),
                         ("decode ws 3 splits", lambda b: gluon_sm90.launch_decode(b, splits=3, ws=True)),
                         ("decode ws 7 splits", lambda b: gluon_sm90.launch_decode(b, splits=7, ws=True)),
                         ("prefill ws rope buffers", gluon_sm90_ws.launch_prefill_ws),
                         ("prefill ws session 4's", gluon_sm90_ws_d512.launch_prefill_ws), ("decode ws session 4's", ws4_decode)):
            got = a._replace(output=torch.full_like(a.output, float("nan")))
            assert gluon_sm90.supports(got), "the smoke case should take the Hopper kernel"
            fn(got)
            torch.cuda.synchronize()
            log(f"smoke {name} {lay} top-k {topk} rel err {rel_err(got.output, ref_a.output):.2e}")

    # 2. correctness
    if not opt.skip_checks:
        found = run_checks({"prefill": either(gluon_sm90.launch_prefill, triton_prefill.launch),
                            "decode": either(gluon_sm90.launch_decode, triton_decode.launch)},
                           (torch.bfloat16, torch.float16), DEV, big=True)
        if opt.check_decode:  # the decode's checks again, with the partial kernel under trial
            trial = Sm90Config(*opt.check_decode)

            def one_config(b):  # a pipelined trial serves D = 512 only; the default takes the rest
                rope = b.q.shape[2] != gluon_sm90.LANES_A
                gluon_sm90.launch_decode(b, config=None if (trial.pipe and rope) else trial)
            one = either(one_config, triton_decode.launch)
            found += [c._replace(kernel="decode*") for c in run_checks({"decode": one}, (torch.bfloat16, torch.float16),
                                                                       DEV, big=True) if c.kernel == "decode"]
        rows = [{**c._asdict(), "ok": c.ok} for c in found]
        result["checks"] = rows
        result["routed"] = dict(ROUTED)
        bad = [r for r in rows if not r["ok"]]
        for r in rows:
            log(f"check {'ok  ' if r['ok'] else 'FAIL'} {r['dtype']:8} {r['kernel']:7} rel {r['rel_err']:.2e} "
                f"{r['case']}")
        log(f"checks: {len(rows) - len(bad)}/{len(rows)} pass; calls routed {ROUTED}")

    # 3. timing
    warm_clocks(DEV, opt.warm_s)
    timers = {"eager": GpuTimer(DEV), "graph": GpuTimer(DEV, graphs=True), "kernel": KernelTimer(DEV)}
    timed = []
    cache: dict = {}
    for group, name, fn, rows_list, lay in variants(opt.only):
        for r in rows_list:
            key = (r, lay)
            if key not in cache:
                sets = make_sets(r, 2048, 16, lay, default_kv_len(r, 2048), dtype=torch.bfloat16, device=DEV)
                ref_args = sets[0]._replace(output=torch.empty(sets[0].output.shape, dtype=torch.float32, device=DEV))
                torch_ref(ref_args)
                cache = {key: (sets, ref_args.output.clone())}
            sets, ref = cache[key]
            a = sets[0]._replace(output=torch.full_like(sets[0].output, float("nan")))
            try:
                fn(a)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - reported, the variant skipped
                log(f"{group} {name} {r} rows: FAILED {exc.__class__.__name__}: {str(exc)[:400]}")
                continue
            err = rel_err(a.output, ref)
            for how, timer in timers.items():
                if how == "graph" and r > 4096:
                    continue
                reps = opt.repeats if r < 4096 else max(10, opt.repeats // 5)
                if isinstance(timer, KernelTimer):  # CUPTI's kernel time, and the event pair of the same calls
                    got = dict(zip((how, "eager-profiled"), timer.paired(fn, sets, warmup=3, repeats=reps)))
                else:
                    got = {how: timer.time(fn, sets, warmup=3, repeats=reps)}
                for clock, t in got.items():
                    timed.append(dict(group=group, name=name, rows=r, timer=clock, median_us=t.median_us,
                                      p20_us=t.p20_us, p80_us=t.p80_us, rel_err=err))
                    log(f"{group:14} {r:6} rows {clock:14} {name:32} {t.median_us:9.1f} us (p20 {t.p20_us:.1f}, "
                        f"p80 {t.p80_us:.1f}) err {err:.1e}")
        result["timed"] = timed
        (out / "sm90_lab.json").write_text(json.dumps(result, indent=1))
    (out / "sm90_lab.json").write_text(json.dumps(result, indent=1))
    log("done")


if __name__ == "__main__":
    main()
