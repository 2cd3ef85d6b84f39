"""`routescope bench live`: split-K / prefill ratios timed live, back to back, against a latency table's.

A table is timed under the sweep's protocol (each call alone, the GPU held before it). Serving runs calls
back to back. This times both in-tree kernels as a serving loop would call them: a stream of calls, no
sync, no hold, no L2 flush between them, each call's kernel time from CUPTI (torch.profiler: first kernel
start to last kernel end), on the sweep's own inputs (``dispatcher.sweep.inputs``: one kv pool of the given
size, queries and indices cycling over it). Per (layout, pool, rows) it keeps the median of each kernel.

``compare`` sets those ratios beside what ``advise``'s latency model predicts at the same shape and pool,
and places both crossovers (the smallest row count from which the prefill is no slower than split-K, to
within the sweep's tolerance, at every larger row count timed). On a CPU the host clock times torch
kernels: that checks the plumbing, not any GPU figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Annotated, NamedTuple, Optional

import typer

from dispatcher.pools import format_bytes, parse_bytes, pool_bucket

from .latency import LatencyModel, Miss, Shape
from .tables import LatencyTable

PREFILL, SPLIT = "intree.ragged_prefill", "intree.sparse_decode"
DEFAULT_ROWS = tuple(1 << i for i in range(1, 10))  # 2 ... 512
BOUND = 0.05  # the bound on predicted against live ratios
TOLERANCE = 0.05  # as the sweep's: prefill/split-K up to 1 + this counts as the prefill no slower


class LivePoint(NamedTuple):
    """Both kernels' median live kernel time at one shape and pool (µs)."""

    layout: str
    kv_pool_bytes: int
    rows: int
    topk: int
    prefill_us: float
    split_us: float
    calls: int
    clock: str

    @property
    def ratio(self) -> float:
        """split-K time / prefill time (> 1: the prefill is faster)."""
        return self.split_us / self.prefill_us


def _stream(launch: Callable, sets: list, calls: int, name: Callable[[int], str], first: int, cuda: bool) -> None:
    import torch

    from torch.profiler import record_function

    for i in range(calls):
        with record_function(name(first + i)):
            launch(sets[i % len(sets)])
    if cuda:
        torch.cuda.synchronize()


def measure(device_name: str = "auto", *, layouts: Sequence[str] = ("448+64", "512+0"),
            pools: Sequence[int] = (8 << 20, 256 << 20), rows: Sequence[int] = DEFAULT_ROWS, topk: int = 2048,
            heads: int = 16, calls: int = 40, rounds: int = 2,
            on_step: Callable[[str], None] | None = None) -> list[LivePoint]:
    """Each (layout, pool, rows): ``rounds`` x (a prefill stream, a split-K stream) of ``calls`` calls each."""
    import torch

    from dispatcher.kernels.registry import default_registry
    from dispatcher.sweep.grid import parse_layouts, pool_slots
    from dispatcher.sweep.inputs import make_pool, make_sets
    from dispatcher.types import Kernel

    cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    registry = default_registry()
    impls = {k: registry.resolve(Kernel(k), device.type) for k in (PREFILL, SPLIT)}
    out: list[LivePoint] = []
    for layout in parse_layouts(",".join(layouts)):
        for size in pools:
            pool = make_pool(pool_slots(size, layout, 2), layout.head_dim, dtype=torch.bfloat16, device=device)
            for n in rows:
                if on_step is not None:
                    on_step(f"{layout} pool {format_bytes(size)} rows {n}")
                sets = make_sets(n, topk, heads, layout, pool.shape[0], dtype=torch.bfloat16, device=device,
                                 pool=pool)
                for impl in impls.values():  # compiles, and the first calls' one-off costs, before any timing
                    for a in sets[:3]:
                        impl.launch(a)
                if cuda:
                    torch.cuda.synchronize()
                plan = [(kernel, impl.launch) for _ in range(rounds) for kernel, impl in impls.items()]
                samples = _timed_streams([launch for _, launch in plan], sets, calls, cuda)
                times = {k: [] for k in impls}
                for (kernel, _), got in zip(plan, samples):
                    times[kernel] += got
                out.append(LivePoint(str(layout), size, n, topk, statistics.median(times[PREFILL]),
                                     statistics.median(times[SPLIT]), calls * rounds, "cupti" if cuda else "host"))
                del sets
            del pool
            if cuda:
                torch.cuda.empty_cache()
    return out


