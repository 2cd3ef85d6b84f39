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
