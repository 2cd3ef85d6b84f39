"""advise.pools and the latency model's pool dimension: an entry is priced at its own pool, between the nearest two,
or (pool unknown) at the largest with the band across all; and a wide gap between timed rows widens the band."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from advise.latency import LatencyModel, Shape
from advise.pools import choose, combine
from advise.report import advise
from advise.tables import load_table, table_from_sweep

from .fixtures import RAGGED, SPLIT, entry
from .test_scan import GLM, by_name, traffic

SWEEP = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "h200-sweep-pools.json"
L2, HBM, SERVING = 8 << 20, 256 << 20, 4 << 30
POOLS = (L2, HBM, SERVING)


def test_an_entry_inside_a_pool_s_bucket_is_priced_at_that_pool():
    assert choose(POOLS, 8 << 20).pools == (L2,) and choose(POOLS, 4 << 30).pools == (SERVING,)
    assert choose(POOLS, 8 << 20).note == ""


def test_between_two_pools_the_estimate_leans_by_log_size_and_the_band_spans_both():
    c = choose(POOLS, 32 << 20)  # a 32-64 MiB pool: between 8 MiB and 256 MiB
    assert c.pools == (L2, HBM) and "spans both" in c.note
    assert c.toward == pytest.approx(np.log(32 * 2 ** 0.5 / 8) / np.log(256 / 8))
    a = np.array([[1.0, 2.0, 3.0]] * 4)
    b = np.array([[4.0, 8.0, 12.0]] * 4)
    got = combine(c, [a, b])
    assert got[0].tolist() == pytest.approx([1.0, 2.0 ** (1 - c.toward) * 8.0 ** c.toward, 12.0])


def test_past_the_pools_the_nearest_prices_it_and_says_so():
    assert choose(POOLS, 1 << 20).pools == (L2,) and "nearest, 8 MiB" in choose(POOLS, 1 << 20).note
    assert choose(POOLS, 64 << 30).pools == (SERVING,)


def test_an_unknown_pool_rests_on_the_largest_with_the_band_across_all():
    c = choose(POOLS, None)
    assert c.pools == POOLS and "unknown" in c.note
    vals = [np.full((4, 3), v) for v in (1.0, 5.0, 3.0)]
    got = combine(c, vals)
    assert got[0].tolist() == [1.0, 3.0, 5.0]  # low across all, estimate the largest pool's, high across all


def test_tables_without_pools_price_as_before():
    assert choose((None,), 8 << 20).pools == (None,) and choose((None,), None).pools == (None,)
    assert choose((L2,), None).pools == (L2,) and "one kv pool" in choose((L2,), 256 << 20).note


def _ratio(model: LatencyModel, rows: int, pool: int | None,
           layout: str = "448+64") -> tuple[float, float, float]:
    shape = Shape(2048, layout, "bfloat16", "bfloat16", pool)
    split, prefill = (model.price(k, shape, rows, rows, rows) for k in (SPLIT, RAGGED))
    return split.seconds[0, 1, 0] / prefill.seconds[0, 1, 0], prefill.seconds[:, :, 0].min(), prefill.seconds[:, :, 0].max()


def test_the_shipped_table_moves_the_answer_with_the_pool():
    """At 256-512 rows split-K is the slower kernel in L2 and the faster past it (docs/advise.md, "The kv pool")."""
    model = LatencyModel([load_table("h200")])
    for rows in (256, 512):
        assert _ratio(model, rows, L2)[0] > 1.3 and _ratio(model, rows, HBM)[0] < 1.0
    assert _ratio(model, 64, L2)[0] > 1.05 and _ratio(model, 32, L2)[0] < 0.7


def test_a_table_with_a_gap_widens_the_band_to_hold_the_flat_curve_it_missed():
    """The old table's grid (16 then 256 rows): its power law reads the prefill at 64 rows far above the timed 64."""
    doc = json.loads(SWEEP.read_text())
    full = LatencyModel([table_from_sweep(doc, "full.json")])
    doc["results"] = [r for r in doc["results"] if r["rows"] in (1, 2, 16, 256, 512, 1024, 2048, 16384)]
    gapped = LatencyModel([table_from_sweep(doc, "gapped.json")])
    shape = Shape(2048, "448+64", "bfloat16", "bfloat16", L2)
    timed = full.price(RAGGED, shape, 64, 64, 64).seconds[0, 1, 0]
    got = gapped.price(RAGGED, shape, 64, 64, 64)
    power_law = got.seconds[0, 1, 0]
    assert power_law > 1.3 * timed  # what misplaced the crossover
    assert got.seconds[:, 0, 0].min() <= timed <= got.seconds[:, 2, 0].max()  # the band holds the flat truth...
    assert got.seconds[:, 2, 0].max() >= power_law  # ...and the power law
    assert got.gaps == ((16.0, 256.0),)
    assert full.price(RAGGED, shape, 64, 64, 64).gaps == ()


def test_advise_names_the_gap_and_the_pool_it_priced_at():
    doc = json.loads(SWEEP.read_text())
    doc["results"] = [r for r in doc["results"] if r["rows"] in (1, 2, 16, 256, 16384)]
    gapped = table_from_sweep(doc, "gapped.json")
    out = advise(traffic([entry(GLM, "64-127", "prefill", 10, 800, kv_pool_bytes=32 << 20)]), [gapped])
    assert any("more than 2x apart" in n and "16 and 256" in n for n in out.notes)
    assert any("between the table's 8 MiB and 256 MiB" in n for n in out.notes)
    assert out.tables[0].kv_pools == list(POOLS)
    c = by_name(out.models[0])["split_below_128"]
    assert c.saving.low < c.saving.mid < c.saving.high


def test_price_without_a_pool_stays_backward_compatible():
    """Shape(topk, layout, q, kv) as before (the CUPED covariate's call): the largest pool's estimate."""
    model = LatencyModel([load_table("h200")])
    plain = model.price(SPLIT, Shape(2048, "512+0", "bfloat16", "bfloat16"), 16, 16, 16)
    serving = model.price(SPLIT, Shape(2048, "512+0", "bfloat16", "bfloat16", SERVING), 16, 16, 16)
    assert plain.seconds[0, 1, 0] == serving.seconds[0, 1, 0]
    assert plain.seconds.min() < serving.seconds.min()  # the band reaches down to the L2 pool's time
    assert model.pools_of(SPLIT, Shape(2048, "512+0", "bfloat16", "bfloat16")) == POOLS


def test_gates_that_save_as_much_resolve_to_the_kernels_crossing():
    """No call between 16 and 1024 rows: gates 16 to 128 move the same calls; the star goes to 64, where the
    H200's kernels cross in every pool, so calls that later fall in between go to the faster kernel."""
    from advise.policies import target_for
    from advise.report import crossing
    from advise.traffic import entries_from

    table = load_table("h200")
    model = LatencyModel([table])
    for pool in POOLS:
        rows = [entry(GLM, "8-15", "pure_decode", 100, 1000, 1000, kv_pool_bytes=pool),
                entry(GLM, "1024-2047", "prefill", 10, 15000, kv_pool_bytes=pool)]
        assert crossing(model, entries_from(rows), target_for("sm90")) == 64
        out = advise(traffic(rows), [table], gates=(16, 32, 64, 128))
        (m,) = out.models
        assert m.best == "split_below_64", (pool, m.headline)
        assert "any gate from 16 to 128 rows saves as much" in m.headline  # 64, not the nearest the active (16)
