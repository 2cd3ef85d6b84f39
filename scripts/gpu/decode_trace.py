"""Where a split-K decode call's time goes, from cycle stamps the partial kernel writes (TRACE=True).

Each partial program stamps %clock64 at its start, once its prologue's copies are issued, once
the row's length is known, as each tile lands and as its products finish, and after its stores;
%globaltimer at its start and end places the programs against each other. The calls are timed
as GpuTimer does (an L2 flush and a GPU-side hold before each, CUDA events around it), traced
and untraced side by side, so the stamps' own cost shows. Answers are checked against the torch
reference. Writes $OUT/decode_trace.json (decode_trace_len.json with --with-len); prints medians
over programs and calls.

With ``--ws`` the partials come from the warp-specialised kernel (``gluon_sm90_ws``, its partitions'
flag ``gluon_sm90_ws_parts.TRACE`` set before anything compiles, in a Triton cache of its own): the loader stamps its
first copies, softmax warpgroup 0 the item's q, and P·V each tile's P arriving and its product
done.

Usage (device machine, repository root):
    python3 scripts/gpu/decode_trace.py [--rows 16 2] [--calls 30] [--ws | --config 2,0,0,1,0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

if "--ws" in sys.argv:  # the traced build must not share a cache with the production one
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ws_trace_cache_")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dispatcher.kernels import gluon_sm90, gluon_sm90_ws, gluon_sm90_ws_parts, triton_decode  # noqa: E402
from dispatcher.kernels.torch_ref import ragged_prefill as torch_ref  # noqa: E402
from dispatcher.kernels.triton_prefill import pack  # noqa: E402
from dispatcher.sweep.grid import Layout, default_kv_len  # noqa: E402
from dispatcher.sweep.inputs import make_sets  # noqa: E402
from dispatcher.sweep.timing import HOLD_CYCLES, L2_FLUSH_BYTES  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_lab import rel_err, warm_clocks  # noqa: E402

DEV = torch.device("cuda")
# Since session 17 the row's length is reduced under tile 0's scores, after tile 0 has landed (before
# that, stamp 2 came before stamp 3; the old traces' phases were "copies issued -> length known ->
# tile 0 landed").
PHASES = [("start -> copies issued", 0, 1), ("copies issued -> tile 0 landed", 1, 3),
          ("tile 0 landed -> length known", 3, 2)]
WS_PHASES = [("start -> loader partition starts", 0, 19), ("start -> softmax warpgroup 0 starts", 0, 21),
             ("loader starts -> its first copies issued", 19, 1), ("start -> loader's first copies issued", 0, 1),
             ("first copies issued -> q ready", 1, 2), ("q ready -> tile 0's P ready", 2, 3)]
WS = "--ws" in sys.argv


def decode(a, splits, cfg, trace=None, rtrace=None):
    p = pack(a)
    rows, heads, _ = a.q.shape
    part_o = torch.empty((rows, splits, heads, p.lanes), dtype=gluon_sm90.partial_dtype(a.q.dtype), device=DEV)
    part_lse = torch.empty((rows, splits, heads), dtype=torch.float32, device=DEV)
    if WS:
        gluon_sm90_ws.launch_partials_ws(a, part_o, part_lse, splits, pdl=True, trace=trace)
    else:
        gluon_sm90.launch_partials(a, part_o, part_lse, splits, config=cfg, pdl=True, trace=trace)
    triton_decode.reduce_partials(part_o, part_lse, p, a.output, splits, True, trace=rtrace)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 2])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--ws", action="store_true", help="the warp-specialised kernel's partials")
    ap.add_argument("--config", type=lambda v: gluon_sm90.Sm90Config(*[int(x) for x in v.split(",")]),
                    default=gluon_sm90.DECODE_SM90, help="the partial kernel's Sm90Config fields (512+64: two "
                    "stages), e.g. 2,0,1,1,0 for ABLATE 1")
    ap.add_argument("--with-len", action="store_true",
                    help="topk_length given (every row full): no count in the kernel")
    opt = ap.parse_args()
    if opt.ws:
        from triton.experimental.gluon import language as gl

        gluon_sm90_ws_parts.TRACE = gl.constexpr(True)
    out = Path(os.environ.get("OUT", "out/gpu"))
    out.mkdir(parents=True, exist_ok=True)
    warm_clocks(DEV, 2.0)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=DEV)
    cfg = opt.config
    result = {"device": torch.cuda.get_device_name(), "kernel": "gluon_sm90_ws" if opt.ws else "gluon_sm90",
              "config": list(cfg), "topk_length_given": opt.with_len, "runs": []}
    for rows in opt.rows:
        lay = Layout(512, 64)
        sets = make_sets(rows, 2048, 16, lay, default_kv_len(rows, 2048), dtype=torch.bfloat16, device=DEV)
        if opt.with_len:
            full = torch.full((rows,), 2048, dtype=torch.int32, device=DEV)
            sets = [s._replace(index=s.index._replace(topk_length=full)) for s in sets]
        ref = sets[0]._replace(output=torch.empty(sets[0].output.shape, dtype=torch.float32, device=DEV))
        torch_ref(ref)
        p = pack(sets[0])
        splits = triton_decode.choose_splits(rows, 1, p.width, 64, triton_decode.sm_count(DEV),
                                             per_sm=1 if opt.ws else gluon_sm90.DECODE_PER_SM[cfg.stages])
        programs = rows * splits
        trace = torch.zeros((programs, 24), dtype=torch.int64, device=DEV)
        s_block, l_block = triton_decode.reduce_blocks(splits, p.lanes)
        rtrace = torch.zeros((rows * 16 * -(-p.lanes // l_block), 4), dtype=torch.int64, device=DEV)
        a = sets[0]._replace(output=torch.full_like(sets[0].output, float("nan")))
        decode(a, splits, cfg, trace, rtrace)
        torch.cuda.synchronize()
        err = rel_err(a.output, ref.output)
        events = {"traced": [], "untraced": []}
        stamps, rstamps = [], []
        for i in range(opt.calls + 3):
            for how in ("traced",) if opt.ws else ("untraced", "traced"):  # --ws: one build, TRACE on
                s = sets[i % len(sets)]
                flush.zero_()
                torch.cuda._sleep(HOLD_CYCLES)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                decode(s, splits, cfg, *((trace, rtrace) if how == "traced" else (None, None)))
                e1.record()
                torch.cuda.synchronize()
                if i >= 3:
                    events[how].append(e0.elapsed_time(e1) * 1e3)
                    if how == "traced":
                        stamps.append(trace.cpu().tolist())
                        rstamps.append(rtrace.cpu().tolist())
        phases: dict[str, list[float]] = {}
        starts, ends, ghz = [], [], []
        tiles = -(-(-(-2048 // splits)) // 64)
        for call in stamps:
            t0 = min(r[22] for r in call)
            starts += [(r[22] - t0) / 1e3 for r in call]
            ends += [(r[23] - t0) / 1e3 for r in call]
            for r in call:
                span_ns = r[23] - r[22]
                if span_ns > 0:
                    ghz.append((r[20] - r[0]) / span_ns)
        clock = med(ghz)
        reduce_ = {"first start": [], "first released": [], "median released": [], "last released": [], "last end": []}
        for call, rcall in zip(stamps, rstamps):  # the reduce against the partials' last end
            t_end = max(r[23] for r in call)
            reduce_["first start"].append((min(r[0] for r in rcall) - t_end) / 1e3)
            reduce_["first released"].append((min(r[1] for r in rcall) - t_end) / 1e3)
            reduce_["median released"].append((med([r[1] for r in rcall]) - t_end) / 1e3)
            reduce_["last released"].append((max(r[1] for r in rcall) - t_end) / 1e3)
            reduce_["last end"].append((max(r[2] for r in rcall) - t_end) / 1e3)
        landed, done = ("P ready", "P·V done") if opt.ws else ("landed", "products done")
        steps = (WS_PHASES if opt.ws else PHASES) + [
            (f"tile {t} {landed} -> {done}", 3 + 2 * t, 4 + 2 * t) for t in range(tiles)]
        steps += [(f"tile {t} {done} -> tile {t + 1} {landed}", 4 + 2 * t, 5 + 2 * t) for t in range(tiles - 1)]
        steps += [(f"tile {tiles - 1} done -> stores done", 4 + 2 * (tiles - 1), 20), ("start -> stores done", 0, 20)]
        for name, i0, i1 in steps:
            phases[name] = [(r[i1] - r[i0]) / clock / 1e3 for call in stamps for r in call]
        run = {"rows": rows, "splits": splits, "programs": programs, "rel_err": err, "sm_ghz": clock,
               "event_us": {k: med(v) for k, v in events.items()},
               "start_skew_us": {"median": med(starts), "max": max(starts)},
               "end_us": {"median": med(ends), "max": max(ends)},
               "reduce_after_partials_end_us": {k: med(v) for k, v in reduce_.items()},
               "phases_us": {k: {"median": med(v), "max": max(v)} for k, v in phases.items()}}
        result["runs"].append(run)
        print(f"\n{rows} rows, {splits} splits, {programs} programs, rel err {err:.1e}, SM clock {clock:.2f} GHz")
        print("  event: " + ", ".join(f"{k} {v:.1f} us" for k, v in run["event_us"].items() if v == v))
        print(f"  program starts after the first: median {med(starts):.2f} us, max {max(starts):.2f} us")
        print(f"  program ends after the first start: median {med(ends):.2f} us, max {max(ends):.2f} us")
        for k, v in run["phases_us"].items():
            print(f"  {k:40} median {v['median']:6.2f} us   max {v['max']:6.2f} us")
        for k, v in run["reduce_after_partials_end_us"].items():
            print(f"  reduce {k:33} {v:6.2f} us after the partials' last end (median over calls)")
    name = "decode_trace_ws" if opt.ws else "decode_trace_len" if opt.with_len else "decode_trace"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
