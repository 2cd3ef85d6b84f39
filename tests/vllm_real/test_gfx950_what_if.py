"""What the plugin reports on a what-if gfx950 when vLLM does not take OPUS, a flush in mid-call, and the
impl label of a call vLLM raised on: against the real vLLM 0.33.0 module."""

from __future__ import annotations

import pytest

from .conftest import samples

SCRIPT = "gfx950_what_if"
OPUS, INTREE, SPLIT_K = "aiter.pa_sparse_prefill_opus", "intree.ragged_prefill", "intree.sparse_decode"


def prepare(tmp):
    # flushes by hand: the script reads the directory (and the experiments' registry flushes) when it chooses
    return {"ROUTESCOPE_VLLM": "1", "ROUTESCOPE_TELEMETRY_MULTIPROC_DIR": str(tmp / "multiproc"),
            "ROUTESCOPE_TELEMETRY_FLUSH_INTERVAL_S": "3600"}


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


def _b_positions(e: dict) -> list[int]:
    """Which of the experiment's positions the pure assignment put on B."""
    from experiments.assignment import STREAM_ARM, uniform

    return [i for i, (step, index) in enumerate(e["positions"]) if uniform(e["seed"], STREAM_ARM, step, index) < 0.1]


def test_an_experiment_whose_b_cannot_run_here_moves_nothing_and_counts_it(run):
    """gfx950_4 from the directory: B is OPUS, and vLLM's arch flag _ON_GFX950 is False on this CPU, so the plugin
    asks before launching anything, leaves the calls on vLLM's own routing and the experiment counts them."""
    e = run.data["experiments"]["unavailable"]
    assert e["picked_up"] is True
    assert e["runs"] == [{}, {}]  # no B launch, no timed call: the cell is unavailable from its first B draw
    assert e["view"]["never_moved"] == {"candidate_unavailable": 2}
    assert all(err < 1e-3 for err in e["errs"]), e["errs"]  # vLLM's in-tree kernel wrote every output
    assert run.data["routing"]["unavailable"] == {OPUS: 1}


def test_split_below_routes_its_b_calls_to_vllms_split_k_decode_and_checks_the_first(run):
    """split_below_16 from the directory: 8-row calls assigned to B run vLLM's rocm_sparse_attn_decode_bf16 (its
    Triton kernels, interpreted); the cell's first B call is a numerics sample (vLLM's entry into the output,
    split-K into scratch), which passes; every output the caller got matches the reference."""
    e = run.data["experiments"]["split"]
    b = _b_positions(e)
    assert [i for i, r in enumerate(e["runs"]) if "b" in r or "b_checked" in r] == b and len(b) >= 3
    assert e["runs"][b[0]] == {"b_checked": 1} and all(e["runs"][i] == {"b": 1} for i in b[1:])
    assert all(err < 1e-3 for err in e["errs"]), e["errs"]
    (cell,) = e["view"]["cells"]
    assert (cell["kernel_a"], cell["kernel_b"], cell["calls_b"], cell["timed_b"]) == (INTREE, SPLIT_K, len(b), len(b))
    assert cell["numerics"] == {"checked": 1, "mismatched": 0} and e["view"]["state"] == "running"
    assert cell["calls_a"] + cell["calls_b"] == len(e["runs"])
    assert samples(e["samples"], "routescope_decisions_total", kernel=SPLIT_K, reason="experiment_b") == len(b) - 1
    assert samples(e["samples"], "routescope_decode_path_calls_total") == 0  # B's launch is not a decode-entry call
    assert run.data["errors"] == {} and run.data["routing"]["errors"] == {}


def test_aa_runs_vllms_in_tree_kernel_on_both_arms(run):
    e = run.data["experiments"]["aa"]
    b = _b_positions(e)
    assert [i for i, r in enumerate(e["runs"]) if "b" in r or "b_checked" in r] == b and len(b) >= 2
    assert all(err < 1e-3 for err in e["errs"]), e["errs"]
    (cell,) = e["view"]["cells"]
    assert cell["kernel_a"] == cell["kernel_b"] == INTREE and cell["calls_b"] == len(b)
    assert cell["numerics"] == {"checked": 1, "mismatched": 0}


def test_decodes_split_k_moves_glm_pure_decodes_at_vllms_step_positions(run):
    """decodes_split_k: GLM-style pure decodes that vLLM's backend sends to the prefill entry (two layers per step,
    in real ForwardContexts) go to vLLM's split-K decode at the positions (step, layer) the assignment gives."""
    e = run.data["experiments"]["decodes"]
    b = _b_positions(e)
    routed = [i for i, pos in enumerate(e["positions"]) if i in b]
    per_step = [sum(r.values()) - r.get("a_timed", 0) for r in e["runs"]]
    assert per_step == [sum(1 for i in routed if i // 2 == k) for k in range(len(e["runs"]))] and len(b) >= 2
    assert all(err < 1e-3 for err in e["errs"]), e["errs"]
    (cell,) = e["view"]["cells"]
    assert (cell["kernel_a"], cell["kernel_b"], cell["call_class"]) == (INTREE, SPLIT_K, "pure_decode")
    assert cell["calls_b"] == len(b) and cell["numerics"]["mismatched"] == 0
    assert samples(e["samples"], "routescope_decode_in_prefill_calls_total", kernel=SPLIT_K) == 0
