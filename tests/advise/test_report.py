"""advise's figures as printed: seconds in the unit their three digits round into."""

from __future__ import annotations

import pytest

from advise.report import fmt_seconds


@pytest.mark.parametrize(("seconds", "printed"), [
    (-999.6e-6, "-1 ms"), (999.4e-6, "999 µs"), (0.9996, "1 s"), (99.96, "100 s"), (1234.4, "1234 s"),
    (5e-7, "0.5 µs"), (-0.0149, "-14.9 ms"), (2.5, "2.5 s"),
])
def test_a_figure_never_prints_as_an_exponent(seconds, printed):
    assert fmt_seconds(seconds) == printed
    value, unit = printed.split()
    assert float(value) * {"s": 1, "ms": 1e-3, "µs": 1e-6}[unit] == pytest.approx(seconds, rel=5e-3)


@pytest.mark.parametrize(("seconds", "digits", "printed"), [
    (2.915338, 6, "2.91534 s"), (123.4567, 6, "123.457 s"), (0.0123456, 5, "12.346 ms"), (2.915338, 3, "2.92 s"),
])
def test_more_digits_where_a_difference_needs_them(seconds, digits, printed):
    assert fmt_seconds(seconds, digits) == printed


def _outs(low: float, mid: float, high: float) -> list:
    from advise.report import BandOut, CandidateOut

    active = CandidateOut(name="active", kind="active", label="gfx942 gate at 512", gate=512, calls=100,
                          covered_calls=100, seconds=BandOut(mid=1.0, low=0.9, high=1.1))
    gate = CandidateOut(name="gfx942_256", kind="gate", label="gate at 256", gate=256, calls=100, covered_calls=100,
                        moved_calls=10, saving=BandOut(mid=mid, low=low, high=high))
    return [active, gate]


@pytest.mark.parametrize(("low", "confident"), [(0.002, True), (-0.0417, False), (0.0, False)])
def test_the_headline_recommends_only_a_saving_its_band_holds(low, confident):
    from advise.policies import target_for
    from advise.report import DecodeCostOut, _headline

    outs = _outs(low, 0.01, 0.0202)
    text = _headline("m", outs, outs[1], [256], DecodeCostOut(), target_for("gfx942"), "the h200 table")
    assert "moving the gfx942 gate from 512 to 256 rows" in text
    assert ("no confident recommendation" in text) is not confident
    assert text.startswith("m: moving") is confident
