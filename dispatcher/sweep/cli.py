"""`routescope sweep`: time kernels over rows x top-k and say where a gate between them belongs."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer

from ..inputs import COMPUTE_DTYPES, MAX_TENSOR_ROWS, InputError, check_dtype, parse_rows_list
from ..kernels.registry import default_registry
from ..outputs import OutputPathError, check_folder, write_folder_or_keep
from ..types import Kernel
from ..validate import FLOAT_DTYPES, dtype_name
from .grid import (
    CPU_KERNELS, CPU_ROWS, CPU_TOPK, DEFAULT_LAYOUTS, GPU_KERNELS, GPU_POOLS, GPU_ROWS, GPU_TOPK, HEADS,
    SweepArgError, parse_int_list, parse_kernels, parse_layouts, parse_pools, pool_names,
)
from .analysis import TOLERANCE
from .pooled import pooled_document, print_pooled, write_pooled
from .provenance import run_date, sweep_commit
from .report import device_name, document, l2_bytes, print_tables, write_all
from .runner import KernelFailed, SweepPlan, check_timer, run_sweep

DTYPES = {name: getattr(torch, name) for name in COMPUTE_DTYPES}
FP8_KV = {dtype_name(d): d for d in sorted(FLOAT_DTYPES, key=str) if d.itemsize == 1}  # the fp8 pools validate takes


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"routescope sweep: {message}", err=True)
    return typer.Exit(code)


def pick_device(name: str) -> torch.device:
    """'auto' is the GPU when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise SweepArgError(f"--device must be auto, cpu or cuda; got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise SweepArgError("--device cuda: no CUDA/ROCm device is visible to torch")
    return torch.device(name)


def build_plan(*, kernels: str | None, rows: str | None, topk: str | None, layout: str, device: str, dtype: str,
               heads: int, repeats: int | None, warmup: int, kv_len: int | None, timer: str = "events",
               kv_dtype: str | None = None, kv_pool: str | None = None, flush_l2: bool | None = None) -> SweepPlan:
    """Parse and check every option; GPU and CPU get their own defaults (a GPU's: ``GPU_POOLS``, unless
    ``kv_len`` fixes the pool's slots instead)."""
    dev = pick_device(device)
    gpu = dev.type == "cuda"
    dtype = check_dtype(dtype, DTYPES, "--dtype")
    if kv_dtype is not None:
        kv_dtype = check_dtype(kv_dtype, (dtype, *FP8_KV), "--kv-dtype (--dtype's or an fp8 one)")
    if not 1 <= heads <= 256:
        raise SweepArgError(f"--heads must be between 1 and 256; got {heads}")
    if repeats is not None and not 1 <= repeats <= 10_000:
        raise SweepArgError(f"--repeats must be between 1 and 10000; got {repeats}")
    if not 0 <= warmup <= 1000:
        raise SweepArgError(f"--warmup must be between 0 and 1000; got {warmup}")
    if kv_len is not None and kv_len < 1:
        raise SweepArgError(f"--kv-len must be positive; got {kv_len}")
    if kv_len is not None and kv_pool is not None:
        raise SweepArgError("--kv-len and --kv-pool both set the pool: give one (slots, or sizes in bytes)")
    pools = parse_pools(kv_pool) if kv_pool is not None else (GPU_POOLS if gpu and kv_len is None else ())
    check_timer(timer, dev.type)
    registry = default_registry()
    known = {k: [i.impl for i in registry.impls(k)] for k in Kernel}
    return SweepPlan(
        kernels=parse_kernels(kernels or ",".join(GPU_KERNELS if gpu else CPU_KERNELS), known),
        rows=parse_rows_list(rows, "--rows", maximum=MAX_TENSOR_ROWS) if rows else (GPU_ROWS if gpu else CPU_ROWS),
        topk=parse_int_list(topk, "topk", maximum=65536) if topk else (GPU_TOPK if gpu else CPU_TOPK),
        layouts=parse_layouts(layout),
        device=dev, dtype=DTYPES[dtype], heads=heads,
        kv_dtype=FP8_KV[kv_dtype] if kv_dtype is not None and kv_dtype != dtype else None,
        repeats=repeats if repeats is not None else (30 if gpu else 5),
        warmup=warmup, kv_len=kv_len, timer=timer, registry=registry, pools=pools, flush_l2=flush_l2,
    )


def replay_command(plan: SweepPlan, out: Path, tolerance: float = TOLERANCE) -> str:
    """The full command line that repeats this sweep, every default spelled out."""
    parts = [
        "routescope", "sweep", "--kernels", ",".join(map(str, plan.kernels)),
        "--rows", ",".join(map(str, plan.rows)), "--topk", ",".join(map(str, plan.topk)),
        "--layout", ",".join(map(str, plan.layouts)), "--heads", str(plan.heads),
        "--dtype", str(plan.dtype).removeprefix("torch."), "--repeats", str(plan.repeats),
        "--warmup", str(plan.warmup), "--device", plan.device.type,
        "--tolerance", f"{tolerance:g}", "--out", str(out),
    ]
    if plan.device.type == "cuda":  # the CPU has only the host clock: --timer is not what ran there
        parts[parts.index("--device"):parts.index("--device")] = ["--timer", plan.timer]
    if plan.kv_len:
        parts += ["--kv-len", str(plan.kv_len)]
    if plan.pools:
        parts += ["--kv-pool", pool_names(plan.pools)]
    parts.append("--flush-l2" if plan.flushes else "--no-flush-l2")
    if plan.kv_dtype is not None:
        parts += ["--kv-dtype", str(plan.kv_dtype).removeprefix("torch.")]
    return " ".join(shlex.quote(p) for p in parts)


def sweep_command(
    kernels: Annotated[Optional[str], typer.Option(help="NAME[:IMPL],... ; the first two are A and B of the ratio "
                                                   "(GPU default: triton prefill vs triton split-K; CPU: torch)")] = None,
    rows: Annotated[Optional[str], typer.Option(help="query row counts, e.g. 1,2,16,256 (default per device)")] = None,
    topk: Annotated[Optional[str], typer.Option(help="top-k (fanout) values, e.g. 128,512,2048")] = None,
    layout: Annotated[str, typer.Option(help="NOPE+ROPE head layouts, or dsv4/glm/v32")] = ",".join(DEFAULT_LAYOUTS),
    out: Annotated[Path, typer.Option(help="folder for sweep.csv, sweep.json, sweep.md, sweep.png")] = Path("out/sweep"),
    repeats: Annotated[Optional[int], typer.Option(help="timed calls per kernel and point (default 30 GPU, 5 CPU)")] = None,
    warmup: Annotated[int, typer.Option(help="untimed calls first")] = 3,
    heads: Annotated[int, typer.Option(help="query heads")] = HEADS,
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32")] = "bfloat16",
    kv_dtype: Annotated[Optional[str], typer.Option(
        help="the kv pool's dtype, if not --dtype's: an fp8 pool (float8_e4m3fn or float8_e5m2 on NVIDIA, "
             "float8_e4m3fnuz or float8_e5m2fnuz on ROCm; values used unscaled)")] = None,
    kv_len: Annotated[Optional[int], typer.Option(help="KV pool rows, one pool per point (CPU default: max(rows, "
                                                       "4 x top-k)); instead of --kv-pool")] = None,
    kv_pool: Annotated[Optional[str], typer.Option(
        help="kv pool sizes in bytes, a dimension of the sweep: each point's inputs share one pool of each "
             "(GPU default: 8MiB,256MiB,4GiB: inside an H200's 60 MiB L2, past it by 4x, and a serving "
             "cache's size)")] = None,
    flush_l2: Annotated[Optional[bool], typer.Option(
        "--flush-l2/--no-flush-l2", help="flush L2 before each timed call (default: for --kv-len pools only; "
                                         "shared pools leave L2 to hold what their size lets it)")] = None,
    commit: Annotated[Optional[str], typer.Option(
        help="the commit the tree was copied from, recorded in the JSON (default: $ROUTESCOPE_COMMIT, else the "
             "tree's own git checkout, else none)")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    timer: Annotated[str, typer.Option(help="GPU clock: events (a CUDA event pair around each call, its own "
                                            "~3 µs included) or cupti (the call's kernel time, first kernel "
                                            "start to last kernel end)")] = "events",
    tolerance: Annotated[float, typer.Option(help="A/B ratios up to 1 + this count as A no slower when placing "
                                                   "the gate")] = TOLERANCE,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON document instead of tables")] = False,
) -> None:
    """Time two or more kernels over rows x top-k; print A/B ratios, the crossover and the gate they suggest."""
    if not 0.0 <= tolerance < 1.0:
        raise _fail(f"--tolerance must be in [0, 1), got {tolerance}")
    try:
        plan = build_plan(kernels=kernels, rows=rows, topk=topk, layout=layout, device=device, dtype=dtype,
                          heads=heads, repeats=repeats, warmup=warmup, kv_len=kv_len, timer=timer,
                          kv_dtype=kv_dtype, kv_pool=kv_pool, flush_l2=flush_l2)
        out = check_folder(out, "--out")
        recorded_commit = sweep_commit(commit)
    except (SweepArgError, InputError, OutputPathError) as exc:
        raise _fail(str(exc)) from None
    except ValueError as exc:  # a --commit or ROUTESCOPE_COMMIT that is not one
        raise _fail(f"--commit: {exc}") from None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=as_json)
    total = plan.points * len(plan.kernels)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=as_json) as progress:
        task = progress.add_task("sweep", total=total)

        def step(what: str) -> None:
            progress.update(task, advance=1, description=what)

        try:
            results = run_sweep(plan, on_step=step)
        except SweepArgError as exc:
            raise _fail(str(exc)) from None
        except KernelFailed as exc:
            raise _fail(str(exc), 1) from None
    a, b = str(plan.kernels[0]), str(plan.kernels[1])
    if results:  # labels as the registry resolved them (a spec without :IMPL gets the chosen one)
        labels = list(dict.fromkeys(r.label for r in results))
        a, b = labels[0], labels[1]
    summary = dict(a=a, b=b, layouts=[str(x) for x in plan.layouts], device=device_name(plan.device),
                   command=replay_command(plan, out, tolerance), tolerance=tolerance, l2=l2_bytes(plan.device),
                   date=run_date(), commit=recorded_commit)
    if plan.pools:
        doc = pooled_document(results, pools=plan.pools, flush_l2=plan.flushes, **summary)
        paths, failed = write_folder_or_keep(out, lambda folder: write_pooled(folder, results, doc), "--out")
    else:
        doc = document(results, **summary)
        paths, failed = write_folder_or_keep(out, lambda folder: write_all(folder, results, doc), "--out")
    if as_json:
        typer.echo(json.dumps(doc, indent=1))
    else:
        if plan.pools:
            print_pooled(console, results, doc)
        else:
            print_tables(console, results, doc)
        console.print("wrote " + ", ".join(str(p) for p in paths.values()))
        if "png" not in paths:
            console.print("no heatmap: matplotlib is not installed (pip install 'routescope[sweep]')")
    if failed:
        raise _fail(failed, 1)
