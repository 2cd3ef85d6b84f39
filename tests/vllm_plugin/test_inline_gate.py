"""The seed's gfx942 branch is written inline in vLLM's prefill entry: no predicate to ask, only vLLM's arch
flag ``_ON_GFX942``. A call that flag turns away is labelled in-tree before telemetry sees it (so a flush in
mid-call tells the truth); what only the launch shows is learnt after one call. vLLM here is TEST DOUBLES,
laid out at vLLM 0.33.0's binding sites."""

from __future__ import annotations

import logging

import pytest

from dispatcher import what_if
from dispatcher.types import Kernel
from routescope.vllm import plugin
from routescope.vllm.layout import Layout, inspect_ops
from tests.vllm_real.test_loader import SITES as REAL_SITES

from . import doubles
from .conftest import BACKEND, MODELS, OPS, prefill_args, samples, telemetry

ON = {"ROUTESCOPE_VLLM": "1"}
PA, INTREE = "aiter.pa_prefill_sparse", "intree.ragged_prefill"


def _flush_in_mid_call(ops, seen: list) -> None:
    """Make the double's in-tree math flush telemetry first and keep what a scrape would then read."""
    attend = ops._attend

    def flush_then_attend(*args, **kwargs):
        tel = telemetry()
        tel.flush()
        seen.append({k: samples(tel, "routescope_calls_total", kernel=k) for k in (PA, INTREE)})
        return attend(*args, **kwargs)

    ops._attend = flush_then_attend


def test_the_doubles_bind_where_vllm_0_33_0_binds():
    """No module of the doubles' own invention: the same importers tests/vllm_real finds in the real vLLM."""
    named = {path.removesuffix(".py").replace("/", ".") for path in doubles.SITES}
    assert named == set(REAL_SITES) - {OPS} == {BACKEND, *MODELS}


@pytest.mark.parametrize(("getters", "flags"), [("both", {"_ON_GFX942": Kernel.AITER_PA_PREFILL_SPARSE}),
                                                 ("opus_only", {})])
def test_the_arch_flag_is_read_only_for_a_present_inline_branch(vllm_doubles, getters, flags):
    found = inspect_ops(vllm_doubles(getters=getters).ops(), Layout())
    assert found.flags == flags  # OPUS has its predicate; a vLLM without the gfx942 getter has no branch
    assert found.gates == {"_can_use_aiter_sparse_prefill_opus": Kernel.AITER_OPUS}


def test_a_call_vllms_arch_flag_turns_away_is_in_tree_from_the_first_call_and_in_mid_call(vllm_doubles):
    d = vllm_doubles()
    ops = d.ops()
    ops._ON_GFX942 = False  # vLLM's own reading of the arch disagrees with the plugin's platform
    assert plugin.install(env=ON, platform=what_if("gfx942")) == "observing"
    seen: list = []
    _flush_in_mid_call(ops, seen)
    for seed in range(2):
        args, _ = prefill_args(600, seed=seed)
        d.backend().forward_prefill(*args)
    assert [e[0] for e in ops.LOG].count("pa") == 0
    assert seen == [{PA: 0, INTREE: 1}, {PA: 0, INTREE: 2}]  # counted at start, on the kernel that runs
    tel = telemetry()
    assert samples(tel, "routescope_decisions_total", kernel=INTREE, reason="gfx942_declined") == 2
    assert samples(tel, "routescope_calls_total", kernel=PA) == 0
    assert plugin.current().observer.mismatches == {}


def test_the_flag_is_read_as_vllm_reads_it_at_each_new_call_class(vllm_doubles):
    d = vllm_doubles()
    ops = d.ops()
    ops._ON_GFX942 = False
    plugin.install(env=ON, platform=what_if("gfx942"))
    args, _ = prefill_args(600)
    d.backend().forward_prefill(*args)
    ops._ON_GFX942 = True
    args, _ = prefill_args(600, heads=4)  # another call class: a decision-cache miss reads the flag again
    d.backend().forward_prefill(*args)
    assert [e[0] for e in ops.LOG if e[0] != "prefill"] == ["intree", "pa"]
    tel = telemetry()
    assert samples(tel, "routescope_calls_total", kernel=PA, impl="aiter") == 1
    assert samples(tel, "routescope_decisions_total", kernel=INTREE, reason="gfx942_declined") == 1
    assert plugin.current().observer.mismatches == {}


def test_what_only_the_launch_shows_costs_one_call_under_the_kernel_vllms_gate_chose(vllm_doubles):
    """The gate passed and vLLM asked its getter, which returned None (AITER off in vLLM's view): nothing
    before the call could tell. That call was counted when it started, under the kernel vLLM's gate chose,
    with impl triton (what ran); the plugin learns it, and every later call is in-tree from its start."""
    d = vllm_doubles()
    ops = d.ops()
    ops._ON_GFX942, ops.AITER_ENABLED = True, False
    plugin.install(env=ON, platform=what_if("gfx942"))
    seen: list = []
    _flush_in_mid_call(ops, seen)
    for seed in range(3):
        args, _ = prefill_args(600, seed=seed)
        d.backend().forward_prefill(*args)
    assert seen == [{PA: 1, INTREE: 0}, {PA: 1, INTREE: 1}, {PA: 1, INTREE: 2}]
    tel = telemetry()
    assert samples(tel, "routescope_calls_total", kernel=PA, impl="triton") == 1
    assert samples(tel, "routescope_decisions_total", kernel=INTREE, reason="gfx942_symbol") == 2
    assert plugin.current().observer.mismatches == {(PA, INTREE): 1}


def test_the_observing_line_names_the_flag(vllm_doubles, caplog):
    vllm_doubles().ops()
    with caplog.at_level(logging.INFO, logger="vllm.routescope"):
        plugin.install(env=ON, platform=what_if("gfx942"))
    (line,) = [r.getMessage() for r in caplog.records if "routescope: observing" in r.getMessage()]
    assert ("gfx942: aiter.pa_prefill_sparse from 512 rows (vLLM's _GFX942_AITER_PA_PREFILL_SPARSE_MIN_QUERIES), "
            "vLLM's arch flag _ON_GFX942 (an inline branch)") in line


def test_the_decline_says_which_flag(vllm_doubles):
    d = vllm_doubles()
    d.ops()._ON_GFX942 = False
    plugin.install(env=ON, platform=what_if("gfx942"))
    args, _ = prefill_args(600)
    d.backend().forward_prefill(*args)
    obs = plugin.current().observer
    (decision,) = obs._decisions.values()
    assert decision.gates[-1].detail == "vLLM's arch flag _ON_GFX942 is False: its inline aiter.pa_prefill_sparse " \
                                        "branch is not taken"
