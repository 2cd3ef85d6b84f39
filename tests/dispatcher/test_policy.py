"""The gate matrix: every condition the seed PR and vLLM's ``rocm_sparse_attn_prefill`` name, both sides of each threshold."""

from __future__ import annotations

import random

import pytest

from dispatcher import Batch, CallClass, CallShape, GuardMode, Kernel, Policy, decide, what_if
from dispatcher.platform import Platform
from dispatcher.policy import DecisionCache, PolicySettings

AITER = Kernel.AITER_PA_PREFILL_SPARSE
OPUS = Kernel.AITER_OPUS
INTREE = Kernel.INTREE_RAGGED_PREFILL
DECODE = Kernel.INTREE_SPARSE_DECODE


def shape(rows: int, **kw) -> CallShape:
    return CallShape(rows=rows, **kw)


SINK = dict(has_sink=True, sink_ok=True)

# (case id, arch, aiter on, shape, policy kwargs, expected kernel, expected reason_code)
MATRIX = [
    ("gfx942 512 rows bf16", "gfx942", True, shape(512), {}, AITER, "gfx942_pa_prefill_sparse"),
    ("gfx942 511 rows bf16", "gfx942", True, shape(511), {}, INTREE, "gfx942_min_rows"),
    ("gfx942 512 rows fp16", "gfx942", True, shape(512, q_dtype="float16", kv_dtype="float16"), {}, AITER, "gfx942_pa_prefill_sparse"),
    ("gfx942 seed 2-row decode", "gfx942", True, shape(2), {}, INTREE, "gfx942_min_rows"),
    ("gfx942 seed 16-row decode", "gfx942", True, shape(16), {}, INTREE, "gfx942_min_rows"),
    ("gfx942 16K rows", "gfx942", True, shape(16384), {}, AITER, "gfx942_pa_prefill_sparse"),
    ("gfx942 fp8 kv", "gfx942", True, shape(4096, kv_dtype="float8_e4m3fnuz"), {}, INTREE, "gfx942_kv_dtype"),
    ("gfx942 fp8 kv e4m3fn", "gfx942", True, shape(4096, kv_dtype="float8_e4m3fn"), {}, INTREE, "gfx942_kv_dtype"),
    ("gfx942 fp32 q", "gfx942", True, shape(4096, q_dtype="float32", kv_dtype="float32"), {}, INTREE, "gfx942_q_dtype"),
    ("gfx942 AITER off", "gfx942", False, shape(4096), {}, INTREE, "gfx942_aiter_enabled"),
    ("gfx942 gate 1024 at 1023", "gfx942", True, shape(1023), {"gfx942_min_rows": 1024}, INTREE, "gfx942_min_rows"),
    ("gfx942 gate 1024 at 1024", "gfx942", True, shape(1024), {"gfx942_min_rows": 1024}, AITER, "gfx942_pa_prefill_sparse"),
    ("gfx942 no row gate at 1", "gfx942", True, shape(1), {"gfx942_min_rows": 0}, AITER, "gfx942_pa_prefill_sparse"),
    ("gfx942 sink does not matter", "gfx942", True, shape(512, **SINK), {}, AITER, "gfx942_pa_prefill_sparse"),
    ("gfx950 1024 with sink", "gfx950", True, shape(1024, **SINK), {}, OPUS, "gfx950_opus"),
    ("gfx950 1023 with sink", "gfx950", True, shape(1023, **SINK), {}, INTREE, "gfx950_min_rows"),
    ("gfx950 without sink", "gfx950", True, shape(4096), {}, INTREE, "gfx950_sink"),
    ("gfx950 bf16 sink", "gfx950", True, shape(4096, has_sink=True, sink_ok=False), {}, INTREE, "gfx950_sink"),
    ("gfx950 AITER off", "gfx950", False, shape(4096, **SINK), {}, INTREE, "gfx950_aiter_mla_enabled"),
    ("gfx950 fp8 kv", "gfx950", True, shape(4096, kv_dtype="float8_e4m3fn", **SINK), {}, INTREE, "gfx950_kv_dtype"),
    ("gfx950 fp32 output", "gfx950", True, shape(4096, out_dtype="float32", **SINK), {}, INTREE, "gfx950_out_dtype"),
    ("gfx950 fp32 q", "gfx950", True, shape(4096, q_dtype="float32", kv_dtype="float32", **SINK), {}, INTREE, "gfx950_q_dtype"),
    ("gfx950 output strides differ", "gfx950", True, shape(4096, out_strides_match_q=False, **SINK), {}, INTREE, "gfx950_out_strides"),
    ("gfx950 strided last dim", "gfx950", True, shape(4096, unit_last_stride=False, **SINK), {}, INTREE, "gfx950_unit_last_stride"),
    ("gfx950 gate 2048 at 2047", "gfx950", True, shape(2047, **SINK), {"gfx950_min_rows": 2048}, INTREE, "gfx950_min_rows"),
    ("gfx950 512 rows never takes gfx942 path", "gfx950", True, shape(512, **SINK), {}, INTREE, "gfx950_min_rows"),
    ("gfx90a", "gfx90a", True, shape(4096, **SINK), {}, INTREE, "arch_not_gated"),
    ("sm90", "sm90", True, shape(4096, **SINK), {}, INTREE, "arch_not_gated"),
    ("cpu", "cpu", True, shape(4096), {}, INTREE, "arch_not_gated"),
]


