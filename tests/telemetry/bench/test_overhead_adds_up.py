"""`bench overhead`'s printed row adds up: instrumented − bare lies within the printed difference's band, and a
difference the band swallows is marked as noise, with no ratio (and the JSON says why)."""

from __future__ import annotations

import re

import pytest

from telemetry.bench.cli import overhead_cells
from telemetry.bench.overhead import measure, paired

CELL = re.compile(r"^(-?\d+) ± (\d+)( \(noise\))?$")


@pytest.mark.parametrize(("a", "b"), [
    ([10.0, 11.0, 30.0, 12.0, 50.0], [9.0, 40.0, 10.0, 11.0, 10.0]),  # medians' difference far from the paired one
    ([100.0, 101.0, 102.0], [99.0, 100.0, 101.0]),
    ([5.0], [3.0]),
])
def test_the_band_covers_the_difference_of_the_medians(a, b):
    import statistics

    d, band = paired(a, b)
    assert d == statistics.median(x - y for x, y in zip(a, b))
    assert abs((statistics.median(a) - statistics.median(b)) - d) <= band + 1e-9


def _numbers(cells: list[str]) -> tuple[float, float, float, float, bool]:
    bare, instr = float(cells[0]), float(cells[1])
    m = CELL.match(cells[3])
    assert m, cells[3]
    return bare, instr, float(m[1]), float(m[2]), bool(m[3])


@pytest.mark.parametrize("kernels", ["noop", "real"])
def test_a_measured_row_adds_up_as_printed(kernels):
    r = measure(calls=64, repeats=5, kernels=kernels)
    cells = overhead_cells(r)
    bare, instr, diff, band, noise = _numbers(cells)
    assert abs(instr - bare - diff) <= band + 1  # each printed figure is rounded to 1 ns
    assert noise == (diff <= band)
    if r["naive_over_instrumented_overhead"] is None:
        assert cells[5] == "n/a (noise)" and r["naive_over_instrumented_note"].startswith("unknown: ")
    else:
        assert cells[5] == f"{r['naive_over_instrumented_overhead']:.1f}×" and r["naive_over_instrumented_note"] is None


def test_a_difference_inside_its_band_is_noise_with_no_ratio():
    r = measure(calls=64, repeats=3, kernels="noop")
    r.update(instrumented_minus_bare_ns=900.0, instrumented_minus_bare_band_ns=4000.0,
             naive_over_instrumented_overhead=None)
    cells = overhead_cells(r)
    assert cells[3] == "900 ± 4000 (noise)" and cells[5] == "n/a (noise)"