def _timed_streams(launches: list[Callable], sets: list, calls: int, cuda: bool) -> list[list[float]]:
    """µs of each call of each back-to-back stream (one stream per launch, in turn; a sync between streams)."""
    if not cuda:
        out = []
        for launch in launches:
            samples = []
            for i in range(calls):
                t0 = time.perf_counter()
                launch(sets[i % len(sets)])
                samples.append((time.perf_counter() - t0) * 1e6)
            out.append(samples)
        return out
    from torch.profiler import ProfilerActivity, profile

    from dispatcher.sweep.cupti import call_name, call_seconds, spans

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for j, launch in enumerate(launches):
            _stream(launch, sets, calls, call_name, j * calls, cuda)
    seconds = call_seconds(spans(prof.events()))
    total = calls * len(launches)
    missing = [i for i in range(total) if i not in seconds]
    if missing:
        raise RuntimeError(f"the profiler recorded no GPU range for {len(missing)} of {total} calls; "
                           "kernel time needs CUPTI's CUDA activity")
    return [[seconds[j * calls + i] * 1e6 for i in range(calls)] for j in range(len(launches))]


class Compared(NamedTuple):
    """One point: the live ratio, the table's (None: not priced, and why), and how far apart."""

    layout: str
    kv_pool_bytes: int
    rows: int
    live: float
    predicted: float | None
    error: float | None  # predicted / live - 1
    reason: str = ""


def predicted_ratio(model: LatencyModel, p: LivePoint) -> tuple[float | None, str]:
    """split-K / prefill at ``p``'s shape and pool, by the model's estimate; (None, why) if it has no price."""
    shape = Shape(p.topk, p.layout, "bfloat16", "bfloat16", pool_bucket(p.kv_pool_bytes))
    priced = [model.price(k, shape, p.rows, p.rows, p.rows) for k in (SPLIT, PREFILL)]
    for x in priced:
        if isinstance(x, Miss):
            return None, x.reason
    split, prefill = (x.seconds[0, 1, 0] for x in priced)  # type: ignore[union-attr]
    return float(split / prefill), ""


def crossover(ratios: dict[int, float], tolerance: float = TOLERANCE) -> int | None:
    """Smallest row count from which the prefill is no slower (prefill/split-K <= 1 + tolerance) at every larger
    one; None if it is slower at the largest."""
    found = None
    for rows in sorted(ratios, reverse=True):
        if 1.0 / ratios[rows] <= 1.0 + tolerance:
            found = rows
        else:
            break
    return found


def compare(points: Sequence[LivePoint], table: LatencyTable, *, bound: float = BOUND) -> dict:
    """Per point the live and predicted ratio; per (layout, pool) both crossovers; whether all lie within ``bound``."""
    model = LatencyModel([table])
    rows_out: list[Compared] = []
    for p in points:
        pred, why = predicted_ratio(model, p)
        rows_out.append(Compared(p.layout, p.kv_pool_bytes, p.rows, p.ratio, pred,
                                 None if pred is None else pred / p.ratio - 1.0, why))
    groups: dict[tuple[str, int], list[Compared]] = {}
    for c in rows_out:
        groups.setdefault((c.layout, c.kv_pool_bytes), []).append(c)
    crossings = []
    for (layout, pool), cs in groups.items():
        live = crossover({c.rows: c.live for c in cs})
        pred = crossover({c.rows: c.predicted for c in cs}) if all(c.predicted for c in cs) else None
        crossings.append({"layout": layout, "kv_pool_bytes": pool, "kv_pool": format_bytes(pool), "live": live,
                          "predicted": pred, "equal": live == pred})
    errors = [abs(c.error) for c in rows_out if c.error is not None]
    return {
        "table": table.meta.describe(), "table_commit": table.meta.commit, "bound": bound,
        "points": [c._asdict() for c in rows_out],
        "within_bound": bool(errors) and len(errors) == len(rows_out) and max(errors) <= bound,
        "worst_error": max(errors) if errors else None,
        "crossovers": crossings,
    }


