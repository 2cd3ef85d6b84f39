"""Counterfactuals decided on a what-if arch: a CPU host counts what the gfx942 gate would do with its calls."""

from __future__ import annotations

import pytest
import torch

from dispatcher import Batch, Dispatcher, GuardMode, Policy, decide, detect, what_if
from dispatcher.validate import validate
from telemetry import TelemetryConfig

from .conftest import L, args_for, noop_registry, scrape, series, total

AITER, INTREE, DECODE = "aiter.pa_prefill_sparse", "intree.ragged_prefill", "intree.sparse_decode"
PREFILL_META = {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 1}
GATES = ("gfx942_512", "gfx942_1024", "no_row_gate")
ROWS = (2, 511, 512, 1023, 1024)


@pytest.fixture
def cpu() -> object:
    platform = detect()
    if platform.arch != "cpu":
        pytest.skip("this test is about a host that is not gfx942: it needs the CPU platform")
    return platform


def cpu_run(make_tel, platform, *, arch: str | None, counterfactuals=GATES, policy: Policy | None = None,
            calls=None, dtype=torch.bfloat16):
    policy = policy or Policy()
    calls = calls if calls is not None else [(rows, PREFILL_META) for rows in ROWS]
    tel = make_tel(TelemetryConfig(models=("glm",), counterfactuals=counterfactuals, counterfactual_arch=arch),
                   platform=platform, policy=policy)
    d = tel.instrument(Dispatcher(platform=platform, policy=policy, registry=noop_registry()))
    for rows, meta in calls:
        d(*args_for(rows, dtype=dtype), model="glm", **meta)
    return tel, d


