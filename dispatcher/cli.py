"""`routescope explain`: print the routing decision for a what-if call."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from .explain import ExplainRequest, explain
from .inputs import MAX_ROWS
from .platform import KNOWN_ARCHS
from .types import GuardMode


def validation_message(exc: ValidationError) -> str:
    """One line per bad field, named the way the user typed it (HTTP's are service/errors.py's)."""
    lines = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        flag = "--" + field.replace("_", "-") if field else "arguments"
        lines.append(f"{flag}: {plain_message(err['msg'])}")
    return "\n".join(lines)


def plain_message(msg: str) -> str:
    """pydantic's "Value error, rows must be ..." as "rows must be ..." (the check's own words)."""
    return msg.removeprefix("Value error, ")


def render(result: dict, console: Console) -> None:
    kernel = result["kernel"]
    color = "red" if result["decode_in_prefill"] else "green"
    console.print(f"[bold]{kernel}[/bold]  [{color}]{result['reason']}[/{color}]")
    console.print(
        f"rows {result['rows']}  class {result['call_class']}  decode rows {result['decode_rows']}"
        f"  platform {result['platform']['arch']} (AITER {'on' if result['platform']['aiter_enabled'] else 'off'})"
    )
    table = Table("gate", "passed", "detail")
    for g in result["gates"]:
        table.add_row(g["name"], "[green]yes[/green]" if g["passed"] else "[red]no[/red]", g["detail"])
    console.print(table)
    if result["decode_in_prefill"]:
        console.print("[red]decode rows reach a prefill kernel with no split-K[/red]")


def explain_command(
    arch: Annotated[str, typer.Option(help=f"one of {', '.join(KNOWN_ARCHS)}")] = "gfx942",
    allow_unknown_arch: Annotated[bool, typer.Option(
        "--allow-unknown-arch", help="decide for an arch outside that list (a what-if platform with no gate of "
                                     "its own)")] = False,
    rows: Annotated[Optional[int], typer.Option(help=f"q.shape[0], 1..{MAX_ROWS} (default: sum of --query-lens)")] = None,
    q_dtype: Annotated[str, typer.Option(help="torch dtype name of q")] = "bfloat16",
    kv_dtype: Annotated[Optional[str], typer.Option(help="torch dtype name of kv (default: q's)")] = None,
    out_dtype: Annotated[Optional[str], typer.Option(help="torch dtype name of output (default: q's)")] = None,
    aiter: Annotated[bool, typer.Option("--aiter/--no-aiter", help="VLLM_ROCM_USE_AITER")] = True,
    sink: Annotated[bool, typer.Option("--sink/--no-sink", help="an fp32 attention sink [H] is passed")] = False,
    layout: Annotated[str, typer.Option(help="dsv4 (448+64) or glm (512+0)")] = "dsv4",
    heads: Annotated[int, typer.Option(help="query heads")] = 16,
    topk: Annotated[int, typer.Option(help="top-k slots per row")] = 2048,
    query_lens: Annotated[Optional[str], typer.Option(help="per-request query lengths, e.g. 1,1,8000")] = None,
    spec_tokens: Annotated[int, typer.Option(help="speculative tokens: a decode has <= 1+N rows")] = 0,
    gfx942_min_rows: Annotated[Optional[int], typer.Option(envvar="ROUTESCOPE_GFX942_MIN_ROWS", help="gfx942 gate")] = None,
    gfx950_min_rows: Annotated[Optional[int], typer.Option(envvar="ROUTESCOPE_GFX950_MIN_ROWS", help="gfx950 gate")] = None,
    guard: Annotated[GuardMode, typer.Option(help="decode guard mode")] = GuardMode.OBSERVE,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Show which kernel a sparse MLA prefill call would go to, and every gate on the way."""
    fields = dict(
        arch=arch, allow_unknown_arch=allow_unknown_arch, rows=rows, q_dtype=q_dtype, kv_dtype=kv_dtype, out_dtype=out_dtype, aiter=aiter,
        sink=sink, layout=layout, heads=heads, topk=topk, query_lens=query_lens, spec_tokens=spec_tokens,
        guard=guard, gfx942_min_rows=gfx942_min_rows, gfx950_min_rows=gfx950_min_rows,
    )
    try:
        req = ExplainRequest(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        typer.echo(f"routescope explain: {validation_message(exc)}", err=True)
        raise typer.Exit(2) from None
    result = explain(req)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        render(result, Console())
