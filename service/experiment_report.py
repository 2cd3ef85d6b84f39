"""What `routescope experiment status` and `report` print: the seed's own table (B time / A time by rows x top-k).

The grid is pure (``grids``), so it is tested without a terminal; the page draws the same grid in
service/static/experiments.js. A measured cell reads `0.64 [0.60, 0.69]`: the ratio of mean kernel
time B/A and its anytime-valid 95% band; advise's prediction for the same cell stands beside it, with advise's
band (the interpolants, the table's spread, the bucket reading and the kv pools: experiments/covariate.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

ALL_TOPK = "any"  # the column of cells that carry no top-k
_TOPK = re.compile(r"\btopk(\d+)\b")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def band(ratio: Any, low: Any, high: Any) -> str:
    """`0.64 [0.60, 0.69]`; `-` with no ratio yet; `0.64` with no band; an open end as `?`."""
    r = _num(ratio)
    if r is None:
        return "-"
    lo, hi = _num(low), _num(high)
    if lo is None and hi is None:
        return f"{r:.2f}"
    return f"{r:.2f} [{'?' if lo is None else f'{lo:.2f}'}, {'?' if hi is None else f'{hi:.2f}'}]"


def prediction(cell: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """advise's predicted B/A for a cell, with its band: (ratio, low, high); Nones where no table covers it."""
    p = cell.get("prediction")
    if isinstance(p, Mapping):
        return (_num(p.get("ratio", p.get("mid"))), _num(p.get("ratio_low", p.get("low"))),
                _num(p.get("ratio_high", p.get("high"))))
    return _num(p), None, None


def _bucket_order(label: str) -> int:
    head = label.split("-")[0].rstrip("+")
    return int(head) if head.isdigit() else 1 << 62


def topk_of(cell: Mapping[str, Any]) -> str:
    """The cell's top-k: its own field, else the `topk2048` in its shape (`448+64 h16 topk2048 bfloat16/bfloat16`)."""
    if cell.get("topk") is not None:
        return str(cell["topk"])
    m = _TOPK.search(str(cell.get("shape") or ""))
    return m[1] if m else ALL_TOPK


