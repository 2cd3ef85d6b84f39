"""advise.latency: one model over tables; a kernel derived from a ratio; why a call has no price."""

from __future__ import annotations

import math

import pytest

from advise.latency import LatencyModel, Miss, Priced, Shape
from advise.tables import load_table

GLM = Shape(2048, "512+0", "bfloat16", "bfloat16")
AITER, INTREE, SPLIT = "aiter.pa_prefill_sparse", "intree.ragged_prefill", "intree.sparse_decode"


@pytest.fixture(scope="module")
def gfx942() -> LatencyModel:
    return LatencyModel([load_table("gfx942")])


def test_intree_on_gfx942_is_aiter_over_the_published_ratio(gfx942):
    intree = gfx942.price(INTREE, GLM, 512, 512, 512)
    aiter = gfx942.price(AITER, GLM, 512, 512, 512)
    assert isinstance(intree, Priced) and isinstance(aiter, Priced)
    assert intree.seconds == pytest.approx(aiter.seconds / 0.46)  # every interpolant, spread and bucket reading
    slope = math.log(8780 / 294) / math.log(1024)
    assert aiter.seconds[0, 1, 0] == pytest.approx(294e-6 * 32 ** slope)  # power law between 16 and 16384 rows
    assert aiter.seconds[1, 1, 0] == pytest.approx((294 + (8780 - 294) * (512 - 16) / (16384 - 16)) * 1e-6)
    assert set(intree.tables) == {"gfx942-mi325x-published"}


def test_outside_the_table_says_so_and_where_it_is_timed(gfx942):
    miss = gfx942.price(INTREE, GLM, 2, 2.5, 3)
    assert isinstance(miss, Miss)
    assert "outside the table" in miss.reason and "256-2048 rows" in miss.reason
    assert isinstance(gfx942.price(AITER, GLM, 2, 2.5, 3), Priced)  # 2-16 rows are published for pa_prefill_sparse


def test_a_shape_not_timed_names_what_the_table_has():
    h200 = LatencyModel([load_table("h200")])
    miss = h200.price(INTREE, Shape(32, "56+8", "bfloat16", "bfloat16"), 2, 2, 3)
    assert isinstance(miss, Miss)
    assert "top-k 32" in miss.reason and "top-k 128, 512, 2048" in miss.reason and "448+64" in miss.reason
    miss = h200.price("aiter.pa_prefill_sparse", GLM, 2, 2, 3)
    assert miss.reason == "no table times aiter.pa_prefill_sparse on sm90"


def test_tables_of_two_archs_cannot_price_one_routing():
    with pytest.raises(ValueError, match="different archs"):
        LatencyModel([load_table("h200"), load_table("gfx942")])


def test_the_first_table_wins(tmp_path):
    import json

    from advise.tables import shipped_path

    doc = json.loads(shipped_path("gfx942").read_text())
    doc["name"] = "mine"
    for p in doc["points"]:
        p["us"] *= 2
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(doc))
    mine, published = load_table(str(path)), load_table("gfx942")
    a = LatencyModel([mine, published]).price(AITER, GLM, 16, 16, 16)
    b = LatencyModel([published, mine]).price(AITER, GLM, 16, 16, 16)
    assert a.seconds[0, 1, 0] == pytest.approx(2 * b.seconds[0, 1, 0])
    assert a.tables == ("mine",) and b.tables == ("gfx942-mi325x-published",)