def live_command(
    table: Annotated[Optional[str], typer.Option(help="latency table to compare with: h200 or a JSON file")] = "h200",
    layout: Annotated[str, typer.Option(help="head layouts")] = "448+64,512+0",
    kv_pool: Annotated[str, typer.Option(help="kv pool sizes (bytes, or 8MiB, 256MiB)")] = "8MiB,256MiB",
    rows: Annotated[str, typer.Option(help="row counts")] = ",".join(map(str, DEFAULT_ROWS)),
    topk: Annotated[int, typer.Option(help="top-k")] = 2048,
    calls: Annotated[int, typer.Option(help="calls per stream")] = 40,
    rounds: Annotated[int, typer.Option(help="streams per kernel and point, kernels taking turns")] = 2,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    out: Annotated[Optional[str], typer.Option(help="also write the JSON here")] = None,
) -> None:
    """Time split-K and the no-split prefill back to back, live; compare their ratio with the table's."""
    import json
    from pathlib import Path

    from dispatcher.outputs import OutputPathError, check_file, write_or_keep
    from dispatcher.sweep.grid import SweepArgError, parse_int_list, parse_layouts

    from .tables import TableError, load_table

    def fail(message: str, code: int = 2) -> typer.Exit:
        typer.echo(f"routescope bench live: {message}", err=True)
        return typer.Exit(code)

    if device not in ("auto", "cpu", "cuda"):
        raise fail(f"--device must be auto, cpu or cuda; got {device!r}")
    if calls < 1 or rounds < 1 or topk < 1:
        raise fail("--calls, --rounds and --topk must each be at least 1")
    try:
        layouts = [str(x) for x in parse_layouts(layout)]
        pools = tuple(parse_bytes(p) for p in kv_pool.split(",") if p.strip())
        row_list = parse_int_list(rows, "rows", maximum=1 << 16)
        if out:
            check_file(out, "--out")
        loaded = load_table(table) if table else None
    except TableError as exc:
        raise fail(f"--table: {exc}") from None
    except (ValueError, SweepArgError, OutputPathError) as exc:
        raise fail(str(exc)) from None
    if not pools:
        raise fail("--kv-pool needs at least one size")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise fail("--device cuda: no CUDA device is visible to torch")
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    points = measure(device, layouts=layouts, pools=pools, rows=row_list, topk=topk, calls=calls,
                     rounds=rounds, on_step=lambda s: typer.echo(f"bench live: {s}", err=True))
    doc: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "clock": "cupti" if cuda else "host"}
    if not cuda:
        doc["note"] = ("host clock around torch kernels on a CPU: this checks the plumbing, not any GPU figure; its "
                       "ratios set beside a GPU table's say nothing of the table")
    doc["points"] = [p._asdict() for p in points]
    if loaded is not None:
        doc["comparison"] = compare(points, loaded)
    text = json.dumps(doc, indent=1)
    failed = write_or_keep(Path(out), text + "\n", "--out")[1] if out else None
    typer.echo(text)
    if failed:
        raise fail(failed, 1)


if __name__ == "__main__":  # python3 -m advise.live, where the console script is not installed (a GPU machine)
    typer.run(live_command)