def grids(experiment: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per model, shape (but its top-k) and call class: rows buckets x top-k, each cell measured and predicted."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in experiment.get("cells") or ():
        rest = " ".join(_TOPK.sub("", str(c.get("shape") or "")).split())
        key = (str(c.get("model", "")), rest, str(c.get("call_class") or ""))
        g = out.setdefault(key, {"model": key[0], "shape": rest or None, "call_class": key[2] or None, "rows": [],
                                 "topk": [], "cells": {}})
        topk = topk_of(c)
        rows = str(c.get("rows_bucket", ""))
        if rows not in g["rows"]:
            g["rows"].append(rows)
        if topk not in g["topk"]:
            g["topk"].append(topk)
        g["cells"][(rows, topk)] = {
            "measured": band(c.get("ratio"), c.get("ratio_low"), c.get("ratio_high")),
            "predicted": band(*prediction(c)),
            "kernels": f"{c.get('kernel_b')} / {c.get('kernel_a')}",
            "calls": (int(c.get("calls_a") or 0), int(c.get("calls_b") or 0)),
        }
    for g in out.values():
        g["rows"].sort(key=_bucket_order)
        g["topk"].sort(key=lambda t: (t == ALL_TOPK, int(t) if t.isdigit() else 0))
    return [out[k] for k in sorted(out)]


def saving_line(experiment: Mapping[str, Any]) -> str:
    """The saving over the observed traffic with its band, in kernel seconds (negative: B costs)."""
    s = experiment.get("saving") or {}
    mid = _num(s.get("seconds"))
    if mid is None:
        return "saving: not yet measured (too few timed calls)"
    lo, hi = _num(s.get("low")), _num(s.get("high"))
    tail = f" [{lo:+.6f}, {hi:+.6f}]" if lo is not None and hi is not None else ""
    return f"saving over the observed traffic: {mid:+.6f} s of kernel time{tail} (negative: B costs)"


def crossover_line(experiment: Mapping[str, Any]) -> str | None:
    """The measured crossover, where the experiment reports one."""
    x = experiment.get("crossover")
    if x is None:
        return None
    rows, rule = (x.get("rows"), x.get("rule")) if isinstance(x, Mapping) else (x, None)
    head = ("measured crossover: not shown by the bands yet" if rows is None else
            f"measured crossover: {rows} rows" + (f" ({rule})" if rule else ""))
    thin = x.get("undecided") if isinstance(x, Mapping) else None
    if not thin:
        return head
    need = thin.get("calls_needed")
    ask = (f"about {need:,} of its calls at this fraction would decide it" if need is not None
           else str(thin.get("needed_because") or "no estimate"))
    return (f"{head}; undecided: the {thin.get('rows_bucket')} rows bucket is too thin to show B no worse or worse "
            f"({thin.get('calls'):,} calls; {ask})")


def facts_line(experiment: Mapping[str, Any]) -> str:
    """Calls never moved by reason, the numerics tally, B's failures and how it ended: what else a reader checks."""
    cells = experiment.get("cells") or []
    checked = sum(int((c.get("numerics") or {}).get("checked") or 0) for c in cells)
    bad = sum(int((c.get("numerics") or {}).get("mismatched") or 0) for c in cells)
    never = experiment.get("never_moved") or {}
    parts = ["never moved: " + (", ".join(f"{k} {v}" for k, v in sorted(never.items())) or "none"),
             f"numerics: {checked} checked, {bad} mismatched"]
    if experiment.get("b_failures"):
        parts.append(f"B raised {experiment['b_failures']} times (last: {experiment.get('last_error')})")
    if experiment.get("end_reason"):
        parts.append(f"ended by {experiment['end_reason']}")
    return "; ".join(parts)


def _state(e: Mapping[str, Any]) -> str:
    st = str(e.get("state"))
    return f"{st} ({e['stop_reason']})" if st == "stopped" and e.get("stop_reason") else st


def status_table(experiments: Sequence[Mapping[str, Any]], console: Console | None = None) -> None:
    """One line per experiment: state, arms' calls, cells with a band."""
    console = console or Console()
    if not experiments:
        console.print("no experiment (start one: routescope experiment start CANDIDATE)")
        return
    t = Table("id", "candidate", "fraction", "state", "calls A/B", "timed A/B", "cells banded")
    for e in experiments:
        cells = e.get("cells") or []
        total = {k: sum(int(c.get(k) or 0) for c in cells) for k in ("calls_a", "calls_b", "timed_a", "timed_b")}
        banded = sum(1 for c in cells if _num(c.get("ratio_low")) is not None)
        t.add_row(str(e.get("id")), str(e.get("candidate")), f"{e.get('fraction')}", _state(e),
                  f"{total['calls_a']}/{total['calls_b']}", f"{total['timed_a']}/{total['timed_b']}",
                  f"{banded}/{len(cells)}")
    console.print(t)


def report(experiments: Sequence[Mapping[str, Any]], console: Console | None = None) -> None:
    """Per experiment, per model: the seed's table, measured beside predicted; then the saving and crossover."""
    console = console or Console()
    if not experiments:
        console.print("no experiment (start one: routescope experiment start CANDIDATE)")
        return
    for e in experiments:
        console.print(f"[bold]{e.get('id')}[/bold]: candidate {e.get('candidate')} at fraction {e.get('fraction')}, "
                      f"{_state(e)}")
        for g in grids(e):
            where = ", ".join(v for v in (g["model"], g["shape"], g["call_class"]) if v)
            t = Table(title=Text(f"B time / A time, {where}: measured [95% band] | predicted [advise's band]"),
                      title_justify="left")  # Text: brackets are not markup
            t.add_column("rows")
            for k in g["topk"]:
                t.add_column(f"top-k {k}" if k != "any" else "any top-k")
            for rows in g["rows"]:
                cells = [g["cells"].get((rows, k)) for k in g["topk"]]
                t.add_row(rows, *("" if c is None else f"{c['measured']} | {c['predicted']}" for c in cells))
            console.print(t)
        console.print(saving_line(e))
        console.print(facts_line(e))
        if (line := crossover_line(e)) is not None:
            console.print(line)
