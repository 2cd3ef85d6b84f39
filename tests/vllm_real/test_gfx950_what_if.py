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


def test_a_flush_mid_call_exports_the_declined_call_in_tree(run):
    """Telemetry counts an OPUS-labelled call only at its stop, so "no OPUS call in mid-call" alone would
    hold without the plugin's reading of vLLM's gate; the in-flight call must also show, already in-tree
    with its decline, which only a label given before the call can do."""
    first, second = run.data["declined"]["mid_call"]
    for n, exported in enumerate((first, second), start=1):
        assert samples(exported, "routescope_calls_total", kernel=OPUS) == 0, exported
        assert samples(exported, "routescope_calls_total", kernel=INTREE, rows_bucket="8-15") == n, exported
        assert samples(exported, "routescope_decisions_total", kernel=INTREE, reason="gfx950_declined") == n
    assert samples(run.data["declined"]["after"], "routescope_calls_total", kernel=OPUS) == 0


def test_a_getter_returning_none_is_labelled_symbol_missing(run):
    symbol = run.data["symbol"]
    assert symbol["getter"] is None  # vLLM's real getter on this CPU: AITER MLA is not available
    assert samples(symbol["after"], "routescope_decisions_total", kernel=INTREE, reason="gfx950_symbol") == 1
    # every call the script made is exported exactly once: the raised one, the two declined, this one
    assert samples(symbol["after"], "routescope_calls_total") == 4
    assert samples(symbol["after"], "routescope_calls_total", kernel=INTREE, rows_bucket="8-15") == 3


def test_a_flush_mid_call_exports_no_opus_call_when_the_symbol_is_missing(run):
    (exported,) = run.data["symbol"]["mid_call"]
    assert samples(exported, "routescope_calls_total", kernel=OPUS) == 0, exported
    assert samples(exported, "routescope_calls_total") == 3  # the calls before it; this one counts at its stop
    # the multiprocess files keep a series once written: a stale 1 would stay beside the in-tree call
    assert samples(run.data["symbol"]["after"], "routescope_calls_total", kernel=OPUS) == 0


def test_a_call_vllm_raised_on_is_labelled_with_the_impl_it_attempted(run):
    assert run.data["raised"] == "ValueError"
    after = run.data["after_raise"]
    assert samples(after, "routescope_kernel_errors_total", kernel=INTREE, exception="ValueError") == 1
    assert samples(after, "routescope_calls_total", kernel=INTREE, impl="torch", rows_bucket="2-3") == 0
    assert samples(after, "routescope_calls_total", kernel=INTREE, impl="triton", rows_bucket="2-3") == 1
