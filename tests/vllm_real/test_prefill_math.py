"""vLLM 0.33.0's own rocm_sparse_attn_prefill, run on CPU (Triton's interpreter) through the plugin's
wrapper, agrees with routescope's torch reference (dispatcher/kernels/torch_ref.py) to < 1e-3."""

from __future__ import annotations

import pytest

from .conftest import samples

SCRIPT = "prefill_math"
EXPECTED = {(layout, dtype, index) for layout in ("448+64", "512+0", "512+64") for dtype in ("float16", "float32")
            for index in ("dense", "ragged")}


def prepare(tmp):
    return {"ROUTESCOPE_VLLM": "1"}


def test_every_layout_dtype_and_index_form_ran_with_a_sink(run):
    with_sink = {(c["layout"], c["dtype"], c["index"]) for c in run.data["cases"] if c["sink"]}
    assert with_sink == EXPECTED


@pytest.mark.parametrize("i", range(len(EXPECTED) + 3))
def test_matches_the_reference(run, i):
    c = run.data["cases"][i]
    assert c["ref_max_abs"] > 0.05  # a real output, not zeros on both sides
    assert c["max_abs_err"] < 1e-3, c
    if c["dtype"] == "float32":
        assert c["max_abs_err"] < 1e-5, c


def test_each_call_was_observed_once(run):
    n = len(run.data["cases"])
    assert run.data["calls"] == n and run.data["errors"] == {}
    assert samples(run.data["samples"], "routescope_calls_total", kernel="intree.ragged_prefill", impl="triton") == n


def test_a_flush_during_the_first_call_exports_no_placeholder_impl(run):
    (exported,) = run.data["mid_call"]
    assert samples(exported, "routescope_calls_total", impl="torch") == 0, exported


def test_vllms_own_ragged_layout_is_the_adapters(run):
    """build_ragged_indices_from_dense (0.33.0's, as its OPUS branch calls it) makes a buffer of rows x width slots,
    rows packed from indptr: the AITER adapter's csr_from_dense makes the same (indptr and every row's slots, -1,
    out-of-pool and past-length entries dropped as vLLM drops them), and the gfx942 arm takes vLLM's without a
    refusal."""
    assert [(x["rows"], x["width"]) for x in run.data["layouts"]] == [(5, 8), (3, 16), (6, 2048)]
    for x in run.data["layouts"]:
        assert x["numel"] == x["rows"] * x["width"] and x["refusal"] is None and x["match"], x
