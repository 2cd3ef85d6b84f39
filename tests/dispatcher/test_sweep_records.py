"""The H200 sweeps docs/benchmarks.md quotes: shaped as issue 6 asks, and telling what the docs say."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dispatcher.sweep.analysis import Result
from dispatcher.sweep.report import summarize

RECORDS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
# The issue's two layouts (DSV4, GLM-5.3: the sweep's default) and the 576-lane one its targets are read at.
GRID = {"rows": {1, 2, 16, 256, 512, 1024, 2048, 16384}, "topk": {128, 512, 2048},
        "layout": {"448+64", "512+0", "512+64"}}
KERNELS = ("intree.ragged_prefill", "intree.sparse_decode")
INTS = ("rows", "topk", "heads", "head_dim", "nope_head_dim", "rope_head_dim", "kv_len", "repeats")
FLOATS = ("median_us", "p20_us", "p80_us", "min_us")


def _results(rows: list[dict]) -> list[Result]:
    return [Result(**{k: int(v) if k in INTS else float(v) if k in FLOATS else v
                      for k, v in r.items() if k in Result._fields}) for r in rows]


def _check_grid(results: list[Result]) -> None:
    points = {(r.kernel, r.layout, r.rows, r.topk) for r in results}
    assert len(points) == len(results) == 2 * len(GRID["layout"]) * 8 * 3
    assert {r.kernel for r in results} == set(KERNELS)
    assert {r.rows for r in results} == GRID["rows"] and {r.topk for r in results} == GRID["topk"]
    assert {r.layout for r in results} == GRID["layout"] and {r.heads for r in results} == {16}


def test_the_event_sweep_has_the_issues_shape_and_gate():
    doc = json.loads((RECORDS / "h200-sweep.json").read_text())
    assert "H200" in doc["device"]
    for r in doc["results"]:
        assert {"kernel", "impl", "rows", "topk", "heads", "head_dim", "median_us"} <= set(r)
        assert r["median_us"] > 0 and r["timer"] == "cuda-events"
    _check_grid(_results(doc["results"]))
    assert doc["recommendation"]["gate"] == 256
    md = (RECORDS / "h200-sweep.md").read_text()  # the sweep's own Markdown of the same run
    assert doc["command"] in md and "**Recommended gate:** rows >= 256" in md
    assert all(f"## Layout {lay}" in md for lay in GRID["layout"])


def test_the_kernel_time_sweep_covers_the_grid_and_gates_alike():
    """Recomputed from the CSV with the sweep's own analysis: the gate the docs quote for both clocks."""
    with (RECORDS / "h200-sweep-cupti.csv").open() as fh:
        results = _results(list(csv.DictReader(fh)))
    _check_grid(results)
    assert {r.timer for r in results} == {"cupti"}
    a, b = (f"{k}:gluon" for k in KERNELS)
    _, _, advice = summarize(results, a, b, sorted(GRID["layout"]), 0.05)
    assert advice.gate == 256 and not advice.never
    events = {(r["kernel"], r["layout"], r["rows"], r["topk"]): r["median_us"]
              for r in json.loads((RECORDS / "h200-sweep.json").read_text())["results"]}
    small = [r for r in results if r.rows <= 16]
    assert all(r.median_us < events[(r.kernel, r.layout, r.rows, r.topk)] for r in small)  # no event pair in it
