"""A finished sweep as files (CSV, JSON, Markdown, heatmap PNG) and as tables for people."""

from __future__ import annotations

import csv
import json
import math
import platform
from pathlib import Path
from typing import Any

import torch

from .analysis import (TOLERANCE, Crossover, GateAdvice, Result, crossovers, pool_note, ratio_rows, ratio_table,
                       recommend_gate, timer_note)
from .noise import noise_advice, noisy_points


def device_name(device: torch.device) -> str:
    """'NVIDIA H200' on a GPU; 'cpu (x86_64)' elsewhere."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()})"


def l2_bytes(device: torch.device) -> int | None:
    """The GPU's L2 cache in bytes (what torch reports for it); None on the host."""
    if device.type != "cuda":
        return None
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or None


def summarize(results: list[Result], a: str, b: str, layouts: list[str],
              tolerance: float = TOLERANCE) -> tuple[dict, list[Crossover], GateAdvice]:
    """Ratio tables per layout, crossovers per (layout, top-k) with A/B <= 1 + tolerance, and the gate:
    none when A's or B's points spread wider than the tolerance (``noise``)."""
    tables = {lay: ratio_table(results, a, b, lay) for lay in layouts}
    found = [c for lay in layouts for c in crossovers(tables[lay], lay, threshold=1.0 + tolerance)]
    advice = recommend_gate(found, tolerance)
    noisy = noisy_points(results, (a, b), tolerance)
    if noisy:
        timed = [r for r in results if r.label in (a, b)]
        advice = noise_advice(noisy, points=len(timed), tolerance=tolerance,
                              repeats=max(r.repeats for r in timed), on_gpu=any(r.timer != "host" for r in timed),
                              measured=advice)
    return tables, found, advice


def document(results: list[Result], *, a: str, b: str, layouts: list[str], device: str, command: str,
             tolerance: float = TOLERANCE, l2: int | None = None, date: str | None = None,
             commit: str | None = None) -> dict[str, Any]:
    """The JSON written beside the CSV: {"device", "date", "commit", "results": [...], ratios, crossover,
    recommendation}, and where the kv pools sat against the GPU's L2 (``l2``, bytes; None on the host), and which
    event-pair readings are too short to stand for kernel time (``timer_note``; None when none are).

    ``date`` (UTC day) and ``commit`` (the checkout's, or None) are what `routescope advise --table` shows
    beside every figure priced from this file (``provenance`` reads them)."""
    tables, found, advice = summarize(results, a, b, layouts, tolerance)
    triton_version = None
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    return {
        "device": device,
        "date": date,
        "commit": commit,
        "torch": torch.__version__,
        "triton": triton_version,
        "command": command,
        "a": a,
        "b": b,
        "ratio": "median time of A / median time of B (< 1: A faster)",
        "tolerance": tolerance,
        "results": [r._asdict() for r in results],
        "ratios": [
            {"layout": lay, "rows": rows, "topk": topk, "ratio": round(v, 4)}
            for lay, t in tables.items() for (rows, topk), v in sorted(t.items())
        ],
        "crossover": [c._asdict() for c in found],
        "recommendation": advice._asdict(),
        "noisy": [p._asdict() for p in noisy_points(results, (a, b), tolerance)],
        "l2_bytes": l2,
        "kv_pool": pool_note(results, l2),
        "timer_note": timer_note(results),
    }


