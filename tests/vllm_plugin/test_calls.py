"""Per call: the original runs once with its arguments, batch and kernel labels land in telemetry,
failures of ours fail open. vLLM here is TEST DOUBLES (tests/vllm_plugin/doubles.py)."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

from dispatcher import what_if
from routescope.vllm import plugin

from .conftest import Meta, prefill_args, samples, telemetry

ON = {"ROUTESCOPE_VLLM": "1"}


@pytest.fixture
def gfx942(vllm_doubles):
    """Doubles loaded, plugin observing as on gfx942 with AITER on; returns (ops, backend, forward_context)."""
    d = vllm_doubles()
    ops, backend, fc = d.ops(), d.backend(), d.fc()
    ops._ON_GFX942 = True
    assert plugin.install(env=ON, platform=what_if("gfx942")) == "observing"
    return ops, backend, fc


def _prefills(ops) -> list:
    return [e for e in ops.LOG if e[0] == "prefill"]


def test_original_called_once_with_the_same_arguments_and_output_intact(gfx942):
    ops, backend, fc = gfx942
    args, expected = prefill_args(12, sink=True)
    with fc.set_forward_context({"layer.0": Meta(0, 0, 2, 12, 12)}):
        result = backend.forward_prefill(*args)
    assert result is None
    calls = _prefills(ops)
    assert len(calls) == 1
    passed, output = calls[0][1], calls[0][2]
    assert all(a is b for a, b in zip(passed, args[:6])) and output is args[-1]
    torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)


def test_keyword_calls_are_read_and_passed_through(gfx942):
    """vLLM's callers also pass every argument by keyword (q=q, kv=kv, ...)."""
    ops, backend, fc = gfx942
    (q, kv, idx, tl, scale, hd, nope, rope, sink, out), expected = prefill_args(600)
    backend.forward_prefill(q=q, kv=kv, indices=idx, topk_length=tl, scale=scale, head_dim=hd,
                            nope_head_dim=nope, rope_head_dim=rope, attn_sink=sink, output=out)
    assert [e[0] for e in ops.LOG] == ["prefill", "pa"]
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    tel = telemetry()
    assert samples(tel, "routescope_calls_total", kernel="aiter.pa_prefill_sparse", impl="aiter",
                   call_class="unknown", rows_bucket="512-1023") == 1


def test_exceptions_of_the_original_pass_through_unchanged(gfx942):
    ops, backend, fc = gfx942
    args, _ = prefill_args(4)
    bad = args[:-1] + (torch.zeros(3, 3, 3),)  # wrong output shape: the double's math raises
    with pytest.raises(RuntimeError):
        backend.forward_prefill(*bad)
    assert len(_prefills(ops)) == 1
    assert samples(telemetry(), "routescope_kernel_errors_total", kernel="intree.ragged_prefill") == 1


@pytest.mark.parametrize(
    ("rows", "meta", "call_class", "decode_rows"),
    [
        # GLM-style: the whole batch, decode rows included, goes through the prefill entry
        (600, Meta(4, 4, num_prefills=1, num_prefill_tokens=596, num_actual_tokens=600), "mixed", 4),
        # a pure-decode batch reaching the prefill entry (the seed's 9x case)
        (16, Meta(16, 16, num_prefills=0, num_prefill_tokens=0, num_actual_tokens=16), "pure_decode", 16),
        # MTP verify: 2 decode requests of 3 rows, padded to 8 rows
        (8, Meta(2, 6, num_prefills=0, num_actual_tokens=6), "pure_decode", 6),
        # no decodes in the step
        (700, Meta(0, 0, num_prefills=2, num_prefill_tokens=700, num_actual_tokens=700), "prefill", 0),
        # the backend split the decode rows off (vLLM's DeepSeek-V4 ROCm backend): prefill rows only
        (596, Meta(4, 4, num_prefills=1, num_prefill_tokens=596, num_actual_tokens=600), "prefill", 0),
        # ... and sent them in chunks
        (100, Meta(4, 4, num_prefills=3, num_prefill_tokens=596, num_actual_tokens=600), "prefill", 0),
        # more rows than the prefills but fewer than the batch cannot be placed: unknown, not a guess
        (598, Meta(4, 4, num_prefills=1, num_prefill_tokens=596, num_actual_tokens=600), "unknown", 0),
    ],
)
def test_decode_rows_from_forward_context_metadata(gfx942, rows, meta, call_class, decode_rows):
    ops, backend, fc = gfx942
    args, _ = prefill_args(rows)
    with fc.set_forward_context({"model.layers.0.attn": meta, "model.layers.1.attn": meta}):
        backend.forward_prefill(*args)
    assert meta.touched == []  # no device tensor was read
    tel = telemetry()
    kernel = "aiter.pa_prefill_sparse" if rows >= 512 else "intree.ragged_prefill"
    assert samples(tel, "routescope_calls_total", call_class=call_class, kernel=kernel) == 1
    dip_calls = 1 if call_class in ("mixed", "pure_decode") else 0
    assert samples(tel, "routescope_decode_in_prefill_calls_total", call_class=call_class) == dip_calls
    assert samples(tel, "routescope_decode_in_prefill_rows_total", call_class=call_class) == decode_rows