@pytest.mark.parametrize("case", MATRIX, ids=[c[0] for c in MATRIX])
def test_gate_matrix(case):
    _, arch, aiter, call, pol, kernel, code = case
    decision = decide(call, what_if(arch, aiter=aiter), Policy(**pol))
    assert decision.kernel is kernel
    assert decision.reason_code == code
    assert decision.gates, "every decision carries its gate trace"
    if kernel is INTREE and code != "arch_not_gated":
        failed = [g for g in decision.gates if not g.passed and not g.name.endswith(".arch")]
        assert failed[0].name.replace(".", "_") == code
        assert failed[0].name in decision.reason


def test_gfx950_falls_through_when_symbol_missing():
    p = what_if("gfx950")
    p = Platform(**{**{f: getattr(p, f) for f in p.__dataclass_fields__}, "opus_importable": False})
    d = decide(shape(4096, **SINK), p, Policy())
    assert d.kernel is INTREE and d.reason_code == "gfx950_symbol"


def test_gfx942_trace_lists_each_gate_in_order():
    d = decide(shape(511), what_if("gfx942"), Policy())
    names = [g.name for g in d.gates]
    assert names == [
        "gfx950.arch", "gfx942.arch", "gfx942.aiter_enabled", "gfx942.q_dtype",
        "gfx942.kv_dtype", "gfx942.min_rows", "intree.fallback",
    ]
    assert [g.passed for g in d.gates] == [False, True, True, True, True, False, True]
    assert "rows < 512" in d.gates[5].detail


@pytest.mark.parametrize(
    "guard,cls,kernel,refused,rerouted",
    [
        (GuardMode.OBSERVE, CallClass.PURE_DECODE, AITER, False, None),
        (GuardMode.REROUTE, CallClass.PURE_DECODE, DECODE, False, AITER),
        (GuardMode.RAISE, CallClass.PURE_DECODE, AITER, True, None),
        (GuardMode.REROUTE, CallClass.MIXED, AITER, False, None),
        (GuardMode.RAISE, CallClass.MIXED, AITER, False, None),
        (GuardMode.REROUTE, CallClass.PREFILL, AITER, False, None),
        (GuardMode.RAISE, CallClass.UNKNOWN, AITER, False, None),
    ],
)
def test_guard_modes(guard, cls, kernel, refused, rerouted):
    d = decide(shape(4096), what_if("gfx942"), Policy(guard=guard), Batch(cls, 1))
    assert d.kernel is kernel
    assert d.refused is refused
    assert d.rerouted_from is rerouted
    assert d.call_class is cls


def test_guard_covers_intree_prefill_too():
    # The in-tree ragged prefill has no split-K either: a pure decode there is also misrouted.
    d = decide(shape(2), what_if("gfx942"), Policy(guard=GuardMode.REROUTE), Batch(CallClass.PURE_DECODE, 2))
    assert d.kernel is DECODE and d.rerouted_from is INTREE and d.branch == "guard"
    observed = decide(shape(2), what_if("gfx942"), Policy(), Batch(CallClass.PURE_DECODE, 2))
    assert observed.decode_in_prefill and observed.kernel is INTREE


def test_decode_in_prefill_flag():
    p, pol = what_if("gfx942"), Policy()
    assert decide(shape(600), p, pol, Batch(CallClass.MIXED, 4)).decode_in_prefill
    assert not decide(shape(600), p, pol, Batch(CallClass.PREFILL)).decode_in_prefill
    assert not decide(shape(600), p, pol).decode_in_prefill  # unknown: never a silent guess


def test_decide_is_pure():
    p, pol = what_if("gfx942"), Policy()
    assert decide(shape(700), p, pol) == decide(shape(700), p, pol)


def test_cache_agrees_with_decide_on_random_calls():
    rng = random.Random(7)
    dtypes = ["bfloat16", "float16", "float32", "float8_e4m3fnuz"]
    for arch in ("gfx942", "gfx950", "sm90"):
        for pol in (Policy(), Policy(gfx942_min_rows=768, gfx950_min_rows=2048, guard=GuardMode.REROUTE)):
            plat = what_if(arch)
            cache = DecisionCache(plat, pol)
            for _ in range(400):
                q = rng.choice(dtypes)
                call = shape(
                    rng.choice([0, 1, 2, 16, 511, 512, 767, 768, 1023, 1024, 2047, 2048, 16384, rng.randint(1, 40000)]),
                    q_dtype=q, kv_dtype=rng.choice([q, *dtypes]), has_sink=(s := rng.random() < 0.5), sink_ok=s and rng.random() < 0.8,
                )
                cls = rng.choice(list(CallClass))
                assert cache.decide(call, cls) == decide(call, plat, pol, Batch(cls)), call


def test_policy_validation():
    with pytest.raises(ValueError, match="gfx942_min_rows"):
        Policy(gfx942_min_rows=-1)
    with pytest.raises(ValueError, match="spec_tokens"):
        Policy(spec_tokens=-2)
    with pytest.raises(ValueError):
        Policy(guard="sometimes")
    assert Policy(gfx942_min_rows=768).thresholds == (768, 1024)
    assert Policy(gfx942_min_rows=0).thresholds == (1024,)


def test_policy_from_env(monkeypatch):
    monkeypatch.setenv("ROUTESCOPE_GFX942_MIN_ROWS", "1024")
    monkeypatch.setenv("ROUTESCOPE_GFX950_MIN_ROWS", "2048")
    monkeypatch.setenv("ROUTESCOPE_GUARD", "reroute")
    pol = PolicySettings().policy()
    assert (pol.gfx942_min_rows, pol.gfx950_min_rows, pol.guard) == (1024, 2048, GuardMode.REROUTE)
    assert PolicySettings().policy(gfx942_min_rows=300).gfx942_min_rows == 300
    monkeypatch.setenv("ROUTESCOPE_GFX942_MIN_ROWS", "lots")
    with pytest.raises(ValueError):
        PolicySettings()
