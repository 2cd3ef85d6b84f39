"""The band with the clock's bound in it, and a thin bucket's estimate of the calls it needs: synthetic readings of
known kernel times with a planted clock offset, on the pure statistics (experiments/stats.py, report.py)."""

from __future__ import annotations

import math
import random

import pytest

from experiments.report import buckets, crossover_view, verdict
from experiments.stats import Moments, pooled, ratio, widen
from service.experiment_report import crossover_line


def _arm(rng: random.Random, mean_s: float, n: int, offset_s: float, cv: float = 0.05) -> Moments:
    """``n`` readings of a kernel of mean ``mean_s`` (spread ``cv``), each read ``offset_s`` off by the clock."""
    m = Moments()
    for _ in range(n):
        m.add(max(rng.gauss(mean_s, cv * mean_s), 0.0) + offset_s)
    return m


def test_a_planted_offset_inside_the_bound_is_covered_though_the_statistical_band_misses_it():
    rng = random.Random(57)
    bound = 500e-9  # the clock may read each kernel up to 0.5 µs off, the same way for a whole arm
    true_a, true_b = 37e-6, 7.4e-6  # the H200's prefill and split-K decode at a few rows
    covered = stat_covered = 0
    runs = 200
    for _ in range(runs):
        off_a, off_b = rng.uniform(-bound, bound), rng.uniform(-bound, bound)
        a, b = _arm(rng, true_a, 3000, off_a), _arm(rng, true_b, 3000, off_b)
        r = ratio(a, b, cuped=False, bound_a=bound, bound_b=bound)
        covered += r.low <= true_b / true_a <= r.high
        stat_covered += r.stat_low <= true_b / true_a <= r.stat_high
    assert covered / runs >= 0.95, covered
    assert stat_covered / runs < 0.5, stat_covered  # thousands of calls: the band of the means alone cannot hold it
    assert r.high - r.low < 0.1 * (true_b / true_a) + 4 * bound / true_a  # and it is no wider than the bound makes it


def test_widen_holds_every_ratio_of_means_the_bounds_allow():
    rng = random.Random(3)
    for _ in range(200):
        mean_a = rng.uniform(5e-6, 100e-6)
        low, high = sorted((rng.uniform(0.2, 2.0), rng.uniform(0.2, 2.0)))
        ba, bb = rng.uniform(0, 1e-6), rng.uniform(0, 1e-6)
        wide = widen(low, high, mean_a, ba, bb)
        for _ in range(20):  # a read ratio inside the band, and true means inside the arms' bounds
            read_b = rng.uniform(low, high) * mean_a
            true = (read_b - rng.uniform(-bb, bb)) / (mean_a - rng.uniform(-ba, ba))
            assert wide[0] - 1e-12 <= true <= wide[1] + 1e-12
    assert widen(0.9, 1.1, 40e-6, 0.0, 0.0) == (0.9, 1.1)
    assert widen(0.9, 1.1, 1e-6, 2e-6, 0.0)[1] == math.inf  # A's bound as large as its mean: no upper end


def _bucket_cell(rng: random.Random, name: str, calls: int, pairs: int, r: float, bound: float) -> dict:
    a, b = _arm(rng, 40e-6, pairs, 0.0, cv=0.1), _arm(rng, 40e-6 * r, pairs, 0.0, cv=0.1)
    return {"name": name, "lo": 32, "hi": 64, "rows_bucket": "32-63", "kernel_a": "A", "kernel_b": "B",
            "calls_a": calls - pairs, "calls_b": pairs, "a": list(a.as_tuple()), "b": list(b.as_tuple()),
            "bound_a_s": bound, "bound_b_s": bound}


def test_a_thin_bucket_is_undecided_and_the_calls_it_asks_for_decide_it():
    decided = 0
    for seed in range(20):
        rng = random.Random(seed)
        fraction = 0.01
        calls = 4000  # 40 B calls at 1%: too few to show 0.94 below 1
        thin, = buckets([_bucket_cell(rng, "c", calls, int(calls * fraction), 0.94, 200e-9)])
        assert thin["verdict"] == "undecided" and thin["calls_needed"] > calls
        more = thin["calls_needed"]
        again, = buckets([_bucket_cell(rng, "c", more, int(more * fraction), 0.94, 200e-9)])
        decided += again["verdict"] == "no_worse"
    assert decided >= 14, decided  # an estimate at the ratio seen: with that margin, most runs that long decide


def test_a_ratio_within_the_clocks_bound_of_one_asks_for_a_better_clock_not_calls():
    rng = random.Random(1)
    thin, = buckets([_bucket_cell(rng, "c", 400_000, 4000, 0.99, 1e-6)])  # 1 µs on 40 µs: 2.5% each arm
    assert thin["verdict"] == "undecided"
    assert thin["calls_needed"] is None and "clock" in thin["needed_because"]


def test_crossover_names_the_bucket_that_left_it_undecided_in_json_and_text():
    rows = [{"rows_bucket": "1", "lo": 1, "hi": 2, "calls": 9000, "verdict": "no_worse", "calls_needed": None,
             "needed_because": None},
            {"rows_bucket": "32-63", "lo": 32, "hi": 64, "calls": 814, "verdict": "undecided", "calls_needed": 21000,
             "needed_because": "estimate at this fraction, if the ratio holds"},
            {"rows_bucket": "64-127", "lo": 64, "hi": 128, "calls": 1610, "verdict": "worse", "calls_needed": None,
             "needed_because": None}]
    view = crossover_view(rows, 32, below=True)
    assert view["rows"] == 32 and view["decided"] is False
    assert view["undecided"] == {"rows_bucket": "32-63", "calls": 814, "calls_needed": 21000,
                                 "needed_because": "estimate at this fraction, if the ratio holds"}
    line = crossover_line({"crossover": view})
    assert "undecided" in line and "32-63" in line and "21,000" in line
    rows[1]["verdict"] = "no_worse"
    assert crossover_view(rows, 64, below=True)["decided"] is True  # ended by a bucket shown worse
    assert verdict(None, None) == "undecided" and verdict(0.5, 0.9) == "no_worse" and verdict(1.1, 1.3) == "worse"


def test_pooled_band_carries_the_cells_bounds_weighted_by_calls():
    rng = random.Random(8)
    a, b = _arm(rng, 40e-6, 2000, 0.0), _arm(rng, 20e-6, 2000, 0.0)
    plain = pooled([(1000, a, b)])
    wide = pooled([(1000, a, b, 400e-9, 400e-9)])
    assert wide.ratio == pytest.approx(plain.ratio)
    assert wide.low < plain.low and wide.high > plain.high
    assert (wide.stat_low, wide.stat_high) == pytest.approx((plain.low, plain.high))
