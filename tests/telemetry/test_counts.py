"""Exact counts per label set, classification, guard modes, counterfactuals, errors, decode path, snapshot."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch

from dispatcher import DecodeInPrefillError, GuardMode, Policy, what_if
from dispatcher.kernels import KernelImpl, default_registry
from dispatcher.kernels.aiter import AiterSymbol, make_adapter
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill
from dispatcher.types import Kernel
from telemetry import TelemetryConfig
from telemetry.bench.workload import MIX, make_calls

from .conftest import IMPL, L, args_for, dispatcher, noop_registry, scrape, series, total

AITER, INTREE, DECODE = "aiter.pa_prefill_sparse", "intree.ragged_prefill", "intree.sparse_decode"
PREFILL_META = {"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 1}


def calls_of(samples: dict) -> dict:
    return series(samples, "routescope_calls_total")


def test_exact_counts_per_label_set(make_tel):
    tel = make_tel(TelemetryConfig(models=("glm",)))
    d = tel.instrument(dispatcher())
    plan = (
        [(600, PREFILL_META, "glm")] * 7
        + [(3, {"query_lens": [1, 2]}, "llama")] * 5
        + [(4, {"num_decodes": 4, "num_decode_tokens": 4, "num_prefills": 0}, None)] * 3
        + [(2048, {}, "glm")] * 2
    )
    random.Random(3).shuffle(plan)
    for rows, meta, model in plan:
        d(*args_for(rows), model=model, **meta)
    s = scrape(tel.registry)
    base = {"impl": IMPL, "arch": "gfx942", "rank": "0"}
    assert calls_of(s) == {
        L(kernel=AITER, rows_bucket="512-1023", model="glm", call_class="prefill", **base): 7,
        L(kernel=INTREE, rows_bucket="2-3", model="other", call_class="mixed", **base): 5,
        L(kernel=INTREE, rows_bucket="4-7", model="unknown", call_class="pure_decode", **base): 3,
        L(kernel=AITER, rows_bucket="2048-4095", model="glm", call_class="unknown", **base): 2,
    }
    assert series(s, "routescope_rows_total") == {
        L(kernel=AITER, rows_bucket="512-1023", model="glm", call_class="prefill", rank="0"): 4200,
        L(kernel=INTREE, rows_bucket="2-3", model="other", call_class="mixed", rank="0"): 15,
        L(kernel=INTREE, rows_bucket="4-7", model="unknown", call_class="pure_decode", rank="0"): 12,
        L(kernel=AITER, rows_bucket="2048-4095", model="glm", call_class="unknown", rank="0"): 4096,
    }
    assert series(s, "routescope_decisions_total") == {
        L(kernel=AITER, reason="gfx942_pa_prefill_sparse", model="glm", rank="0"): 9,
        L(kernel=INTREE, reason="gfx942_min_rows", model="other", rank="0"): 5,
        L(kernel=INTREE, reason="gfx942_min_rows", model="unknown", rank="0"): 3,
    }
    assert series(s, "routescope_decode_in_prefill_calls_total") == {
        L(kernel=INTREE, model="other", call_class="mixed", rank="0"): 5,
        L(kernel=INTREE, model="unknown", call_class="pure_decode", rank="0"): 3,
    }
    assert series(s, "routescope_decode_in_prefill_rows_total") == {
        L(kernel=INTREE, model="other", call_class="mixed", rank="0"): 5,
        L(kernel=INTREE, model="unknown", call_class="pure_decode", rank="0"): 12,
    }
    wr = "routescope_would_route_calls_total"
    assert series(s, wr, policy="gfx942_1024") == {
        L(policy="gfx942_1024", kernel=INTREE, rows_bucket="512-1023", model="glm", rank="0"): 7,
        L(policy="gfx942_1024", kernel=INTREE, rows_bucket="2-3", model="other", rank="0"): 5,
        L(policy="gfx942_1024", kernel=INTREE, rows_bucket="4-7", model="unknown", rank="0"): 3,
        L(policy="gfx942_1024", kernel=AITER, rows_bucket="2048-4095", model="glm", rank="0"): 2,
    }
    assert series(s, wr, policy="no_row_gate") == {
        L(policy="no_row_gate", kernel=AITER, rows_bucket="512-1023", model="glm", rank="0"): 7,
        L(policy="no_row_gate", kernel=AITER, rows_bucket="2-3", model="other", rank="0"): 5,
        L(policy="no_row_gate", kernel=AITER, rows_bucket="4-7", model="unknown", rank="0"): 3,
        L(policy="no_row_gate", kernel=AITER, rows_bucket="2048-4095", model="glm", rank="0"): 2,
    }
    # fewer calls per slot than sample_first: every call was timed
    assert series(s, "routescope_call_duration_seconds_count") == {
        L(kernel=AITER, rows_bucket="512-1023", model="glm", clock="host", rank="0"): 7,
        L(kernel=INTREE, rows_bucket="2-3", model="other", clock="host", rank="0"): 5,
        L(kernel=INTREE, rows_bucket="4-7", model="unknown", clock="host", rank="0"): 3,
        L(kernel=AITER, rows_bucket="2048-4095", model="glm", clock="host", rank="0"): 2,
    }
    for name in ("routescope_guard_rerouted_calls_total", "routescope_guard_refused_calls_total",
                 "routescope_kernel_errors_total", "routescope_telemetry_errors_total"):
        assert series(s, name) == {}, name


def _bucket(rows: int, thresholds: tuple[int, ...]) -> str:
    """An independent bucket oracle: walk the edges."""
    edges = sorted({0, *(1 << i for i in range(15)), *(t for t in thresholds if t > 0)})
    lo = max(e for e in edges if e <= rows)
    nxt = [e for e in edges if e > lo]
    if not nxt:
        return f"{lo}+"
    return str(lo) if nxt[0] - lo == 1 else f"{lo}-{nxt[0] - 1}"


def test_many_calls_match_the_dispatchers_own_decisions(make_tel):
    """10,000 mixed calls, past sampling and the first-call path: counts equal a tally of returned decisions."""
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4")))
    d = tel.instrument(dispatcher())
    want_calls: dict = {}
    want_rows: dict = {}
    for args, kw in make_calls(10_000):
        dec = d(*args, **kw)
        rows = args[0].shape[0]
        model = kw["model"] if kw["model"] in ("glm", "dsv4") else ("unknown" if kw["model"] is None else "other")
        key = (dec.kernel.value, _bucket(rows, (512, 1024)), model, dec.call_class.value)
        want_calls[key] = want_calls.get(key, 0) + 1
        want_rows[key] = want_rows.get(key, 0) + rows
    s = scrape(tel.registry)
    got = {(dict(k)["kernel"], dict(k)["rows_bucket"], dict(k)["model"], dict(k)["call_class"]): v
           for k, v in calls_of(s).items()}
    assert got == want_calls
    got_rows = {(dict(k)["kernel"], dict(k)["rows_bucket"], dict(k)["model"], dict(k)["call_class"]): v
                for k, v in series(s, "routescope_rows_total").items()}
    assert got_rows == want_rows
    assert total(s, "routescope_decisions_total") == 10_000
    for policy in ("gfx942_1024", "no_row_gate"):
        assert total(s, "routescope_would_route_calls_total", policy=policy) == 10_000
    sampled = total(s, "routescope_call_duration_seconds_count")
    assert 0 < sampled < 10_000  # first calls of each slot, then one in sample_every


@pytest.mark.parametrize("meta, spec, cls, decode_rows", [
    ({"num_decodes": 0, "num_decode_tokens": 0, "num_prefills": 2}, 0, "prefill", 0),
    ({"num_decodes": 2, "num_decode_tokens": 2, "num_prefills": 1}, 0, "mixed", 2),
    ({"num_decodes": 8, "num_decode_tokens": 8, "num_prefills": 0}, 0, "pure_decode", 8),
    ({"query_lens": [3, 3, 2]}, 2, "pure_decode", 8),  # MTP verify: query length <= 1 + spec tokens
    ({"query_lens": [1, 7]}, 0, "mixed", 1),
    ({"query_lens": [8]}, 0, "prefill", 0),
    ({}, 0, "unknown", 0),
])
def test_call_class_and_decode_rows(make_tel, meta, spec, cls, decode_rows):
    policy = Policy(spec_tokens=spec)
    tel = make_tel(policy=policy)
    d = tel.instrument(dispatcher(policy=policy))
    for _ in range(3):
        d(*args_for(8), model="glm", **meta)
    s = scrape(tel.registry)
    assert {dict(k)["call_class"] for k in calls_of(s)} == {cls}
    assert total(s, "routescope_calls_total") == 3
    dip_rows = total(s, "routescope_decode_in_prefill_rows_total", call_class=cls)
    assert dip_rows == 3 * decode_rows  # intree.ragged_prefill (8 rows < 512) is a prefill kernel


def test_guard_observe_counts_decode_in_prefill_and_logs_once(make_tel, caplog):
    tel = make_tel()
    d = tel.instrument(dispatcher())
    with caplog.at_level(logging.WARNING, logger="routescope.telemetry"):
        for _ in range(4):
            d(*args_for(600), model="glm", query_lens=[1] * 600)
            d(*args_for(2), model="glm", query_lens=[1, 1])
    s = scrape(tel.registry)
    assert series(s, "routescope_decode_in_prefill_calls_total") == {
        L(kernel=AITER, model="glm", call_class="pure_decode", rank="0"): 4,
        L(kernel=INTREE, model="glm", call_class="pure_decode", rank="0"): 4,
    }
    assert total(s, "routescope_decode_in_prefill_rows_total", kernel=AITER) == 2400
    logs = [r for r in caplog.records if "decode rows in prefill" in r.getMessage()]
    assert len(logs) == 2  # once per model x kernel
    first = tel.snapshot()["decode_in_prefill"]["first_occurrences"]
    assert {(f["kernel"], f["rows"], f["decode_rows"], f["heads"], f["topk"]) for f in first} == {
        (AITER, 600, 600, 2, 4), (INTREE, 2, 2, 2, 4)}


def test_guard_reroute_runs_split_k_decode_and_counts_it(make_tel):
    policy = Policy(guard=GuardMode.REROUTE)
    tel = make_tel(policy=policy)
    d = tel.instrument(dispatcher(policy=policy, registry=default_registry(triton=False)))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 64, generator=g)
    kv = torch.randn(40, 1, 64, generator=g)
    idx = torch.randint(-1, 40, (2, 16), generator=g, dtype=torch.int32)
    out = torch.zeros(2, 2, 48)
    ref = torch.zeros(2, 2, 48)
    ragged_prefill(KernelArgs(q, kv, SparseIndex(idx, None), 0.2, None, ref))
    for _ in range(3):
        dec = d(q, kv, idx, None, 0.2, 64, 48, 16, None, out, query_lens=[1, 1], model="glm")
        assert dec.kernel is Kernel.INTREE_SPARSE_DECODE
    torch.testing.assert_close(out, ref)
    d(*args_for(600), query_lens=[1] * 600, model="glm")  # fp16, >= 512 rows: rerouted away from AITER
    s = scrape(tel.registry)
    assert series(s, "routescope_guard_rerouted_calls_total") == {
        L(from_kernel=INTREE, to_kernel=DECODE, model="glm", rank="0"): 3,
        L(from_kernel=AITER, to_kernel=DECODE, model="glm", rank="0"): 1,
    }
    assert total(s, "routescope_decisions_total", reason="guard_rerouted_pure_decode") == 4
    assert total(s, "routescope_calls_total", kernel=DECODE, impl="torch") == 4
    assert series(s, "routescope_decode_in_prefill_calls_total") == {}


def test_guard_raise_refuses_counts_and_reraises(make_tel):
    policy = Policy(guard=GuardMode.RAISE)
    tel = make_tel(policy=policy)
    d = tel.instrument(dispatcher(policy=policy))
    for _ in range(2):
        with pytest.raises(DecodeInPrefillError):
            d(*args_for(4), query_lens=[1, 1, 1, 1], model="dsv4")
    d(*args_for(4), query_lens=[1, 3], model="dsv4")  # mixed: not refused
    s = scrape(tel.registry)
    assert series(s, "routescope_guard_refused_calls_total") == {L(kernel=INTREE, model="dsv4", rank="0"): 2}
    assert total(s, "routescope_calls_total") == 1  # refused calls were not launched
    assert total(s, "routescope_decisions_total") == 3
    assert series(s, "routescope_kernel_errors_total") == {}


def test_counterfactual_custom_threshold_counts(make_tel):
    cfg = TelemetryConfig(models=("glm",), counterfactuals=("gfx942_600", "low:gfx942=2", "no_row_gate"))
    tel = make_tel(cfg)
    d = tel.instrument(dispatcher())
    for rows in (1, 2, 599, 600, 1000):
        d(*args_for(rows), model="glm", **PREFILL_META)
    s = scrape(tel.registry)
    def would(policy: str) -> dict:
        out: dict = {}
        for k, v in series(s, "routescope_would_route_calls_total", policy=policy).items():
            out[dict(k)["kernel"]] = out.get(dict(k)["kernel"], 0) + v
        return out
    assert would("gfx942_600") == {INTREE: 3, AITER: 2}
    assert would("low") == {INTREE: 1, AITER: 4}
    assert would("no_row_gate") == {AITER: 5}
    # exported buckets follow the active thresholds only: 599 and 600 share 512-1023
    assert total(s, "routescope_would_route_calls_total", policy="gfx942_600", rows_bucket="512-1023") == 3
    gauges = series(s, "routescope_gate_threshold_rows", gate="gfx942_min_rows")
    assert gauges[L(gate="gfx942_min_rows", policy="gfx942_600")] == 600
    assert gauges[L(gate="gfx942_min_rows", policy="active")] == 512


def test_kernel_errors_counted_and_reraised_unchanged(make_tel):
    exc = ValueError("boom")
    tel = make_tel()
    d = tel.instrument(dispatcher(registry=noop_registry({Kernel.INTREE_RAGGED_PREFILL: exc})))
    for _ in range(3):
        with pytest.raises(ValueError) as info:
            d(*args_for(8), model="glm")
        assert info.value is exc
    s = scrape(tel.registry)
    assert series(s, "routescope_kernel_errors_total") == {
        L(kernel=INTREE, exception="ValueError", model="glm", rank="0"): 3}
    assert total(s, "routescope_calls_total", kernel=INTREE, impl="torch") == 3


def test_opus_declined_at_launch_is_counted_where_it_ran(make_tel):
    """gfx950: the OPUS symbol is missing, the dispatcher falls back in-tree; telemetry follows it."""
    platform = what_if("gfx950")
    tel = make_tel(platform=platform)
    reg = noop_registry()
    reg.register(KernelImpl(Kernel.AITER_OPUS, "aiter", make_adapter(AiterSymbol("opus", "no_such_module_rs"))),
                 prefer=True)
    d = tel.instrument(dispatcher(platform=platform, registry=reg))
    for _ in range(3):
        dec = d(*args_for(2048, dtype=torch.bfloat16, sink=True, full_out=True), model="glm")
        assert dec.kernel is Kernel.INTREE_RAGGED_PREFILL
    s = scrape(tel.registry)
    assert calls_of(s) == {L(kernel=INTREE, impl=IMPL, rows_bucket="2048-4095", model="glm", call_class="unknown",
                             arch="gfx950", rank="0"): 3}
    assert series(s, "routescope_decisions_total") == {
        L(kernel=INTREE, reason="gfx950_symbol", model="glm", rank="0"): 3}
    assert total(s, "routescope_rows_total") == 3 * 2048


def test_decode_path_counts(make_tel):
    tel = make_tel()
    for rows in (1, 2, 5):
        tel.record_decode_path(rows, "glm")
    tel.record_decode_path(3, "mistral")
    s = scrape(tel.registry)
    assert series(s, "routescope_decode_path_calls_total") == {L(model="glm", rank="0"): 3,
                                                               L(model="other", rank="0"): 1}
    assert total(s, "routescope_decode_path_rows_total", model="glm") == 8


def test_model_labels_stay_bounded(make_tel):
    tel = make_tel(TelemetryConfig(models=("glm",)))
    d = tel.instrument(dispatcher())
    for i in range(300):
        d(*args_for(8), model=f"tenant-{i}")
    d(*args_for(8), model="glm")
    d(*args_for(8), model=None)
    s = scrape(tel.registry)
    assert {dict(k)["model"] for k in calls_of(s)} == {"glm", "other", "unknown"}
    assert total(s, "routescope_calls_total", model="other") == 300


def test_snapshot_keys_and_json(make_tel):
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4"), decisions_maxlen=16))
    d = tel.instrument(dispatcher())
    for args, kw in make_calls(5 * len(MIX)):
        d(*args, **kw)
    snap = tel.snapshot()
    json.dumps(snap)
    for key in ("platform", "policy", "counterfactuals", "counts", "decode_in_prefill", "latency", "decisions",
                "would_route", "errors", "health"):
        assert key in snap
    assert set(snap["health"]) >= {"telemetry_errors", "dropped", "last_flush_ts", "flush_lag_s", "probe_failures"}
    assert {"kernel", "impl", "rows_bucket", "model", "call_class", "calls", "rows"} <= set(snap["counts"][0])
    assert sum(c["calls"] for c in snap["counts"]) == 5 * len(MIX)
    lat = snap["latency"][0]
    assert {"kernel", "rows_bucket", "model", "samples", "p50_s", "p90_s", "p99_s"} <= set(lat)
    assert 0 < lat["p50_s"] <= lat["p90_s"] <= lat["p99_s"]
    assert len(snap["decisions"]) == 16
    assert {"ts", "kernel", "reason", "reason_code", "rows", "model", "call_class", "decode_rows"} <= set(snap["decisions"][0])
    assert {c["name"] for c in snap["counterfactuals"]} == {"gfx942_1024", "no_row_gate"}
    assert snap["decode_in_prefill"]["counts"] and snap["decode_in_prefill"]["first_occurrences"]
    assert snap["health"]["telemetry_errors"] == {s: 0 for s in snap["health"]["telemetry_errors"]}


def test_instrument_adopts_the_dispatchers_policy(make_tel):
    tel = make_tel()  # built for the default policy
    policy = Policy(gfx942_min_rows=768)
    d = tel.instrument(dispatcher(policy=policy))
    d(*args_for(700), model="glm")
    assert tel.policy == policy
    assert "512-767" in tel.snapshot()["rows_buckets"]


def test_numbered_unnumbered_and_huge_calls_all_count(make_tel):
    """Memoised decisions (numbered), plain decide() results (as the vLLM plugin hands over), rows past the table."""
    from dispatcher import Batch, CallClass, decide
    from dispatcher.validate import validate

    tel = make_tel(TelemetryConfig(models=("glm",)))
    a, b = tel.instrument(dispatcher()), tel.instrument(dispatcher())
    for _ in range(40):
        a(*args_for(8), model="glm")
        b(*args_for(8), model="glm")
        a(*args_for(20000), model="glm")
    shape = validate(*args_for(600))
    plain = decide(shape, what_if("gfx942"), Policy(), Batch(CallClass.UNKNOWN))
    assert plain.ordinal == -1 and a.decide(shape, Batch()).ordinal >= 0
    for _ in range(40):
        tok = tel.probe.start(plain, shape, Batch(), "glm", None, None)
        tel.probe.stop(tok, "aiter")
    s = scrape(tel.registry)
    assert total(s, "routescope_calls_total", rows_bucket="8-15") == 80
    assert total(s, "routescope_rows_total", rows_bucket="16384+") == 40 * 20000
    assert total(s, "routescope_calls_total", rows_bucket="512-1023", impl="aiter") == 40
    assert total(s, "routescope_telemetry_errors_total") == 0