def write_csv(path: Path, results: list[Result]) -> None:
    """One line per kernel and grid point."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(Result._fields)
        for r in results:
            w.writerow([f"{v:.3f}" if isinstance(v, float) else v for v in r])


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1) + "\n")


def write_heatmap(path: Path, doc: dict[str, Any]) -> None:
    """One panel per layout: rows x top-k, coloured by log2(A/B), red where A is slower."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = list(dict.fromkeys(r["layout"] for r in doc["ratios"]))
    if not layouts:
        return
    fig, axes = plt.subplots(1, len(layouts), figsize=(4.2 * len(layouts) + 1.5, 5), squeeze=False,
                             constrained_layout=True)
    span = max([abs(math.log2(r["ratio"])) for r in doc["ratios"] if r["ratio"] > 0] + [1.0])
    im = None
    for ax, lay in zip(axes[0], layouts):
        cells = [r for r in doc["ratios"] if r["layout"] == lay]
        rows = sorted({c["rows"] for c in cells})
        topks = sorted({c["topk"] for c in cells})
        grid = [[math.nan] * len(topks) for _ in rows]
        for c in cells:
            grid[rows.index(c["rows"])][topks.index(c["topk"])] = math.log2(c["ratio"])
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-span, vmax=span, aspect="auto", origin="lower")
        for c in cells:
            dark = abs(math.log2(c["ratio"])) > 0.6 * span if c["ratio"] > 0 else False
            ax.text(topks.index(c["topk"]), rows.index(c["rows"]), f"{c['ratio']:.2f}", ha="center", va="center",
                    fontsize=9, color="white" if dark else "black")
        ax.set_xticks(range(len(topks)), [str(k) for k in topks])
        ax.set_yticks(range(len(rows)), [str(r) for r in rows])
        ax.set_xlabel("top-k (fanout)")
        if ax is axes[0][0]:
            ax.set_ylabel("query rows")
        ax.set_title(f"layout {lay}")
    fig.colorbar(im, ax=axes[0].tolist(), label="log2(A / B)")
    gate = doc["recommendation"]["gate"]
    fig.suptitle(f"{doc['a']} / {doc['b']} on {doc['device']}" + (f"; gate rows >= {gate}" if gate else ""),
                 fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(out_dir: Path, results: list[Result], doc: dict[str, Any]) -> dict[str, Path]:
    """sweep.csv, sweep.json, sweep.md and, where matplotlib is installed (extra ``sweep``), sweep.png
    under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "sweep.csv", "json": out_dir / "sweep.json", "md": out_dir / "sweep.md",
             "png": out_dir / "sweep.png"}
    write_csv(paths["csv"], results)
    write_json(paths["json"], doc)
    paths["md"].write_text(markdown(results, doc))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        del paths["png"]  # the tables and files still say everything; the picture needs the extra
        return paths
    write_heatmap(paths["png"], doc)
    return paths


def _cell(r: Result) -> str:
    spread = (r.p80_us - r.p20_us) / 2 / r.median_us * 100 if r.median_us > 0 else 0.0
    value = f"{r.median_us:.1f}" if r.median_us < 10_000 else f"{r.median_us:.0f}"
    return f"{value} ±{spread:.0f}%"


def median_rows(results: list[Result], layout: str) -> tuple[list[str], list[list[str]]]:
    """One layout's medians: a header ("kernel", "top-k", then the row counts) and a line per kernel and top-k."""
    mine = [r for r in results if r.layout == layout]
    rows = sorted({r.rows for r in mine})
    lines = []
    for label, topk in dict.fromkeys((r.label, r.topk) for r in mine):
        by_rows = {r.rows: r for r in mine if r.label == label and r.topk == topk}
        lines.append([label, str(topk), *[_cell(by_rows[n]) if n in by_rows else "-" for n in rows]])
    return ["kernel", "top-k", *map(str, rows)], lines


def layout_ratios(doc: dict[str, Any], layout: str) -> tuple[list[str], list[list[str]]]:
    """One layout's A/B table in the seed's layout (``analysis.ratio_rows``), from the document's ratios."""
    return ratio_rows({(c["rows"], c["topk"]): c["ratio"] for c in doc["ratios"] if c["layout"] == layout})


def crossover_lines(doc: dict[str, Any]) -> list[str]:
    """A sentence per (layout, top-k): from how many rows A is no slower than B."""
    within = f" (within {doc['tolerance']:.0%})" if doc.get("tolerance") else ""
    out = []
    for c in doc["crossover"]:
        where = (f"from {c['rows']} rows (interpolated ~{c['estimate']:.0f})" if c["rows"] is not None
                 else "never within the grid")
        out.append(f"crossover, layout {c['layout']}, top-k {c['topk']}: A no slower{within} {where}")
    return out


def gate_label(doc: dict[str, Any]) -> str:
    """"recommended gate" over a gate; "no recommended gate" over the reason there is none."""
    return "recommended gate" if doc["recommendation"]["gate"] is not None else "no recommended gate"


# What each timer name in a Result measured (timing.py's timers).
TIMERS = {
    "host": "host clock (time.perf_counter around each call; the CPU's kernels are synchronous)",
    "cuda-events": "CUDA events (an event pair around each call, its own ~3 µs included)",
    "cuda-graph": "CUDA events around a graph replay of each call",
    "cupti": "CUPTI kernel time (first kernel start to last kernel end)",
}


def timers_text(results: list[Result]) -> str:
    """The timers that really ran, in words: what a reader of the figures needs, whatever --timer said."""
    names = sorted({r.timer for r in results})
    return "; ".join(TIMERS.get(n, n) for n in names) or "-"


def _layouts(results: list[Result]) -> list[str]:
    return list(dict.fromkeys(r.layout for r in results))


def print_tables(console: Any, results: list[Result], doc: dict[str, Any]) -> None:
    """Medians per kernel, the A/B ratio table per layout (seed's layout), crossovers and the gate."""
    from rich.table import Table

    def table(title: str, header: list[str], lines: list[list[str]], left: int) -> Table:
        """As ``_md_table``: the first ``left`` columns (labels) left-aligned, the numbers right-aligned."""
        t = Table(title=title)
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i < left else "right", no_wrap=i < left)
        for line in lines:
            t.add_row(*line)
        return t

    console.print(f"A = {doc['a']}, B = {doc['b']}")
    for lay in _layouts(results):
        console.print(table(f"median µs per call, layout {lay} (± half the p20-p80 spread)",
                            *median_rows(results, lay), left=1))
        console.print(table(f"A/B time, layout {lay} (< 1: A faster)", *layout_ratios(doc, lay), left=0))
    for line in crossover_lines(doc):
        console.print(line)
    console.print(f"[bold]{gate_label(doc)}:[/bold] {doc['recommendation']['reason']}")
    if doc.get("kv_pool"):
        console.print(doc["kv_pool"])
    if doc.get("timer_note"):
        console.print(f"[yellow]{doc['timer_note']}[/yellow]")


