"""advise.interp: interpolation in log(rows) between timed points, its alternatives, never past the table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from advise.interp import INTERPS, MAX_STEP, Curve, bucket_values


def flat(*pairs):
    return Curve(tuple(r for r, _ in pairs), tuple((v, v, v) for _, v in pairs))


def test_at_a_timed_point_every_interpolant_gives_the_point():
    c = Curve((1.0, 100.0), ((9.0, 10.0, 12.0), (90.0, 100.0, 110.0)))
    assert c.at(100.0).tolist() == [[90.0, 100.0, 110.0]] * len(INTERPS)
    assert c.at(1.0).tolist() == [[9.0, 10.0, 12.0]] * len(INTERPS)


def test_a_gap_over_2x_widens_the_band_to_a_flat_and_a_steep_curve():
    # the H200's prefill at top-k 2048 as the old table timed it: 16 and 256 rows only; measured flat to 128
    c = flat((16, 41.2), (256, 81.0))
    v = c.at(64.0)
    assert v[0, 1] == pytest.approx(41.2 * (81.0 / 41.2) ** 0.5)  # the power law: 57.8, 45% over the 40 measured
    low, high = v[:, 1].min(), v[:, 1].max()
    assert low == pytest.approx(41.2)  # flat until proportional to rows reaches 256's time
    assert high == pytest.approx(81.0)  # proportional to rows from 16, capped at 256's time
    assert low <= 40.5 * 1.02 and high >= 57.8  # the band holds both the measured flat curve and the power law
    assert c.gap(64.0) == (16.0, 256.0) and c.gap(16.0) is None


def test_a_gap_of_2x_or_less_keeps_the_two_interpolants():
    c = flat((64, 40.0), (128, 43.0), (256, 81.0))
    for rows in (90.0, 181.0):
        v = c.at(rows)
        assert c.gap(rows) is None
        assert v[2].tolist() == v[0].tolist() and v[3].tolist() == v[0].tolist()  # flat/steep repeat the power law
    assert MAX_STEP == 2.0


def test_a_falling_gap_spans_its_two_ends():
    c = flat((2, 20.0), (16, 10.0))
    v = c.at(4.0)
    assert v[:, 1].min() == pytest.approx(10.0) and v[:, 1].max() == pytest.approx(20.0)


def test_between_points_a_power_law_and_a_chord():
    c = flat((1, 10.0), (100, 100.0))
    v = c.at(10.0)
    assert v[0, 1] == pytest.approx(10 ** 1.5)  # log time linear in log rows: halfway in log(rows)
    assert v[1, 1] == pytest.approx(10 + 90 * 9 / 99)  # time linear in rows


def test_each_spread_is_interpolated_on_its_own():
    c = Curve((2.0, 8.0), ((1.0, 2.0, 4.0), (4.0, 8.0, 16.0)))
    v = c.at(4.0)
    assert v[0].tolist() == pytest.approx([2.0, 4.0, 8.0])  # halfway in log rows: the geometric mean of each
    assert v[1].tolist() == pytest.approx([2.0, 4.0, 8.0])  # linear: one third of the way


def test_never_extrapolated():
    c = flat((16, 1.0), (256, 2.0))
    assert c.at(15.9) is None and c.at(257) is None
    assert c.at(16 * (1 + 1e-12)) is not None  # float noise at an edge is not "outside"


def test_bucket_chord_spreads_calls_to_the_edges():
    c = flat((1, 1.0), (16, 16.0), (256, 16.0))  # linear up to 16 rows, flat after: concave across 8-31
    vals = bucket_values(c.at, 8.0, 12.0, 31.0)
    mean, chord = vals[1, 1, 0], vals[1, 1, 1]
    assert mean == pytest.approx(12.0)
    w = (12 - 8) / (31 - 8)
    assert chord == pytest.approx((1 - w) * 8.0 + w * 16.0)
    assert chord < mean  # concave: spreading to the edges costs less than all at the mean


def test_open_bucket_has_no_chord():
    c = flat((1, 1.0), (16384, 100.0))
    vals = bucket_values(c.at, 16384.0, 16384.0, None)
    assert np.array_equal(vals[..., 0], vals[..., 1])
    assert bucket_values(c.at, 16384.0, 20000.0, None) is None  # a mean past the table: no price


@pytest.mark.parametrize("rows, values", [
    ((), ()), ((2.0, 1.0), ((1, 1, 1), (1, 1, 1))), ((1.0,), ((2, 1, 3),)), ((1.0,), ((0, 0, 0),)),
])
def test_bad_curves_are_refused(rows, values):
    with pytest.raises(ValueError):
        Curve(rows, values)


def test_power_law_matches_log_log_slope():
    c = flat((16, 294.0), (16384, 8780.0))  # the seed's pa_prefill_sparse points
    slope = math.log(8780 / 294) / math.log(1024)
    assert c.at(512)[0, 1] == pytest.approx(294 * 32 ** slope)
