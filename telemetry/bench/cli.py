"""`routescope bench`: telemetry's own cost, measured (loaded lazily by routescope/cli.py)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

bench_app = typer.Typer(name="bench", help="Measure what telemetry costs per call.", no_args_is_help=True,
                        add_completion=False, pretty_exceptions_enable=False)


@bench_app.callback()
def _bench() -> None:
    """Measure what telemetry costs per call."""


@bench_app.command("overhead")
def overhead_command(
    calls: Annotated[int, typer.Option(min=64, help="calls per pass (a fixed prefill/mixed/decode mix)")] = 2000,
    repeats: Annotated[int, typer.Option(min=3, help="interleaved passes per variant")] = 61,
    real: Annotated[bool, typer.Option("--real/--no-real", help="also run with real (small) torch kernels")] = True,
    multiprocess: Annotated[bool, typer.Option("--multiprocess", help="also run in prometheus multiprocess mode")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Host ns per call: bare dispatcher, with telemetry, with naive prometheus_client calls (same calls, one run)."""
    from .overhead import run, run_multiprocess

    result = run(calls=calls, repeats=repeats, real=real)
    if multiprocess:
        result["multiprocess"] = run_multiprocess(calls=calls, repeats=repeats)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    _render(result)


def _render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    runs = [("no-op kernel", result["noop_kernel"])]
    if "real_kernels" in result:
        runs.append(("real torch kernels", result["real_kernels"]))
    if "multiprocess" in result:
        runs.append(("no-op kernel, multiprocess", result["multiprocess"]))
    table = Table("run", "bare ns/call", "instrumented", "naive prometheus", "instr − bare", "naive − bare",
                  "naive/instr overhead", "empty probe − bare", "probe only: instr / naive")
    for name, r in runs:
        ratio = r["naive_over_instrumented_overhead"]
        po = r["probe_only_ns_per_call"]
        table.add_row(name, f"{r['bare_ns_per_call']:.0f}", f"{r['instrumented_ns_per_call']:.0f}",
                      f"{r['naive_prometheus_ns_per_call']:.0f}", f"{r['instrumented_minus_bare_ns']:.0f}",
                      f"{r['naive_minus_bare_ns']:.0f}", "n/a" if ratio is None else f"{ratio:.1f}×",
                      f"{r['empty_probe_minus_bare_ns']:.0f}",
                      f"{po['instrumented']:.0f} / {po['naive_prometheus']:.0f}")
    console.print(table)
    n = result["noop_kernel"]
    console.print(f"no-op run: {n['kernel_note']}. Host CPU ns per call (thread time), medians over "
                  f"{n['repeats']} interleaved passes of {n['calls']} calls; differences are medians of per-pass "
                  "differences. 'empty probe' is a probe whose methods do nothing: the cost of the probe "
                  "protocol itself, included in 'instr − bare'. 'probe only': start+stop alone on the same calls.")
