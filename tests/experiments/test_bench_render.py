"""`bench experiment`'s printout: an unknown figure reads as unknown (never None, nan, True or a zero), the band is
its own column, rows are in order, and what it prints adds up (off = ratio / truth - 1). On the H200 run kept in
docs/benchmarks and on a hand-made result with every unknown a run can produce."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from experiments.bench_render import band_text, bucket_order, ratio_text, render

H200 = Path(__file__).parents[2] / "docs" / "benchmarks" / "h200-experiment-663a4b3.json"


def _text(result: dict) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(width=220, record=True, file=sink)
        render(result, console)
    return console.export_text()


def _rows(text: str, title: str) -> list[list[str]]:
    """The body rows of the table under ``title``, as cells."""
    block = text.split(title, 1)[1].split("└", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("│")]
    return [[c.strip() for c in line.strip("│ ").split("│")] for line in lines]


@pytest.fixture(scope="module")
def h200() -> dict:
    return json.loads(H200.read_text())


def _unknowns(result: dict) -> dict:
    """The H200 result with what a short or failed run leaves unknown."""
    r = copy.deepcopy(result)
    r["ground_truth_crossover"] = None
    e = next(iter(r["experiments"].values()))
    e.update(crossover=None, saving={"seconds": None, "low": None, "high": None}, state="stopped",
             stop_reason="harm", clock_calibration={"devices": {"H200": {"offset_ns": None, "pairs": 0,
                                                                          "empty_p10_ns": None, "bound_ns": 1500}}})
    e["cells"][0].update(ratio=float("nan"), ratio_low=None, ratio_high=None, truth=None, off=None, inside=None)
    e["cells"][1].update(ratio_low=0.0, ratio_high=507727.488)
    e["cells"].reverse()
    e["buckets"][0].update(ratio=None, ratio_low=None, ratio_high=None, off=None, inside=None)
    e["buckets"].reverse()
    return r


def test_the_formatters():
    assert ratio_text(None) == ratio_text(float("nan")) == ratio_text(True) == "–"
    assert ratio_text(0.2104) == "0.210" and ratio_text(5e5) == "> 100"
    assert band_text(None, None) == band_text(0.1, None) == "–" and band_text(0.0, 507727.488) == "[0.000, > 100]"
    assert [bucket_order(b) for b in ("1", "2-3", "1024+", "all")] == [1, 2, 1024, 1 << 62]


def test_an_unknown_figure_reads_as_unknown_never_as_none_or_zero(h200):
    text = _text(_unknowns(h200))
    for word in ("None", "nan", "True", "False", " 0.0%", "inf"):  # a known off is signed: " 0.0%" was a None
        assert word not in text, word
    assert "ground-truth crossover none (B is slower in the smallest rows bucket)" in text
    assert "measured crossover none shown (the smallest moved rows bucket's band reaches above 1)" in text
    assert "saving unknown (no cell has timed calls in both arms)" in text and "stopped (harm)" in text
    assert "clock on H200: unknown (no empty pair read) off gated readings" in text
    assert "[0.000, > 100]" in text  # an edge the band says nothing about, apart from the ratio column


def test_cells_and_buckets_are_in_order_and_add_up(h200):
    text = _text(_unknowns(h200))
    for f, e in h200["experiments"].items():
        block = text.split(f"fraction {f}:", 1)[1]
        cells = _rows(block, "cells: B time / A time")
        assert len(cells) == len(e["cells"])
        keys = [(m, bucket_order(rows), cls) for m, rows, cls, *_ in cells]
        assert keys == sorted(keys)
        for _, _, _, _, _, ratio, band, truth, off, inside in cells:
            assert re.fullmatch(r"–|\[\d+\.\d{3}, (\d+\.\d{3}|> 100)\]", band), band
            if "–" not in (ratio, truth, off):  # to the printed digits: 3 decimals each side, 1 in the percentage
                r, t = float(ratio), float(truth)
                slack = 100 * r / t * (5e-4 / r + 5e-4 / t) + 0.05
                assert float(off.rstrip("%")) == pytest.approx((r / t - 1) * 100, abs=slack)
            if band != "–" and truth != "–" and inside != "–":
                low, high = (float(x.replace("> ", "")) for x in band.strip("[]").split(", "))
                assert (inside == "yes") == (low - 5e-4 <= float(truth) <= high + 5e-4)
        buckets = _rows(block, "rows buckets:")
        assert [bucket_order(b[0]) for b in buckets] == sorted(bucket_order(b["rows_bucket"]) for b in e["buckets"])
        assert all(b[8] in ("no worse", "worse") or b[8].startswith("undecided") for b in buckets)
        break  # the first fraction is the one with the unknowns; the second is the file's as measured


def test_the_measured_run_prints_its_own_figures(h200):
    text = _text(h200)
    e = h200["experiments"]["0.05"]
    assert f"measured crossover {e['crossover']} rows" in text
    assert f"ground-truth crossover {h200['ground_truth_crossover']} rows" in text
    s = e["saving"]
    assert f"saving {s['seconds']:+.4g} s [{s['low']:+.4g}, {s['high']:+.4g}]" in text
    assert "throughput against no experiment" in text
