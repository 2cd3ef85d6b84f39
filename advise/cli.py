"""`routescope advise`: what a gate change would cost or save on observed traffic, as a table or JSON."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from dispatcher.pools import format_bytes, parse_bytes

from .choose import choose_tables
from .policies import DEFAULT_GATES
from .report import AdviceOut, BandOut, advise, fmt_seconds, fmt_share
from .sources import (
    SourceError,
    as_demo,
    duration_seconds,
    from_demo,
    from_multiproc,
    from_prometheus,
    from_routing,
)
from .tables import TableError
from .traffic import Traffic, with_pool


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"routescope advise: {message}", err=True)
    return typer.Exit(code)


def parse_gates(text: str) -> tuple[int, ...]:
    try:
        gates = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise ValueError(f"--gates takes comma-separated row counts like 64,128,256; got {text!r}") from None
    if not gates or any(g < 1 or g > 1 << 20 for g in gates):
        raise ValueError(f"--gates values must be between 1 and 1048576; got {text!r}")
    return gates


def read_traffic(url: str | None, multiproc_dir: str | None, prometheus: str | None, range_: str | None,
                 at: str | None, selector: str, span: str | None, demo_traffic: int | None = None,
                 glm_bug: bool = False, demo_shapes: bool = False) -> Traffic:
    """The one source asked for; ValueError names the option at fault, SourceError the source."""
    if demo_shapes and not (prometheus or multiproc_dir):
        raise ValueError("--demo-shapes goes with --prometheus or --multiproc-dir (a /routing and --demo-traffic "
                         "know their demo by themselves)")
    traffic = _read_source(url, multiproc_dir, prometheus, range_, at, selector, span, demo_traffic, glm_bug)
    return as_demo(traffic) if demo_shapes else traffic


def _read_source(url: str | None, multiproc_dir: str | None, prometheus: str | None, range_: str | None,
                 at: str | None, selector: str, span: str | None, demo_traffic: int | None,
                 glm_bug: bool) -> Traffic:
    given = [name for name, v in (("--url", url), ("--multiproc-dir", multiproc_dir), ("--prometheus", prometheus),
                                  ("--demo-traffic", demo_traffic)) if v]
    if len(given) != 1:
        raise ValueError("give exactly one source: --url (a running service), --multiproc-dir DIR, "
                         "--prometheus URL --range 1h, or --demo-traffic N"
                         f"{'; got ' + ', '.join(given) if given else ''}")
    if glm_bug and not demo_traffic:
        raise ValueError("--demo-glm-bug goes with --demo-traffic")
    if demo_traffic:
        if range_ or at or selector or span:
            raise ValueError("--range, --at, --selector and --span do not go with --demo-traffic")
        return from_demo(demo_traffic, glm_bug=glm_bug)
    if prometheus:
        if not range_:
            raise ValueError("--prometheus needs --range (a Prometheus duration such as 1h or 7d)")
        try:
            duration_seconds(range_)
        except ValueError as exc:
            raise ValueError(f"--range: {exc}") from None
        return from_prometheus(prometheus, range_, at=at, selector=selector)
    if range_ or at or selector:
        raise ValueError("--range, --at and --selector go with --prometheus")
    if multiproc_dir:
        if not os.path.isdir(multiproc_dir):  # as serve and experiment say it: a bad option, exit 2
            raise ValueError(f"--multiproc-dir {multiproc_dir} is not a directory")
        try:
            span_s = duration_seconds(span) if span else None
        except ValueError as exc:
            raise ValueError(f"--span: {exc}") from None
        return from_multiproc(multiproc_dir, span_s=span_s)
    if span:
        raise ValueError("--span goes with --multiproc-dir (a service and Prometheus know their span)")
    try:
        return from_routing(url)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"--url: {exc}") from None


def _band(b: BandOut | None, *, share: bool = False, digits: int = 3) -> str:
    if b is None:
        return "–"
    if share:
        return f"{fmt_share(b.mid, sign=True)} ({fmt_share(b.low, sign=True)}…{fmt_share(b.high, sign=True)})"
    return f"{fmt_seconds(b.mid, digits)} ({fmt_seconds(b.low)}…{fmt_seconds(b.high)})"


def total_digits(totals: list[float], savings: list[float]) -> int:
    """Significant digits the totals' middles need for the smallest saving shown to be their difference (a 1 ms
    saving between two totals of 2.9 s shows as 2.9153 s against 2.9143 s, not as 2.92 s against 2.91 s)."""
    import math

    top = max((abs(t) for t in totals), default=0.0)
    low = min((abs(x) for x in savings if x), default=0.0)
    if not top or not low:
        return 3
    return min(9, max(3, math.ceil(math.log10(top / low)) + 2))


def render(out: AdviceOut, console: Console, *, every: bool = False) -> None:
    """The advice for people: each model's headline, then its candidates."""
    console.print(f"[dim]{out.prediction}[/dim]")
    if out.status != "ok":
        console.print(f"[yellow]{out.status}[/yellow]: {out.message}")
    for t in out.tables:
        console.print(f"table [bold]{t.name}[/bold]: {t.device}, {t.date}, [bold]{t.provenance}[/bold] ({t.source})")
    if out.target and out.target.note:
        console.print(f"[blue]{out.target.note}[/blue]")
    span = out.source.span_s
    console.print(f"traffic: {out.source.where}; span {f'{span:.0f} s' if span else 'unknown'} ({out.source.span_note})")
    hourly = bool(span)
    for m in out.models:
        console.print()
        console.print(f"[bold]{m.headline}[/bold]")
        per = "per hour" if hourly else "over the traffic"
        table = Table("policy", "what", f"prefill-entry kernel time {per}", f"saving {per}",
                      "share of prefill-entry time", "moved calls", "unpriced calls")
        shown = [c for c in m.candidates
                 if every or not ((c.kind == "gate" and c.name != m.best) or (c.kind == "fix" and not c.moved_calls))]
        bands = [(c.seconds_per_hour if hourly else c.seconds, c.saving_per_hour if hourly else c.saving)
                 for c in shown]
        digits = total_digits([t.mid for t, _ in bands if t], [x.mid for _, x in bands if x])
        for c, (total, saving) in zip(shown, bands):
            style = "bold green" if c.name == m.best else ("red" if c.kind == "fix" else None)
            table.add_row(c.name, c.label, _band(total, digits=digits),
                          c.saving_note or _band(saving) if c.kind != "active" else "–",
                          _band(c.saving_share, share=True), str(c.moved_calls), str(c.calls - c.covered_calls),
                          style=style)
        console.print(table)
        d = m.decode_in_prefill
        if d.calls:
            cost = d.cost_per_hour if hourly else d.cost
            console.print(f"[red]decode-in-prefill[/red]: {d.calls} calls, {d.decode_rows} decode rows, cost "
                          f"{_band(cost)} {per}; {d.note}")
        if not every:
            console.print("[dim]--all shows every gate scanned[/dim]")
    for n in out.notes:
        console.print(f"[dim]note: {n}[/dim]")
    console.print(f"[dim]{out.band}[/dim]")


