"""`routescope bench`: telemetry's own cost, measured (loaded lazily by routescope/cli.py)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..config import MAX_FRAME_NS

bench_app = typer.Typer(name="bench", help="Measure what routescope costs per call and how true its clocks are.",
                        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@bench_app.callback()
def _bench() -> None:
    """Measure what routescope costs per call and how true its clocks are."""


def _parse_rows(text: str) -> tuple[int, ...]:
    """--rows as explain and sweep read it (dispatcher/inputs.py), capped where tensors are allocated."""
    from dispatcher.inputs import MAX_TENSOR_ROWS, InputError, parse_rows_list

    try:
        return parse_rows_list(text, "--rows", maximum=MAX_TENSOR_ROWS)
    except InputError as exc:
        typer.echo(f"routescope bench: {exc}", err=True)
        raise typer.Exit(2) from None


def _emit(result: dict, as_json: bool, render) -> None:  # noqa: ANN001 - a renderer of this result
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        render(result)


@bench_app.command("host")
def host_command(
    rows: Annotated[str, typer.Option(help="comma-separated rows per call")] = "2,16,1024",
    batch: Annotated[int, typer.Option(min=1, help="calls issued per timed batch")] = 20,
    batches: Annotated[int, typer.Option(min=3, help="timed batches (the median is reported)")] = 51,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Host µs per call: torch no-op, Triton no-op, each kernel's launch, the whole dispatcher call (one run)."""
    from .host import render, run

    _emit(run(rows=_parse_rows(rows), batch=batch, batches=batches), as_json, render)


