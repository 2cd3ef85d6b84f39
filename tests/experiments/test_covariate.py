"""The experiment's CUPED covariate and predicted ratio read advise's table at the call's own kv pool."""

from __future__ import annotations

from advise.tables import load_table
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