def test_a_model_that_splits_decodes_off_shows_no_decode_in_prefill(gfx942):
    """DeepSeek-V4's ROCm model module shape: decode rows to the decode entry, prefill rows in chunks."""
    ops, backend, fc = gfx942
    model = importlib.import_module("vllm.models.deepseek_v4.amd.rocm")
    (q, kv, idx, _tl, scale, hd, nope, rope, _sink, out), expected = prefill_args(64)
    meta = Meta(4, 4, num_prefills=2, num_prefill_tokens=60, num_actual_tokens=64)
    with fc.set_forward_context({"layers.0.attn": meta, "swa": meta}):
        model.forward_split(q, kv, idx, scale, hd, nope, rope, out, chunk_rows=30)
    torch.testing.assert_close(out[4:], expected[4:], rtol=0, atol=0)
    assert [e[1] if e[0] != "prefill" else "prefill" for e in ops.LOG] == ["prefill", 30, "prefill", 30, "rocm_sparse_attn_decode"]
    tel = telemetry()
    assert samples(tel, "routescope_calls_total", call_class="prefill") == 2
    assert samples(tel, "routescope_decode_in_prefill_calls_total") == 0
    assert samples(tel, "routescope_decode_path_rows_total") == 4


def test_no_forward_context_reads_unknown(gfx942):
    ops, backend, fc = gfx942
    args, _ = prefill_args(8)
    backend.forward_prefill(*args)  # outside a forward pass (vLLM's profile run, a unit test)
    assert samples(telemetry(), "routescope_calls_total", call_class="unknown") == 1


def test_dual_batch_overlap_picks_the_micro_batch_of_this_call(gfx942):
    ops, backend, fc = gfx942
    args, _ = prefill_args(10)
    ubatches = [{"l0": Meta(3, 3, 1, 7, 10)}, {"l0": Meta(0, 0, 1, 12, 12)}]
    with fc.set_forward_context(ubatches):
        backend.forward_prefill(*args)
    assert samples(telemetry(), "routescope_decode_in_prefill_rows_total", call_class="mixed") == 3


def test_decode_path_calls_are_counted_once_per_outermost_call(gfx942):
    ops, backend, fc = gfx942
    backend.forward_decode(torch.zeros(5, 2, 12))  # GLM's split-K decode: the bf16 entry
    importlib.import_module("vllm.models.deepseek_v41.amd.rocm").forward_decode(torch.zeros(3, 2, 12))
    ops.rocm_sparse_attn_decode_v1(torch.zeros(7, 2, 12), None)  # delegates to rocm_sparse_attn_decode
    assert [e for e in ops.LOG if e[0] == "decode"] == [
        ("decode", "rocm_sparse_attn_decode_bf16", 5), ("decode", "rocm_sparse_attn_decode", 3),
        ("decode", "rocm_sparse_attn_decode_v1", 7), ("decode", "rocm_sparse_attn_decode", 7)]
    tel = telemetry()
    assert samples(tel, "routescope_decode_path_calls_total", model="double/served-model") == 3
    assert samples(tel, "routescope_decode_path_rows_total") == 15