@bench_app.command("fidelity")
def fidelity_command(
    rows: Annotated[str | None, typer.Option(
        help="comma-separated rows per call (default 1,2,16,256,1024,4096; with --graphs, 2 and 16 on split-K and "
             "2,16,256,4096 on the prefill kernel)")] = None,
    calls: Annotated[int, typer.Option(min=5, help="calls per size and regime")] = 60,
    guard: Annotated[str, typer.Option(help="observe: decodes on the prefill kernel; reroute: on split-K")] = "observe",
    layout: Annotated[str, typer.Option(help="head layout, nope+rope (512+64, 448+64, 512+0) or an alias")] = "512+64",
    frame_ns: Annotated[int, typer.Option(
        min=-1, max=MAX_FRAME_NS, envvar="ROUTESCOPE_TELEMETRY_DEVICE_FRAME_NS",
        help="kernel frame added to stamped spans (telemetry.clocks.frame); -1: measured for the GPU model")] = -1,
    stamps: Annotated[bool, typer.Option(
        "--stamps/--no-stamps",
        help="--no-stamps: the kernels write none (as vLLM's and AITER's), timed by plain and by gated event pairs")] = True,
    gated_frame_ns: Annotated[int, typer.Option(
        min=-1, max=MAX_FRAME_NS, envvar="ROUTESCOPE_TELEMETRY_GATED_FRAME_NS",
        help="ns taken off each gated pair (telemetry.clocks.gate); -1: the value measured for the GPU model")] = -1,
    graphs: Annotated[bool, typer.Option(
        "--graphs", help="with --no-stamps: calls replayed in CUDA graphs of 1 and 8 calls, synced and back to back, "
                         "timed by each graph clock (graph: event pairs; bracket: stamp kernels)")] = False,
    replays: Annotated[int, typer.Option(min=8, help="with --graphs: replays per graph, clock and regime")] = 40,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Telemetry's per-call latency against CUPTI's kernel time of the same calls, GPU idle and back to back."""
    import torch

    from dispatcher.sweep.grid import parse_layouts

    from .fidelity import DEFAULT_ROWS, render, run

    if guard not in ("observe", "reroute"):
        raise typer.BadParameter("observe or reroute", param_hint="--guard")
    try:
        layouts = parse_layouts(layout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--layout") from exc
    if len(layouts) != 1:
        raise typer.BadParameter("one layout", param_hint="--layout")
    if graphs and stamps:
        raise typer.BadParameter("--graphs times kernels that write no stamps: add --no-stamps", param_hint="--graphs")
    parsed = _parse_rows(rows) if rows is not None else None
    if not torch.cuda.is_available():
        typer.echo("bench fidelity needs a CUDA device: CUPTI's kernel time is its reference", err=True)
        raise typer.Exit(2)
    if graphs:
        from . import graph_fidelity

        label = "split-K" if guard == "reroute" else "prefill kernel"
        cases = graph_fidelity.CASES if parsed is None else tuple((label, guard, r) for r in parsed)
        _emit(graph_fidelity.run(cases=cases, replays=replays, layout=layouts[0],
                                 progress=lambda text: typer.echo(f"bench fidelity --graphs: {text}", err=True)),
              as_json, graph_fidelity.render)
        return
    _emit(run(rows=parsed or DEFAULT_ROWS, calls=calls, guard=guard, layout=layouts[0], frame_ns=frame_ns,
              stamps=stamps, gated_frame_ns=gated_frame_ns), as_json, render)


@bench_app.command("graphs")
def graphs_command(
    calls: Annotated[int, typer.Option(min=1, help="instrumented calls captured in the graph")] = 64,
    replays: Annotated[int, typer.Option(min=10, help="replays per timed round")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Host µs that replay accounting adds per CUDAGraph.replay(), and the counts after the replays."""
    from .graphs import render, run

    _emit(run(calls=calls, replays=replays), as_json, render)


@bench_app.command("overhead")
def overhead_command(
    calls: Annotated[int, typer.Option(min=64, help="calls per pass (a fixed prefill/mixed/decode mix)")] = 2000,
    repeats: Annotated[int, typer.Option(min=3, help="interleaved passes per variant")] = 61,
    real: Annotated[bool, typer.Option("--real/--no-real", help="also run with real (small) torch kernels")] = True,
    multiprocess: Annotated[bool, typer.Option("--multiprocess", help="also run in prometheus multiprocess mode")] = False,
    processes: Annotated[int, typer.Option(
        min=1, max=64, help="also repeat the no-op run in this many fresh processes, one after another, and give "
                            "the median over them (a process's memory layout moves its figure by tens of ns)")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Host ns per call: bare dispatcher, with telemetry, with naive prometheus_client calls (same calls, one run)."""
    from .overhead import run, run_multiprocess, run_processes

    result = run(calls=calls, repeats=repeats, real=real)
    if multiprocess:
        result["multiprocess"] = run_multiprocess(calls=calls, repeats=repeats)
    if processes > 1:
        def progress(i: int, n: int) -> None:
            typer.echo(f"bench overhead: fresh process {i + 1} of {n}", err=True)

        result["processes"] = run_processes(calls=calls, repeats=repeats, processes=processes, progress=progress)
    _emit(result, as_json, _render)


@bench_app.command("multiproc")
def multiproc_command(
    processes: Annotated[str, typer.Option(help="process counts to scrape, comma-separated")] = "8,64,256",
    kills: Annotated[int, typer.Option(min=0, help="workers killed with kill -9 at random instants (0: none)")] = 8,
    repeats: Annotated[int, typer.Option(min=0, help="corrupt-file recoveries timed (0: none)")] = 5,
    scrapes: Annotated[int, typer.Option(min=1, help="scrapes timed per reader and directory (the median)")] = 5,
    load: Annotated[float, typer.Option(hidden=True, help="moved to `routescope bench serve`")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Multiprocess directory: /metrics cost beside prometheus_client's by process count (classic and native files),
    calls lost per kill -9, time to recover a corrupt file. Latency under load: `routescope bench serve`."""
    if load:
        typer.echo("routescope bench multiproc: --load is now `routescope bench serve` (it starts `serve --demo` "
                   "beside --writers real writer processes, 8 by default; --writers 0: no directory)", err=True)
        raise typer.Exit(2)
    from .reliability import render, run

    from dispatcher.inputs import InputError, parse_rows_list

    try:
        counts = parse_rows_list(processes, "--processes", maximum=4096)
    except InputError as exc:
        typer.echo(f"routescope bench: {exc}", err=True)
        raise typer.Exit(2) from None
    result = run(kills=kills, repeats=repeats, processes=counts, scrapes=scrapes,
                 progress=lambda text: typer.echo(f"bench multiproc: {text}", err=True))
    _emit(result, as_json, render)


def _diff(r: dict, key: str) -> str:
    """A paired difference with its band, "(noise)" where the band is wider than it."""
    d, band = r[f"{key}_ns"], r.get(f"{key}_band_ns")
    if band is None:
        return f"{d:.0f}"
    return f"{d:.0f} ± {band:.0f}" + ("" if d > band else " (noise)")


def overhead_cells(r: dict) -> list[str]:
    """One run's row after its name: medians, paired differences ± band, the ratio or why there is none."""
    ratio = r["naive_over_instrumented_overhead"]
    po = r["probe_only_ns_per_call"]
    return [f"{r['bare_ns_per_call']:.0f}", f"{r['instrumented_ns_per_call']:.0f}",
            f"{r['naive_prometheus_ns_per_call']:.0f}", _diff(r, "instrumented_minus_bare"),
            _diff(r, "naive_minus_bare"),
            "n/a (noise)" if ratio is None else f"{ratio:.1f}×", _diff(r, "empty_probe_minus_bare"),
            f"{po['instrumented']:.0f} / {po['naive_prometheus']:.0f}"]


def _render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    runs = [("no-op kernel", result["noop_kernel"])]
    if "real_kernels" in result:
        r = result["real_kernels"]
        runs.append((f"real torch kernels ({r['calls']} calls, {r['repeats']} passes)", r))
    if "multiprocess" in result:
        runs.append(("no-op kernel, multiprocess", result["multiprocess"]))
    table = Table("run", "bare ns/call", "instrumented", "naive prometheus", "instr − bare", "naive − bare",
                  "naive/instr overhead", "empty probe − bare", "probe only: instr / naive")
    for name, r in runs:
        table.add_row(name, *overhead_cells(r))
    console.print(table)
    if "processes" in result:
        p = result["processes"]
        console.print(f"no-op run in {p['processes']} fresh processes: instr − bare "
                      f"{', '.join(f'{v:.0f}' for v in p['instrumented_minus_bare_ns'])} ns; median "
                      f"{p['instrumented_minus_bare_median_ns']:.0f} ns (naive − bare median "
                      f"{p['naive_minus_bare_median_ns']:.0f} ns)")
    n = result["noop_kernel"]
    console.print(f"no-op run: {n['kernel_note']}. Host CPU ns per call (thread time), medians over "
                  f"{n['repeats']} interleaved passes of {n['calls']} calls; differences are medians of per-pass "
                  "differences ± half their interquartile range (never less than their gap to the difference of the "
                  "medians), '(noise)' where the band is wider than the difference. 'empty probe' is a probe whose methods do nothing: the cost of the probe "
                  "protocol itself, included in 'instr − bare'. 'probe only': start+stop alone on the same calls.")


@bench_app.command("series")
def series_command(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Series per rank in each histogram mode (both, native, classic), as Prometheus stores them, at a
    production-like traffic (2 models, 4 kernels, every rows bucket)."""
    from .series import render, run

    _emit(run(), as_json, render)


@bench_app.command("quantiles")
def quantiles_command(
    calls: Annotated[int, typer.Option(min=10, help="calls per model and rows bucket (rows at random inside it)")] = 150,
    max_rows: Annotated[int, typer.Option(min=1, help="the last rows bucket is the one holding this")] = 2048,
    device: Annotated[str, typer.Option(help="cuda (device clock, full shapes) or cpu; default: cuda if present")] = "",
    min_samples: Annotated[int, typer.Option(min=1, help="series with fewer samples are left out")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Exact latency quantiles against histogram_quantile on the classic and the native buckets; scrape sizes."""
    import torch

    from .quantiles import render, run

    if device not in ("", "cpu", "cuda"):
        typer.echo(f"routescope bench: --device must be cuda or cpu (or empty: cuda if present); got {device!r}", err=True)
        raise typer.Exit(2)
    if device == "cuda" and not torch.cuda.is_available():
        typer.echo("routescope bench: --device cuda: no CUDA/ROCm device is visible to torch", err=True)
        raise typer.Exit(2)

    if calls < min_samples:  # a series holds one kernel's calls of one model and rows bucket: --calls at most
        typer.echo(f"routescope bench: --calls {calls} gives each series at most {calls} samples, fewer than "
                   f"--min-samples {min_samples}: nothing would be compared", err=True)
        raise typer.Exit(2)
    _emit(run(calls=calls, max_rows=max_rows, device=device or None, min_samples=min_samples,
              progress=lambda text: typer.echo(f"bench quantiles: {text}", err=True)), as_json, render)
