"""A sweep over several kv pools as one set of files: the report's tables and gate once per pool.

Each pool's results are summarised as a sweep of that pool alone (``report.document``) and kept under
``pools`` in the JSON; the top-level ratios, crossovers and gate are the largest pool's, the pool a serving
GPU's kv cache is closest to, and ``recommendation_pool`` names it. ``results`` holds every pool's timings,
each with its ``kv_pool_bytes``, which is what ``advise`` indexes a table by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..pools import format_bytes
from .analysis import Result
from .report import document, markdown, print_tables, write_csv, write_heatmap, write_json


def result_pool_bytes(r: Result) -> int:
    """Bytes of the kv pool a result was timed with: its slots x head dim x the pool's element size."""
    return r.kv_len * r.head_dim * getattr(torch, r.pool_dtype).itemsize


def by_pool(results: list[Result]) -> dict[int, list[Result]]:
    """Results grouped by their pool's bytes, smallest pool first."""
    out: dict[int, list[Result]] = {}
    for r in results:
        out.setdefault(result_pool_bytes(r), []).append(r)
    return dict(sorted(out.items()))


def pool_sentence(pools: list[int], l2: int | None) -> str | None:
    """Where each pool sits against the GPU's L2, in one sentence; None on the host (no L2 reported)."""
    if not l2 or not pools:
        return None
    inside = [format_bytes(p) for p in pools if p <= l2]
    past = [format_bytes(p) for p in pools if p > l2]
    parts = []
    if inside:
        parts.append(f"{', '.join(inside)} inside this GPU's {format_bytes(l2)} L2 (what a call gathers stays there)")
    if past:
        parts.append(f"{', '.join(past)} past it (gathers come from HBM, as in serving)")
    return "kv pools: " + "; ".join(parts)


def pooled_document(results: list[Result], *, pools: tuple[int, ...], flush_l2: bool, **kw: Any) -> dict[str, Any]:
    """``report.document`` per pool, folded into one: every result (with its pool), and each pool's summary."""
    groups = by_pool(results)
    docs = {size: document(rs, **kw) for size, rs in groups.items()}
    if not docs:
        return {**document(results, **kw), "kv_pools": list(pools), "pools": [], "l2_flush": flush_l2}
    largest = max(docs)
    doc = dict(docs[largest])
    doc["results"] = [{**r._asdict(), "kv_pool_bytes": result_pool_bytes(r)} for r in results]
    doc["kv_pools"] = list(pools)
    doc["l2_flush"] = flush_l2
    gpu = bool(kw.get("l2"))
    doc["protocol"] = ("each point's input sets share one kv pool of the stated size"
                       + ((", L2 flushed" if flush_l2 else ", L2 not flushed (what the pool's size lets it hold stays)")
                          + " and the GPU held before each call" if gpu else ", timed by the host clock"))
    doc["recommendation_pool"] = largest
    doc["kv_pool"] = pool_sentence(sorted(docs), kw.get("l2"))
    doc["pools"] = [{"kv_pool_bytes": size, "kv_pool": format_bytes(size), "ratios": d["ratios"],
                     "crossover": d["crossover"], "recommendation": d["recommendation"], "l2_note": d["kv_pool"]}
                    for size, d in docs.items()]
    return doc


def _section(results: list[Result], pool_doc: dict[str, Any]) -> list[str]:
    """One pool's Markdown from ``report.markdown``, less its title and command, headings one level down."""
    lines = markdown(results, pool_doc).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    return [("#" + line) if line.startswith("## ") else line for line in lines[start:]]


def _pool_docs(results: list[Result], doc: dict[str, Any]) -> list[tuple[int, list[Result], dict[str, Any]]]:
    groups = by_pool(results)
    out = []
    for p in doc["pools"]:
        sub = {**doc, "ratios": p["ratios"], "crossover": p["crossover"], "recommendation": p["recommendation"],
               "kv_pool": p["l2_note"]}
        out.append((p["kv_pool_bytes"], groups.get(p["kv_pool_bytes"], []), sub))
    return out


def pooled_markdown(results: list[Result], doc: dict[str, Any]) -> str:
    """The whole sweep: what ran and how, then per pool the ratio tables, medians, crossovers and gate."""
    parts = _pool_docs(results, doc)
    head = markdown(parts[0][1], parts[0][2]).splitlines() if parts else markdown(results, doc).splitlines()
    cut = next((i for i, line in enumerate(head) if line.startswith("## ")), len(head))
    out = head[:cut]
    out += ["", doc["protocol"] + ".", "",
            f"**Gate for the largest pool ({format_bytes(doc['recommendation_pool'])}):** "
            f"{doc['recommendation']['reason']}"]
    for size, sub_results, sub in parts:
        out += ["", f"## kv pool {format_bytes(size)}", "", *_section(sub_results, sub)]
    return "\n".join(out).rstrip("\n") + "\n"


def write_pooled(out_dir: Path, results: list[Result], doc: dict[str, Any]) -> dict[str, Path]:
    """sweep.csv, sweep.json, sweep.md and (with matplotlib) sweep.png, one heatmap panel per layout and pool."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "sweep.csv", "json": out_dir / "sweep.json", "md": out_dir / "sweep.md",
             "png": out_dir / "sweep.png"}
    write_csv(paths["csv"], results)
    write_json(paths["json"], doc)
    paths["md"].write_text(pooled_markdown(results, doc))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        del paths["png"]
        return paths
    panels = [{**c, "layout": f"{c['layout']}, {format_bytes(p['kv_pool_bytes'])}"}
              for p in doc["pools"] for c in p["ratios"]]
    write_heatmap(paths["png"], {**doc, "ratios": panels})
    return paths


def print_pooled(console: Any, results: list[Result], doc: dict[str, Any]) -> None:
    """``report.print_tables`` once per pool, under the pool's size."""
    for size, sub_results, sub in _pool_docs(results, doc):
        console.rule(f"kv pool {format_bytes(size)}")
        print_tables(console, sub_results, sub)
    console.print(f"[bold]gate for the largest pool ({format_bytes(doc['recommendation_pool'])}):[/bold] "
                  f"{doc['recommendation']['reason']}")