def advise_command(
    url: Annotated[Optional[str], typer.Option(help="a running `routescope serve` (its /routing)")] = None,
    multiproc_dir: Annotated[Optional[str], typer.Option(help="a Prometheus multiprocess directory")] = None,
    prometheus: Annotated[Optional[str], typer.Option(help="a Prometheus server URL (with --range)")] = None,
    range_: Annotated[Optional[str], typer.Option("--range", help="Prometheus: the span to look back, e.g. 1h, 7d")] = None,
    at: Annotated[Optional[str], typer.Option(help="Prometheus: the range's end (Unix time or RFC 3339; default now)")] = None,
    selector: Annotated[str, typer.Option(help='Prometheus: label matchers for every query, e.g. job="vllm"')] = "",
    span: Annotated[Optional[str], typer.Option(help="multiprocess: how long the files counted (e.g. 2h), for per-hour figures")] = None,
    demo_traffic: Annotated[Optional[int], typer.Option(min=1, help="the demo's first N calls from its traffic generator, at the real models' shapes (no server, no kernel)")] = None,
    demo_glm_bug: Annotated[bool, typer.Option("--demo-glm-bug", help="with --demo-traffic: GLM decode rows through the prefill entry")] = False,
    demo_shapes: Annotated[bool, typer.Option("--demo-shapes", help="with --prometheus or --multiproc-dir: the traffic "
                                              "is `serve --demo`'s; price its scaled-down calls at the real models' "
                                              "shapes (on a CPU with the H200 table, a what-if)")] = False,
    table: Annotated[Optional[list[str]], typer.Option(help="latency table: h200, gfx942 or a JSON file (repeatable; first wins)")] = None,
    gates: Annotated[str, typer.Option(help="gates to scan, in rows")] = ",".join(map(str, DEFAULT_GATES)),
    model: Annotated[Optional[list[str]], typer.Option(help="only these models (repeatable)")] = None,
    every: Annotated[bool, typer.Option("--all", help="show every gate scanned, not only the best")] = False,
    kv_pool_bytes: Annotated[Optional[str], typer.Option(
        help="price every call at this kv pool size (bytes, or 256MiB, 4GiB): for sources without the kv_pool_bytes "
             "label (older series), or a what-if; default: each entry's own label")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Predict what each gate (and decodes to split-K) would cost or save on the traffic a source saw."""
    try:
        scan = parse_gates(gates)
        pool = None if kv_pool_bytes is None else parse_bytes(kv_pool_bytes)
        traffic = read_traffic(url, multiproc_dir, prometheus, range_, at, selector, span, demo_traffic, demo_glm_bug,
                               demo_shapes)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    except SourceError as exc:
        raise _fail(str(exc), 1) from None
    if model:
        seen = {e.model for e in traffic.entries}
        if seen and not seen & set(model):  # a filter that keeps nothing is a typo, not "no traffic yet"
            raise _fail(f"--model {', '.join(model)}: not in the traffic (its models: {', '.join(sorted(seen))})")
        traffic = replace(traffic, entries=tuple(e for e in traffic.entries if e.model in set(model)))
    if pool is not None:
        traffic = replace(traffic, entries=with_pool(traffic.entries, pool)).with_notes(
            f"every call priced at a kv pool of {format_bytes(pool)} (--kv-pool-bytes)")
    try:
        tables, note = choose_tables(table or [], traffic)
        kind = "prometheus" if prometheus else "multiproc" if multiproc_dir else "demo" if demo_traffic else "routing"
        out = advise(traffic, tables, gates=scan, source_kind=kind, target_note=note)
    except TableError as exc:
        raise _fail(f"--table: {exc}") from None
    except ValueError as exc:
        raise _fail(f"--table: {exc}") from None
    if as_json:
        typer.echo(out.model_dump_json(indent=2))
        return
    render(out, Console(width=max(Console().width, 160)), every=every)
