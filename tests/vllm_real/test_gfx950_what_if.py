"""What the plugin reports on a what-if gfx950 when vLLM does not take OPUS, a flush in mid-call, and the
impl label of a call vLLM raised on: against the real vLLM 0.33.0 module."""

from __future__ import annotations

import pytest

from .conftest import samples

SCRIPT = "gfx950_what_if"
OPUS, INTREE = "aiter.pa_sparse_prefill_opus", "intree.ragged_prefill"


def prepare(tmp):
    return {"ROUTESCOPE_VLLM": "1", "ROUTESCOPE_TELEMETRY_MULTIPROC_DIR": str(tmp / "multiproc")}


def test_vllm_declining_opus_without_its_getter_is_labelled_declined_from_the_first_call(run):
    after = run.data["declined"]["after"]
    assert samples(after, "routescope_decisions_total", kernel=INTREE, reason="gfx950_declined") == 2
    assert samples(after, "routescope_decisions_total", reason="gfx950_symbol") == 0  # the symbol was never asked for
    assert samples(after, "routescope_calls_total", kernel=INTREE, impl="triton", rows_bucket="8-15") == 2


def test_a_flush_mid_call_exports_no_opus_call_when_vllm_declines(run):
    for exported in run.data["declined"]["mid_call"]:
        assert samples(exported, "routescope_calls_total", kernel=OPUS) == 0, exported
    assert samples(run.data["declined"]["after"], "routescope_calls_total", kernel=OPUS) == 0


def test_a_getter_returning_none_is_labelled_symbol_missing(run):
    symbol = run.data["symbol"]
    assert symbol["getter"] is None  # vLLM's real getter on this CPU: AITER MLA is not available
    assert samples(symbol["after"], "routescope_decisions_total", kernel=INTREE, reason="gfx950_symbol") == 1


def test_a_flush_mid_call_exports_no_opus_call_when_the_symbol_is_missing(run):
    (exported,) = run.data["symbol"]["mid_call"]
    assert samples(exported, "routescope_calls_total", kernel=OPUS) == 0, exported
    # the multiprocess files keep a series once written: a stale 1 would stay beside the in-tree call
    assert samples(run.data["symbol"]["after"], "routescope_calls_total", kernel=OPUS) == 0


def test_a_call_vllm_raised_on_is_labelled_with_the_impl_it_attempted(run):
    assert run.data["raised"] == "ValueError"
    after = run.data["after_raise"]
    assert samples(after, "routescope_kernel_errors_total", kernel=INTREE, exception="ValueError") == 1
    assert samples(after, "routescope_calls_total", kernel=INTREE, impl="torch", rows_bucket="2-3") == 0
    assert samples(after, "routescope_calls_total", kernel=INTREE, impl="triton", rows_bucket="2-3") == 1