def test_decode_in_prefill_reads_as_a_share_of_decode_calls(gfx942):
    ops, backend, fc = gfx942
    for _ in range(3):
        backend.forward_decode(torch.zeros(4, 2, 12))
    args, _ = prefill_args(4)
    with fc.set_forward_context({"l0": Meta(4, 4, 0, 0, 4)}):
        backend.forward_prefill(*args)
    tel = telemetry()
    dip = samples(tel, "routescope_decode_in_prefill_calls_total")
    assert dip / (dip + samples(tel, "routescope_decode_path_calls_total")) == pytest.approx(0.25)


def test_model_label_is_the_served_model_name(gfx942):
    ops, backend, fc = gfx942
    args, _ = prefill_args(4)
    backend.forward_prefill(*args)
    assert samples(telemetry(), "routescope_calls_total", model="double/served-model") == 1


def test_model_override(vllm_doubles):
    d = vllm_doubles()
    backend = d.backend()
    plugin.install(env={**ON, "ROUTESCOPE_VLLM_MODEL": "glm-5.3-flash"}, platform=what_if("gfx942"))
    args, _ = prefill_args(4)
    backend.forward_prefill(*args)
    assert samples(telemetry(), "routescope_calls_total", model="glm-5.3-flash") == 1


# ---- the kernel actually launched -------------------------------------------------------------
def test_launched_aiter_kernel_matches_the_prediction(gfx942):
    ops, backend, fc = gfx942
    args, expected = prefill_args(512)
    backend.forward_prefill(*args)
    assert [e[0] for e in ops.LOG] == ["prefill", "pa"]
    torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    tel = telemetry()
    assert samples(tel, "routescope_calls_total", kernel="aiter.pa_prefill_sparse", impl="aiter") == 1
    assert plugin.current().observer.mismatches == {}


def test_missing_aiter_symbol_is_seen_through_the_getter_and_learned(gfx942, caplog):
    ops, backend, fc = gfx942
    ops.HAVE_PA = False
    ops._get_aiter_pa_prefill_sparse.cache_clear()  # the wrapper forwards functools.cache's API
    with caplog.at_level(logging.WARNING, logger="vllm.routescope"):
        for seed in range(3):
            args, expected = prefill_args(600, seed=seed)
            backend.forward_prefill(*args)
            torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    assert [e[0] for e in ops.LOG].count("intree") == 3
    obs = plugin.current().observer
    assert obs.mismatches == {("aiter.pa_prefill_sparse", "intree.ragged_prefill"): 1}
    assert sum("predicted aiter.pa_prefill_sparse" in r.getMessage() for r in caplog.records) == 1
    tel = telemetry()
    # the first call was recorded as predicted (its probe had started); the next two as launched
    assert samples(tel, "routescope_calls_total", kernel="intree.ragged_prefill") == 2
    assert samples(tel, "routescope_decisions_total", kernel="intree.ragged_prefill", reason="gfx942_symbol") == 2


def test_vllm_without_the_gfx942_branch_is_labelled_in_tree(vllm_doubles):
    """Upstream vLLM without the seed PR: no _get_aiter_pa_prefill_sparse, so no gfx942 AITER launch."""
    d = vllm_doubles(getters="opus_only")
    ops, backend = d.ops(), d.backend()
    ops._ON_GFX942 = True
    plugin.install(env=ON, platform=what_if("gfx942"))
    args, _ = prefill_args(600)
    backend.forward_prefill(*args)
    assert [e[0] for e in ops.LOG] == ["prefill", "intree"]
    obs = plugin.current().observer
    assert obs.mismatches == {}
    assert samples(telemetry(), "routescope_decisions_total", kernel="intree.ragged_prefill",
                   reason="arch_not_gated") == 1


def test_vllms_own_threshold_is_the_policy(vllm_doubles):
    d = vllm_doubles(gfx942_min=1024)
    ops, backend = d.ops(), d.backend()
    ops._ON_GFX942 = True
    plugin.install(env={**ON, "ROUTESCOPE_GFX942_MIN_ROWS": "256"}, platform=what_if("gfx942"))
    obs = plugin.current().observer
    assert obs.policy.gfx942_min_rows == 1024
    args, _ = prefill_args(600)
    backend.forward_prefill(*args)
    assert obs.mismatches == {}
    assert samples(telemetry(), "routescope_decisions_total", reason="gfx942_min_rows") == 1


