"""The demo's traffic generator: deterministic, realistic row counts, and the GLM bug only when asked."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from workloads.traffic import (DEFAULT_SCENARIOS, DSV4_FLASH, GLM_FLASH, CallSpec, Scenario, traffic,
                               warm_up_calls)


def take(n: int, **kw) -> list[CallSpec]:
    return list(itertools.islice(traffic(**kw), n))


def test_same_seed_same_stream_other_seed_other_stream():
    assert take(3000, seed=7) == take(3000, seed=7)
    assert take(3000, seed=7) != take(3000, seed=8)


def test_calls_are_numbered_in_order():
    assert [c.seq for c in take(500)] == list(range(500))


def test_both_models_and_their_real_layouts():
    calls = take(2000)
    assert {c.model for c in calls} == {"DeepSeek-V4.1-Flash", "GLM-5.3-Flash"}
    assert (DSV4_FLASH.nope_head_dim, DSV4_FLASH.rope_head_dim) == (448, 64)
    assert (GLM_FLASH.nope_head_dim, GLM_FLASH.rope_head_dim) == (512, 0)
    assert DSV4_FLASH.topk == GLM_FLASH.topk == 2048


def test_rows_span_decode_sizes_and_prefill_chunks_around_the_gates():
    calls = take(20000)
    decode = [c.rows for c in calls if c.entry == "decode"]
    prefill = [c.rows for c in calls if c.entry == "prefill"]
    assert min(decode) >= 1 and max(decode) == 16 and {2, 8} <= set(decode)
    assert max(prefill) == 16384  # the largest chunk budget
    buckets = Counter(r.bit_length() - 1 for r in prefill)  # floor(log2 rows)
    for lo in (8, 9, 10, 11, 12, 13, 14):  # 256-511 ... 16384: both sides of 512 and 1024
        assert buckets[lo] > 0, f"no prefill chunk in [{2**lo}, {2**(lo + 1)})"


def test_without_the_bug_decode_rows_never_reach_the_prefill_entry():
    calls = take(20000, glm_bug=False)
    assert all(c.kind == "prefill" for c in calls if c.entry == "prefill")
    assert all(c.kind == "pure_decode" and c.decode_rows == c.rows for c in calls if c.entry == "decode")


def test_glm_bug_sends_glm_decode_rows_through_prefill_and_only_glm():
    calls = take(20000, glm_bug=True)
    glm = [c for c in calls if c.model == GLM_FLASH.name]
    dsv4 = [c for c in calls if c.model == DSV4_FLASH.name]
    assert all(c.entry == "prefill" for c in glm)
    kinds = Counter(c.kind for c in glm)
    assert kinds["pure_decode"] > 0 and kinds["mixed"] > 0 and kinds["prefill"] > 0
    for c in glm:
        if c.kind != "prefill":  # decode rows first, one row each (no speculative tokens)
            assert c.query_lens[: c.decode_requests] == (1,) * c.decode_requests
            assert all(n > 1 for n in c.query_lens[c.decode_requests :])
    assert all(c.kind == "prefill" for c in dsv4 if c.entry == "prefill")  # DeepSeek decode has its own entry


def test_a_step_never_exceeds_its_token_budget():
    sc = (Scenario(4096, 4, 3, 6, 1000, jitter=0.3),)
    for c in take(3000, scenarios=sc, glm_bug=True):
        assert c.rows <= 1000


def test_concurrency_bounds_decode_rows():
    sc = (Scenario(300, 50, 5, 20, 512),)
    assert max(c.decode_rows for c in take(3000, scenarios=sc)) == 5


def test_scenarios_cycle():
    seen = {c.scenario for c in take(40000)}
    assert len(seen) >= 3
    assert seen <= set(range(len(DEFAULT_SCENARIOS)))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(models=()), "at least one model"),
        (dict(scenarios=()), "at least one"),
        (dict(scenarios=(Scenario(100, 1, 0, 1, 10),)), "counts must be >= 1"),
        (dict(scenarios=(Scenario(100, 1, 1, 1, 10, jitter=1.0),)), "jitter"),
        (dict(scenarios=(Scenario(100, 0, 1, 1, 10),)), "output_tokens"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kw, match):
    with pytest.raises(ValueError, match=match):
        next(traffic(**kw))


def _class(c: CallSpec, decode_rows: int) -> tuple:
    return (c.model, c.entry, c.kind, c.rows if c.rows <= decode_rows else (c.rows.bit_length()))


@pytest.mark.parametrize("glm_bug", [False, True])
def test_warm_up_covers_every_class_of_the_traffic_once(glm_bug):
    calls = take(3000, glm_bug=glm_bug)
    warm = warm_up_calls(calls, 16)
    classes = [_class(c, 16) for c in warm]
    assert len(classes) == len(set(classes))  # one call a class
    assert {_class(c, 16) for c in calls} <= set(classes)  # every class the traffic makes
    seen = [c for c in warm if c.seq >= 0]
    assert seen == sorted(seen, key=lambda c: c.seq)  # the traffic's own calls, first-seen order
    big = [c for c in warm if c.rows > 16]
    assert big and all(c in calls for c in big)  # above 16 rows: real calls, one per power-of-two bucket
    assert sum(c.rows for c in warm) < sum(c.rows for c in calls) / 20  # a small fraction of the traffic's work


@pytest.mark.parametrize("glm_bug", [False, True])
def test_warm_up_makes_every_decode_row_count_where_pure_decodes_go(glm_bug):
    warm = warm_up_calls(take(3000, glm_bug=glm_bug), 16)
    decode = Counter((c.model, c.entry) for c in warm if c.kind == "pure_decode")
    glm_entry = "prefill" if glm_bug else "decode"
    assert decode == {(DSV4_FLASH.name, "decode"): 16, (GLM_FLASH.name, glm_entry): 16}
    for model, entry in decode:
        rows = sorted(c.rows for c in warm if (c.model, c.entry, c.kind) == (model, entry, "pure_decode"))
        assert rows == list(range(1, 17))
    made = [c for c in warm if c.seq < 0]  # row counts the sample lacked: well-formed pure decodes
    assert made and all(c.decode_requests == len(c.query_lens) == c.rows and c.kind == "pure_decode" for c in made)


def test_warm_up_rows_classes_follow_decode_rows():
    calls = [CallSpec(i, "m", "prefill", (r,), 0, 0) for i, r in enumerate((3, 5, 9, 17, 31, 32, 1000, 1023, 1024))]
    assert [c.rows for c in warm_up_calls(calls, 4)] == [3, 5, 9, 17, 32, 1000, 1024]  # 5+ by 2^k buckets
    assert [c.rows for c in warm_up_calls(calls, 32)] == [3, 5, 9, 17, 31, 32, 1000, 1024]
    assert warm_up_calls([], 16) == []
    with pytest.raises(ValueError, match="decode_rows"):
        warm_up_calls(calls, 0)
