"""The demo's what-if: its calls decided again on a what-if gfx942, per policy; pure, no launches."""

from __future__ import annotations

import pytest

from dispatcher import Policy
from service.demo.traffic import DEMO_MODELS, CallSpec
from service.demo.whatif import WhatIf, bucket_low

LABELS = ["0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127", "128-255", "256-511", "512-1023",
          "1024-2047", "2048-4095", "4096-8191", "8192-16383", "16384+"]
POLICIES = (Policy(), Policy(gfx942_min_rows=1024, name="gfx942_1024"), Policy(gfx942_min_rows=0, name="no_row_gate"))


def call(rows: tuple[int, ...], decodes: int = 0, model: str = "GLM-5.3-Flash") -> CallSpec:
    return CallSpec(0, model, "prefill", rows, decodes, 0)


def table(w: WhatIf) -> dict:
    return {(r["policy"], r["kernel"], r["rows_bucket"]): (r["calls"], r["decode_in_prefill_calls"]) for r in w.rows()}


@pytest.mark.parametrize("label, low", [("0", 0), ("1", 1), ("512-1023", 512), ("16384+", 16384), ("768-1023", 768)])
def test_bucket_low(label, low):
    assert bucket_low(label) == low


def test_the_gate_at_512_and_1024_on_a_what_if_gfx942():
    w = WhatIf(POLICIES, LABELS, DEMO_MODELS)
    assert w.platform.arch == "gfx942" and w.platform.what_if and w.platform.aiter_enabled
    for rows in (511, 512, 1023, 1024, 16384, 20000):
        w.record(call((rows,)))
    t = table(w)
    assert t[("active", "intree.ragged_prefill", "256-511")] == (1, 0)
    assert t[("active", "aiter.pa_prefill_sparse", "512-1023")] == (2, 0)
    assert t[("gfx942_1024", "intree.ragged_prefill", "512-1023")] == (2, 0)
    assert t[("gfx942_1024", "aiter.pa_prefill_sparse", "1024-2047")] == (1, 0)
    assert t[("no_row_gate", "aiter.pa_prefill_sparse", "256-511")] == (1, 0)
    assert t[("active", "aiter.pa_prefill_sparse", "16384+")] == (2, 0)


def test_glm_decode_rows_in_prefill_under_each_policy():
    w = WhatIf(POLICIES, LABELS, DEMO_MODELS)
    w.record(call((1, 1)))  # pure decode, 2 rows
    w.record(call((1, 2047), decodes=1))  # mixed, 2048 rows
    t = table(w)
    assert t[("active", "intree.ragged_prefill", "2-3")] == (1, 1)  # in-tree prefill: no split-K either
    assert t[("no_row_gate", "aiter.pa_prefill_sparse", "2-3")] == (1, 1)  # the seed's 9x case
    assert t[("active", "aiter.pa_prefill_sparse", "2048-4095")] == (1, 1)


def test_unknown_models_are_ignored_and_labels_are_required():
    w = WhatIf(POLICIES, LABELS, DEMO_MODELS)
    w.record(call((600,), model="someone-else"))
    assert w.rows() == []
    with pytest.raises(ValueError):
        WhatIf(POLICIES, [], DEMO_MODELS)