def test_gfx950_opus_launch_and_decline(vllm_doubles):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    ops._ON_GFX950 = True
    plugin.install(env=ON, platform=what_if("gfx950"))
    args, expected = prefill_args(1024, full_lanes=True, sink=True)
    backend.forward_prefill(*args)
    torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    tel = telemetry()
    assert samples(tel, "routescope_calls_total", kernel="aiter.pa_sparse_prefill_opus", impl="aiter") == 1
    # an AITER build without OPUS: vLLM falls through to in-tree; telemetry moves the call there
    ops.HAVE_OPUS = False
    ops._get_aiter_sparse_prefill_opus.cache_clear()
    for _ in range(2):
        args, _ = prefill_args(1024, full_lanes=True, sink=True)
        backend.forward_prefill(*args)
    assert samples(tel, "routescope_calls_total", kernel="intree.ragged_prefill", impl="triton") == 2
    assert samples(tel, "routescope_decisions_total", reason="gfx950_symbol") == 2


# ---- fail open ---------------------------------------------------------------------------------
class _RaisingProbe:
    def __init__(self, where: str) -> None:
        self.where = where

    def start(self, *a):
        if self.where == "start":
            raise RuntimeError("probe.start exploded")
        return "token"

    def stop(self, token, impl):
        if self.where == "stop":
            raise RuntimeError("probe.stop exploded")

    def error(self, token, exc):
        raise RuntimeError("probe.error exploded")


class _FakeTelemetry:
    def __init__(self, where: str) -> None:
        self.probe = _RaisingProbe(where)
        self.errors: list[str] = []

    def record_decode_path(self, rows, model):
        raise RuntimeError("record_decode_path exploded")

    def count_error(self, stage):
        self.errors.append(stage)


@pytest.mark.parametrize("where", ["start", "stop"])
def test_a_raising_probe_fails_open(vllm_doubles, where):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    fake = _FakeTelemetry(where)
    plugin.install(env=ON, platform=what_if("gfx942"), telemetry_factory=lambda **kw: fake)
    for _ in range(2):
        args, expected = prefill_args(8)
        backend.forward_prefill(*args)
        torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    backend.forward_decode(torch.zeros(2, 2, 12))
    assert len(_prefills(ops)) == 2
    obs = plugin.current().observer
    assert obs.errors["probe"] == 2 and obs.errors["decode"] == 1
    assert fake.errors == ["probe"] * 3  # counted in routescope_telemetry_errors_total{stage="probe"}


def test_a_raising_probe_error_does_not_mask_vllms_exception(vllm_doubles):
    d = vllm_doubles()
    backend = d.backend()
    plugin.install(env=ON, platform=what_if("gfx942"), telemetry_factory=lambda **kw: _FakeTelemetry("none"))
    args, _ = prefill_args(4)
    with pytest.raises(RuntimeError, match="shape|size|expand|match"):
        backend.forward_prefill(*args[:-1], torch.zeros(3, 3, 3))
    assert plugin.current().observer.errors["probe"] == 1


def test_our_own_bug_fails_open_and_calls_the_original_once(gfx942, monkeypatch):
    ops, backend, fc = gfx942
    obs = plugin.current().observer

    def broken(*a, **kw):
        raise ZeroDivisionError("a bug in the observer")

    monkeypatch.setattr(obs, "decide", broken)
    args, expected = prefill_args(8)
    backend.forward_prefill(*args)
    assert len(_prefills(ops)) == 1 and _prefills(ops)[0][2] is args[-1]
    torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    assert obs.errors["before"] == 1


def test_a_broken_metadata_object_reads_as_unknown(gfx942):
    ops, backend, fc = gfx942

    class Weird:
        @property
        def num_decodes(self):
            raise KeyError("odd metadata")

    args, _ = prefill_args(8)
    with fc.set_forward_context({"l0": Weird()}):
        backend.forward_prefill(*args)
    assert plugin.current().observer.errors["metadata"] == 1
    assert samples(telemetry(), "routescope_calls_total", call_class="unknown") == 1


