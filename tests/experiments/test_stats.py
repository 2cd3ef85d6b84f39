"""The statistics against references: the band's boundary against Robbins' normal mixture computed by quadrature,
the false-positive rate of A/A experiments looked at every flush, coverage at a known ratio, CUPED, merging."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from experiments.stats import (
    ALPHA, T_OPT, Moments, Saving, boundary, crossover, mixture_halfwidth, pooled, ratio, rho_squared, saving,
)


@pytest.mark.parametrize("t", [2, 30, 500, 20_000])
def test_boundary_is_where_the_normal_mixture_martingale_reaches_one_over_alpha(t):
    # Reference: for a sum S_t of t unit-variance terms, the N(0, rho^2) mixture of exp(l S - l^2 t / 2) over l,
    # integrated numerically, equals 1/alpha exactly at the boundary (Ville's inequality bounds crossing it by alpha)
    rho2 = rho_squared(T_OPT)
    s = mixture_halfwidth(t, 1.0) * t  # the boundary on the sum, for sigma 1
    lam = np.linspace(-40, 40, 400_001) / math.sqrt(t)
    density = np.exp(-lam**2 / (2 * rho2)) / math.sqrt(2 * math.pi * rho2)
    martingale = np.trapezoid(np.exp(lam * s - lam**2 * t / 2) * density, lam)
    assert martingale == pytest.approx(1 / ALPHA, rel=1e-6)


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return mean * math.exp(rng.gauss(-sigma * sigma / 2, sigma))  # mean-preserving


def _experiment(rng: random.Random, true_ratio: float, *, pairs: int, every: int, sigma: float = 0.35):
    """One simulated experiment looked at every ``every`` pairs: yields each look's Ratio."""
    a, b = Moments(), Moments()
    for k in range(1, pairs + 1):
        a.add(_lognormal(rng, 40e-6, sigma))
        b.add(_lognormal(rng, 40e-6 * true_ratio, sigma))
        if k % every == 0:
            yield ratio(a, b)


def test_aa_false_positive_rate_looked_at_every_flush_is_at_most_nominal():
    rng = random.Random(20261204)
    flagged = 0
    for _ in range(200):
        for look in _experiment(rng, 1.0, pairs=1000, every=10):
            if look.pairs >= 30 and (look.low > 1.0 or look.high < 1.0):  # any difference at all: the strictest
                flagged += 1
                break
    assert flagged / 200 <= 0.05, flagged


def test_band_covers_a_known_ratio_at_every_look_at_least_95_percent():
    rng = random.Random(7)
    covered = 0
    for _ in range(200):
        looks = list(_experiment(rng, 0.8, pairs=600, every=20))
        covered += all(r.low <= 0.8 <= r.high for r in looks if r.pairs >= 30)
    assert covered / 200 >= 0.95, covered
    assert looks[-1].high - looks[-1].low < 0.15  # and it is not wide for nothing


def test_cuped_removes_what_the_covariate_explains_and_stays_unbiased():
    rng = random.Random(3)
    plain, adjusted = [], []
    for _ in range(200):
        a, b = Moments(), Moments()
        for _ in range(200):
            for arm, scale in ((a, 1.0), (b, 0.7)):
                rows = rng.randint(2, 63)
                x = 1e-6 * (5 + rows)  # the prediction: time grows with rows
                arm.add(scale * x * math.exp(rng.gauss(0, 0.05)), x)
        with_x, without = ratio(a, b), ratio(a, b, cuped=False)
        assert with_x.cuped and not without.cuped
        plain.append(without.ratio)
        adjusted.append(with_x.ratio)
    assert abs(np.mean(adjusted) - 0.7) < 0.003
    assert np.std(adjusted) < 0.5 * np.std(plain)


def test_moments_merge_equals_one_pass():
    rng = random.Random(1)
    ys = [(rng.random(), rng.random()) for _ in range(300)]
    whole, left, right = Moments(), Moments(), Moments()
    for i, (y, x) in enumerate(ys):
        whole.add(y, x)
        (left if i < 120 else right).add(y, x)
    merged = left.merge(right)
    assert merged.n == whole.n and merged.nx == whole.nx
    for got, want in zip(merged.as_tuple()[1:], whole.as_tuple()[1:]):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert Moments.of(list(whole.as_tuple())) == whole


def test_pooled_bucket_weights_cells_by_their_calls():
    rng = random.Random(5)
    cells = []
    for weight, r in ((1000, 0.5), (10, 2.0)):
        a, b = Moments(), Moments()
        for _ in range(400):
            a.add(_lognormal(rng, 1.0, 0.1))
            b.add(_lognormal(rng, r, 0.1))
        cells.append((weight, a, b))
    got = pooled(cells)
    assert got.ratio == pytest.approx((1000 * 0.5 + 10 * 2.0) / 1010, rel=0.02)
    assert got.low < got.ratio < got.high < 1.0
    assert pooled([cells[0]]).ratio == pytest.approx(ratio(cells[0][1], cells[0][2]).ratio)


def test_saving_and_crossover():
    a, b = Moments(), Moments()
    rng = random.Random(9)
    for _ in range(500):
        a.add(_lognormal(rng, 2.0, 0.1))
        b.add(_lognormal(rng, 1.0, 0.1))
    s = saving([(1000, a, b)])
    assert s.low < s.seconds < s.high and s.seconds == pytest.approx(1000, rel=0.05)
    assert saving([]) == saving([(1000, a, Moments())]) == Saving(None, None, None)  # nothing measured: unknown
    buckets = [(1, 2, 0.3, 0.2), (2, 4, 0.5, 0.4), (32, 64, 1.2, 0.9), (64, 128, 1.5, 1.4)]
    assert crossover(buckets, below=True) == 4  # split below 4 is shown no worse; 32-63 is not shown
    assert crossover([(256, 512, 0.9, 0.8), (512, 1024, 0.7, 0.6)], below=False) == 256
    assert crossover([(256, 512, 1.1, 0.9)], below=False) is None


def test_boundary_helper_matches_halfwidth():
    assert boundary(100) == pytest.approx(mixture_halfwidth(100, 10.0))
