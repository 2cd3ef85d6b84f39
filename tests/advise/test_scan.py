"""advise.scan and advise.report: savings over the calls a policy moves, their band, the scan, what is not priced."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from advise.latency import LatencyModel, Shape
from advise.report import advise
from advise.scan import band_of
from advise.tables import load_table
from advise.traffic import Traffic, entries_from, policy_from_dict

from .fixtures import RAGGED, SPLIT, entry

GLM = "GLM-5.3-Flash"
SHAPE = Shape(2048, "512+0", "bfloat16", "bfloat16")


def traffic(rows, *, arch="sm90", span_s=3600.0, gfx942_min_rows=512, counterfactuals=()):
    return Traffic(entries_from(rows), arch, policy_from_dict({"gfx942_min_rows": gfx942_min_rows}),
                   tuple(counterfactuals), None, span_s, "test", "fixture")


def by_name(model_advice):
    return {c.name: c for c in model_advice.candidates}


def test_band_takes_each_kernel_spread_apart():
    rng = np.random.default_rng(0)
    parts = {"a": rng.uniform(1, 2, (2, 3, 2)), "b": -rng.uniform(1, 2, (2, 3, 2))}
    brute = [parts["a"][i, s, b] + parts["b"][i, t, b] for i, s, t, b in product(range(2), range(3), range(3), range(2))]
    band = band_of(parts)
    assert band.low == pytest.approx(min(brute)) and band.high == pytest.approx(max(brute))
    assert band.mid == pytest.approx(parts["a"][0, 1, 0] + parts["b"][0, 1, 0])


def test_decodes_to_split_k_at_a_timed_point_is_exact_and_crosses_spreads():
    h200 = load_table("h200")
    l2 = 8 << 20  # the table's L2-resident pool: an entry labelled with its bucket is priced at it alone
    ragged, split = (h200.series[(k, 2048, "512+0", "bfloat16", "bfloat16", l2)] for k in (RAGGED, SPLIT))
    (r_lo, r_mid, r_hi), (s_lo, s_mid, s_hi) = ragged.values[ragged.rows.index(1.0)], split.values[split.rows.index(1.0)]
    out = advise(traffic([entry(GLM, "1", "pure_decode", 100, 100, 100, kv_pool_bytes=l2)]), [h200])
    m, = out.models
    c = by_name(m)["decodes_split_k"]
    assert c.moved_calls == 100
    assert c.saving.mid == pytest.approx(100 * (r_mid - s_mid) * 1e-6)
    assert c.saving.low == pytest.approx(100 * (r_lo - s_hi) * 1e-6)  # in-tree at its fastest, split-K at its slowest
    assert c.saving.high == pytest.approx(100 * (r_hi - s_lo) * 1e-6)
    assert c.saving_per_hour.mid == pytest.approx(c.saving.mid)  # one hour of traffic
    assert m.decode_in_prefill.cost.mid == pytest.approx(c.saving.mid)
    assert m.decode_in_prefill.calls == 100 and m.decode_in_prefill.decode_rows == 100


def test_calls_routed_alike_cancel():
    base = [entry(GLM, "2-3", "pure_decode", 50, 120, 120)]
    more = base + [entry(GLM, "16384+", "prefill", 10, 163840)]
    h200 = [load_table("h200")]
    a, b = (by_name(advise(traffic(rows), h200).models[0])["split_below_16"] for rows in (base, more))
    assert a.saving.mid == pytest.approx(b.saving.mid) and a.moved_calls == b.moved_calls == 50
    assert b.seconds.mid > a.seconds.mid  # the totals do count the big calls


def test_scan_on_gfx942_moves_calls_by_decide():
    rows = [entry(GLM, "256-511", "prefill", 40, 40 * 300), entry(GLM, "512-1023", "prefill", 10, 10 * 700,
                                                                        kernel="aiter.pa_prefill_sparse")]
    cf = [policy_from_dict({"gfx942_min_rows": 1024}, name="gfx942_1024")]
    m, = advise(traffic(rows, arch="gfx942", counterfactuals=cf), [load_table("gfx942")]).models
    c = by_name(m)
    assert c["gfx942_256"].moved_calls == 40 and c["gfx942_256"].saving.mid > 0  # ratio 0.84 at 256 rows: AITER wins
    assert c["gfx942_1024"].kind == "counterfactual" and c["gfx942_1024"].moved_calls == 10
    assert c["gfx942_1024"].saving.mid < 0  # back to in-tree at 512-1023 rows: ratio 0.46-0.30, a cost
    assert c["gfx942_128"].moved_calls == 40  # nothing between 128 and 255 rows
    assert m.best == "gfx942_256"  # gates 16-256 save as much; the nearest to the active 512 is named
    assert "any gate from 16 to 256 rows saves as much" in m.headline
    assert "moving the gfx942 gate from 512 to" in m.headline and "published, not measured here" in m.headline
    # The share is of the prefill-entry calls' predicted time (the only calls priced), not of all attention time.
    assert c["gfx942_256"].saving_share is not None
    assert "of the predicted prefill-entry kernel time" in m.headline and "sparse-attention" not in m.headline


def test_a_gate_inside_a_bucket_is_unknown_not_guessed():
    rows = [entry(GLM, "64-127", "prefill", 10, 900)]
    m, = advise(traffic(rows), [load_table("h200")], gates=(100,)).models
    c = by_name(m)["split_below_100"]
    assert c.saving is None and "gate 100 falls inside rows bucket 64-127" in c.saving_note


def test_outside_the_table_is_unpriced_and_counted():
    rows = [entry(GLM, "2-3", "pure_decode", 30, 75, 75), entry(GLM, "512-1023", "prefill", 5, 3500)]
    m, = advise(traffic(rows, arch="gfx942"), [load_table("gfx942")]).models
    active = m.candidates[0]
    assert active.covered_calls == 5 and active.calls == 35
    assert "outside the table" in active.uncovered[0].reason and active.uncovered[0].calls == 30
    dip = m.decode_in_prefill
    assert dip.calls == 30 and dip.cost is None and "no price" in dip.note


def test_mixed_batches_split_into_a_prefill_and_a_decode_call():
    h200 = load_table("h200")
    rows = [entry(GLM, "2048-4095", "mixed", 10, 10 * 2052, 10 * 4)]
    m, = advise(traffic(rows), [h200]).models
    fix = by_name(m)["fix_mixed"]
    lm = LatencyModel([h200])
    whole = lm.price(RAGGED, SHAPE, 2048, 2052, 4095).seconds[0, 1, 0]
    rest = lm.price(RAGGED, SHAPE, 2048, 2048, 2048).seconds[0, 1, 0]
    dec = lm.price(SPLIT, SHAPE, 4, 4, 4).seconds[0, 1, 0]
    assert fix.saving.mid == pytest.approx(10 * (whole - rest - dec))
    assert by_name(m)["decodes_split_k"].moved_calls == 0  # the guard only reroutes pure decodes


def test_no_table_gives_no_figure_and_says_so():
    out = advise(traffic([entry(GLM, "1", "pure_decode", 1, 1, 1)], arch="cpu"), [],
                 target_note="no latency table covers cpu")
    assert out.status == "no_table" and out.models == [] and "cpu" in out.message


def test_without_a_span_there_is_no_per_hour_figure():
    m, = advise(traffic([entry(GLM, "1", "pure_decode", 10, 10, 10)], span_s=None), [load_table("h200")]).models
    assert all(c.seconds_per_hour is None and c.saving_per_hour is None for c in m.candidates)
    assert "over the traffic" in m.headline and "an hour" not in m.headline
