"""The experiment's CUPED covariate and predicted ratio read advise's table at the call's own kv pool."""

from __future__ import annotations

import pytest

from advise.latency import Shape
from advise.tables import load_table, table_from_doc
from dispatcher.types import CallShape, Kernel
from experiments.covariate import Predictor

L2, HBM = 8 << 20, 256 << 20


def _cell(pool: int) -> tuple[float, float]:
    """(predicted A seconds at 256 rows, predicted B/A) for a split_below cell of the shipped H200 table."""
    predictor = Predictor([load_table("h200")])
    shape = CallShape(rows=256, kv_pool_bytes=pool)
    covariate, prediction = predictor.for_cell(Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE, shape, 256, 512)
    assert covariate is not None and prediction["ratio"] is not None, prediction
    return covariate(256), prediction["ratio"]


def test_the_pool_moves_the_covariate_and_the_prediction():
    """At 256-511 rows the prefill is slower past L2 and split-K turns from the slower kernel to the faster."""
    a_l2, ratio_l2 = _cell(L2)
    a_hbm, ratio_hbm = _cell(HBM)
    assert a_hbm > 1.3 * a_l2
    assert ratio_l2 > 1.3 and ratio_hbm < 1.0


def _brute_band(model, kernel_a: str, kernel_b: str, key, lo: int, mean: float, hi: int) -> tuple[float, float]:
    """B/A over every choice advise's band makes, enumerated here by hand: one interpolant and one bucket reading
    for both kernels, each kernel's spread (low, middle, high) apart."""
    a = model.price(kernel_a, key, lo, mean, hi).seconds
    b = model.price(kernel_b, key, lo, mean, hi).seconds
    values = [b[i, sb, k] / a[i, sa, k] for i in range(a.shape[0]) for k in range(a.shape[2])
              for sa in range(3) for sb in range(3)]
    return min(values), max(values)


@pytest.mark.parametrize(("lo", "hi", "pool"), [(2, 4, L2), (32, 64, HBM), (64, 128, 64 << 20), (16, 32, 0)])
def test_the_predictions_band_is_advises_own(lo, hi, pool):
    """The cell's band equals the range advise's priced arrays span (interpolants, the table's p20-p80, the bucket
    reading, and the kv pools between the table's, or all of them when the pool is unknown)."""
    predictor = Predictor([load_table("h200")])
    _, prediction = predictor.for_cell(Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE,
                                       CallShape(rows=lo, kv_pool_bytes=pool), lo, hi)
    key = Shape(2048, "448+64", "bfloat16", "bfloat16", pool or None)
    low, high = _brute_band(predictor.model, "intree.ragged_prefill", "intree.sparse_decode", key, lo,
                            (lo + hi - 1) / 2, hi)
    assert prediction["ratio_low"] == pytest.approx(low, rel=1e-12)
    assert prediction["ratio_high"] == pytest.approx(high, rel=1e-12)
    assert prediction["ratio_low"] < prediction["ratio"] < prediction["ratio_high"]
    between = pool not in (L2, HBM)  # 64 MiB lies between two of the table's pools; 0 is not known
    assert any("kv pool" in note for note in prediction["notes"]) is between


def test_the_pool_interpolation_widens_the_band():
    """Inside one of the table's pools the band is the interpolants' and spreads'; between two pools, or with no
    pool known, it spans the pools too, as advise's does."""
    widths = {}
    for pool in (L2, 64 << 20, 0):
        _, p = Predictor([load_table("h200")]).for_cell(Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE,
                                                        CallShape(rows=64, kv_pool_bytes=pool), 64, 128)
        widths[pool] = p["ratio_high"] - p["ratio_low"]
    assert widths[L2] * 3 < widths[64 << 20] < widths[0]


def _flat_table(spread_a: tuple[float, float, float], spread_b: tuple[float, float, float], *, topk: int = 2048,
                layout: str = "448+64"):
    """Two kernels timed flat (the same time at every power of two 1-1024 rows), each with a p20/median/p80 spread:
    every interpolant and bucket reading agrees, so only the spreads are left to make the band."""
    points = [{"kernel": kernel, "rows": 1 << r, "topk": topk, "us": mid, "low_us": low, "high_us": high,
               "source": "test"}
              for kernel, (low, mid, high) in (("intree.ragged_prefill", spread_a), ("intree.sparse_decode", spread_b))
              for r in range(11)]
    return table_from_doc({"format": "routescope-latency-table/1", "name": "flat", "device": "NVIDIA H200",
                           "arch": "sm90", "date": "2026-12-04", "provenance": "measured here", "source": "test",
                           "layouts": [layout], "points": points}, "flat.json")


def test_the_tables_spread_is_the_band_when_nothing_else_is_open():
    _, p = Predictor([_flat_table((9.0, 10.0, 11.0), (4.0, 5.0, 6.0))]).for_cell(
        Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE, CallShape(rows=100), 64, 128)
    assert (p["ratio"], p["ratio_low"], p["ratio_high"]) == pytest.approx((0.5, 4 / 11, 6 / 9), rel=1e-12)
    _, tight = Predictor([_flat_table((10.0, 10.0, 10.0), (5.0, 5.0, 5.0))]).for_cell(
        Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE, CallShape(rows=100), 64, 128)
    assert tight["ratio_low"] == pytest.approx(0.5) and tight["ratio_high"] == pytest.approx(0.5)


def test_a_gap_in_the_table_widens_the_band_and_says_so():
    """gfx942's published table times pa_prefill_sparse at 16 rows and then 16384: a 512-1023 cell is priced across
    that gap, so advise's band holds every curve from flat to proportional there, and the note names the gap."""
    _, p = Predictor([load_table("gfx942")]).for_cell(Kernel.INTREE_RAGGED_PREFILL, Kernel.AITER_PA_PREFILL_SPARSE,
                                                      CallShape(rows=512), 512, 1024)
    assert p["ratio_low"] < p["ratio"] < p["ratio_high"]
    assert any("more than 2x apart" in note for note in p["notes"])
    assert p["tables"] == ["gfx942-mi325x-published"]


def test_an_unpriced_cell_has_no_band_and_says_why():
    _, p = Predictor([load_table("h200")]).for_cell(Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE,
                                                    CallShape(rows=64, topk=96), 64, 128)
    assert p["ratio"] is None and p["ratio_low"] is None and p["ratio_high"] is None and "top-k" in p["reason"]