def would(samples: dict, policy: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in series(samples, "routescope_would_route_calls_total", policy=policy).items():
        out[dict(k)["kernel"]] = out.get(dict(k)["kernel"], 0) + v
    return out


def test_what_if_gfx942_counts_as_the_gfx942_gate_routes_them(make_tel, cpu):
    tel, d = cpu_run(make_tel, cpu, arch="gfx942")
    s = scrape(tel.registry)
    # what ran: this CPU has no AITER branch, every call stayed in-tree
    assert {dict(k)["kernel"] for k in series(s, "routescope_calls_total")} == {INTREE}
    assert set(dict(k)["arch"] for k in series(s, "routescope_calls_total")) == {"cpu"}
    assert total(s, "routescope_decisions_total", reason="arch_not_gated") == len(ROWS)
    # what the gfx942 gate would have done with the same calls
    assert would(s, "gfx942_512") == {INTREE: 2, AITER: 3}  # 2, 511 | 512, 1023, 1024
    assert would(s, "gfx942_1024") == {INTREE: 4, AITER: 1}  # 2 .. 1023 | 1024
    assert would(s, "no_row_gate") == {AITER: 5}
    assert series(s, "routescope_would_route_calls_total", policy="gfx942_1024", rows_bucket="512-1023") == {
        L(policy="gfx942_1024", kernel=INTREE, rows_bucket="512-1023", model="glm", rank="0"): 2}
    # and exactly as the pure gate decides each call on a what-if gfx942 with AITER on
    gfx942 = what_if("gfx942", aiter=True)
    for p in tel.counterfactuals:
        expect: dict[str, float] = {}
        for rows in ROWS:
            k = decide(validate(*args_for(rows, dtype=torch.bfloat16)), gfx942, p, Batch()).kernel.value
            expect[k] = expect.get(k, 0) + 1
        assert would(s, p.name) == expect, p.name
    snap = tel.snapshot()
    assert [(c["name"], c["platform"]) for c in snap["counterfactuals"]] == [(g, "what-if gfx942") for g in GATES]
    cp = snap["counterfactual_platform"]
    assert cp["arch"] == "gfx942" and cp["what_if"] and cp["aiter_enabled"]
    assert snap["arch"] == "cpu" and snap["platform"]["arch"] == "cpu"  # the platform the calls ran on is unchanged
    assert tel.counterfactual_platform.arch == "gfx942" and tel.platform.arch == "cpu"


def test_none_decides_on_the_real_platform_as_before(make_tel, cpu):
    tel, _ = cpu_run(make_tel, cpu, arch=None)
    s = scrape(tel.registry)
    for p in GATES:
        assert would(s, p) == {INTREE: 5}, p
    snap = tel.snapshot()
    assert {c["platform"] for c in snap["counterfactuals"]} == {"cpu"}
    assert snap["counterfactual_platform"] == snap["platform"]


def test_the_what_if_gate_still_reads_the_call_shape(make_tel, cpu):
    tel, _ = cpu_run(make_tel, cpu, arch="gfx942", dtype=torch.float32)  # gfx942.q_dtype declines fp32
    s = scrape(tel.registry)
    for p in GATES:
        assert would(s, p) == {INTREE: 5}, p


def test_counterfactual_thresholds_stay_fine_bucket_edges(make_tel, cpu):
    calls = [(rows, PREFILL_META) for rows in (767, 768, 1000)]
    tel, _ = cpu_run(make_tel, cpu, arch="gfx942", counterfactuals=("mid:gfx942=768",), calls=calls)
    s = scrape(tel.registry)
    assert would(s, "mid") == {INTREE: 1, AITER: 2}
    assert "768-1023" not in tel.snapshot()["rows_buckets"]  # exported edges follow the active thresholds only
    gauges = series(s, "routescope_gate_threshold_rows", gate="gfx942_min_rows")
    assert gauges[L(gate="gfx942_min_rows", policy="mid")] == 768


def test_decode_rows_in_prefill_under_each_counterfactual(make_tel, cpu):
    calls = [(2, {"query_lens": [1, 1]}),  # pure decode (the GLM bug)
             (2048, {"query_lens": [1, 2047]}),  # mixed
             (600, PREFILL_META)]
    tel, _ = cpu_run(make_tel, cpu, arch="gfx942", calls=calls)
    rows = {(r["policy"], r["kernel"], r["rows_bucket"]): (r["calls"], r["decode_in_prefill_calls"])
            for r in tel.snapshot()["would_route"]}
    assert rows[("gfx942_512", INTREE, "2-3")] == (1, 1)  # the in-tree prefill has no split-K either
    assert rows[("no_row_gate", AITER, "2-3")] == (1, 1)  # the seed's 9x case
    assert rows[("gfx942_512", AITER, "2048-4095")] == (1, 1)
    assert rows[("gfx942_512", AITER, "512-1023")] == (1, 0)
    assert rows[("gfx942_1024", INTREE, "512-1023")] == (1, 0)


def test_guard_reroute_follows_into_the_counterfactuals(make_tel, cpu):
    calls = [(2, {"query_lens": [1, 1]})]
    tel, _ = cpu_run(make_tel, cpu, arch="gfx942", calls=calls, policy=Policy(guard=GuardMode.REROUTE))
    rows = tel.snapshot()["would_route"]
    assert {(r["policy"], r["kernel"], r["decode_in_prefill_calls"]) for r in rows} == {
        (p, DECODE, 0) for p in GATES}


def test_the_arch_survives_a_rebuild_for_the_dispatchers_policy(make_tel, cpu):
    tel = make_tel(TelemetryConfig(models=("glm",), counterfactual_arch="gfx942"), platform=cpu)
    d = tel.instrument(Dispatcher(platform=cpu, policy=Policy(gfx942_min_rows=768), registry=noop_registry()))
    d(*args_for(700, dtype=torch.bfloat16), model="glm", **PREFILL_META)
    assert tel.policy.gfx942_min_rows == 768 and tel.counterfactual_platform.arch == "gfx942"
    assert would(scrape(tel.registry), "no_row_gate") == {AITER: 1}


@pytest.mark.parametrize(("arch", "expected"), [("gfx942", "gfx942"), (None, "cpu")])
def test_each_counterfactual_says_which_arch_it_is_decided_on(make_tel, cpu, arch, expected):
    """routescope_counterfactual_policy_info{policy, arch} = 1: what-if arch when set, the platform's own otherwise."""
    tel, _ = cpu_run(make_tel, cpu, arch=arch)
    s = scrape(tel.registry)
    info = series(s, "routescope_counterfactual_policy_info")
    assert info == {L(policy=p, arch=expected): 1.0 for p in GATES}