def _md_table(header: list[str], lines: list[list[str]], left: int) -> list[str]:
    """A Markdown table: the first ``left`` columns left-aligned, the rest (numbers) right-aligned."""
    rule = ["---" if i < left else "---:" for i in range(len(header))]
    return ["| " + " | ".join(cells) + " |" for cells in (header, rule, *lines)]


def markdown(results: list[Result], doc: dict[str, Any]) -> str:
    """The sweep as Markdown, for a pull request or a doc: what ran and how, the A/B table per layout in
    the seed's layout, the medians, the crossovers, the gate, where the kv pools sat and which readings the
    event pair cannot time faithfully."""
    timers = timers_text(results)
    dtypes = ", ".join(sorted({f"q {r.dtype}, kv {r.pool_dtype}" for r in results})) or "-"
    out = [f"# routescope sweep on {doc['device']}", "",
           f"A = `{doc['a']}`, B = `{doc['b']}`; each cell of the ratio tables is {doc['ratio']}. "
           f"Timer: {timers}. Dtypes: {dtypes}.", "", "```", doc["command"], "```"]
    for lay in _layouts(results):
        out += ["", f"## Layout {lay}", "", "A/B time:", "", *_md_table(*layout_ratios(doc, lay), left=0),
                "", "Median µs per call (± half the p20-p80 spread):", "",
                *_md_table(*median_rows(results, lay), left=1)]
    out += ["", "## Crossover and gate", "", *[f"- {line}" for line in crossover_lines(doc)], "",
            f"**{gate_label(doc).capitalize()}:** {doc['recommendation']['reason']}"]
    if doc.get("kv_pool"):
        out += ["", doc["kv_pool"]]
    if doc.get("timer_note"):
        out += ["", doc["timer_note"]]
    return "\n".join(out) + "\n"