def test_telemetry_that_cannot_be_built_leaves_vllm_unobserved(vllm_doubles):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()

    def factory(**kw):
        raise OSError("no space for the multiprocess directory")

    plugin.install(env=ON, platform=what_if("gfx942"), telemetry_factory=factory)
    for _ in range(3):
        args, expected = prefill_args(8)
        backend.forward_prefill(*args)
        torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    assert plugin.current().observer.errors["setup"] == 1  # tried once per process, not per call


def test_inside_a_torch_compile_trace_the_wrapper_stays_out(vllm_doubles, monkeypatch):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    plugin.install(env=ON, platform=what_if("gfx942"))
    args, expected = prefill_args(8)
    backend.forward_prefill(*args)
    backend.forward_decode(torch.zeros(2, 2, 12))
    torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    obs = plugin.current().observer
    assert len(_prefills(ops)) == 1 and obs.calls == 0 and obs.decode_calls == 0


# ---- what vLLM attempted, its own gate, the observing line, the logs -----------------------------
class _ImplProbe:
    """A probe whose ``error`` takes the attempted impl, as telemetry's does: records what it was given."""

    def __init__(self) -> None:
        self.errors: list[tuple] = []

    def start(self, *a):
        return "token"

    def stop(self, token, impl):
        pass

    def error(self, token, exc, impl=None):
        self.errors.append((type(exc).__name__, impl))


@pytest.fixture
def impl_probe(vllm_doubles):
    """Doubles on a what-if gfx942, telemetry whose probe records what ``error`` is given: (ops, backend, probe)."""
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    ops._ON_GFX942 = True
    fake = _FakeTelemetry("none")
    fake.probe = _ImplProbe()
    plugin.install(env=ON, platform=what_if("gfx942"), telemetry_factory=lambda **kw: fake)
    return ops, backend, fake.probe


@pytest.mark.parametrize(("rows", "expected"), [(4, "triton"), (600, "aiter")])
def test_a_call_vllm_raised_on_reports_the_impl_it_attempted(impl_probe, rows, expected):
    ops, backend, probe = impl_probe

    def broken(*a, **kw):
        raise RuntimeError("the kernel failed")

    ops.pa_prefill_sparse = ops._attend = broken  # the AITER kernel (>= 512 rows) and the in-tree math
    ops._get_aiter_pa_prefill_sparse.cache_clear()
    args, _ = prefill_args(rows)
    with pytest.raises(RuntimeError, match="the kernel failed"):
        backend.forward_prefill(*args)
    assert probe.errors == [("RuntimeError", expected)]


def test_a_getter_that_raises_counts_as_an_aiter_attempt(impl_probe):
    """The seed PR imports the symbol after the gate: a missing one raises from the getter."""
    ops, backend, probe = impl_probe
    ops._get_aiter_pa_prefill_sparse.cache_clear()
    del ops.pa_prefill_sparse  # the double's getter now raises NameError
    args, _ = prefill_args(600)
    with pytest.raises(NameError):
        backend.forward_prefill(*args)
    assert probe.errors == [("NameError", "aiter")]


def test_vllms_own_gate_declining_opus_is_labelled_declined_from_the_first_call(vllm_doubles):
    """vLLM declines OPUS without calling its getter (here: its own arch flag is off): no OPUS call is
    ever handed to telemetry, and the reason is a decline, not a missing symbol."""
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    ops._ON_GFX950 = False
    plugin.install(env=ON, platform=what_if("gfx950"))
    for seed in range(2):
        args, expected = prefill_args(1024, full_lanes=True, sink=True, seed=seed)
        backend.forward_prefill(*args)
        torch.testing.assert_close(args[-1], expected, rtol=0, atol=0)
    assert [e[0] for e in ops.LOG].count("intree") == 2
    tel = telemetry()
    assert samples(tel, "routescope_decisions_total", kernel="intree.ragged_prefill", reason="gfx950_declined") == 2
    assert samples(tel, "routescope_decisions_total", reason="gfx950_symbol") == 0
    assert samples(tel, "routescope_calls_total", kernel="aiter.pa_sparse_prefill_opus") == 0
    assert plugin.current().observer.mismatches == {}
