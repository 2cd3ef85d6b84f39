"""Batch counts from attention metadata, the model name, the rank: pure functions, no vLLM needed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dispatcher.types import CallClass
from routescope.vllm.context import (
    Counts, ForwardBatch, ModelName, batch_from_counts, counts_of, find_counts, resolve_rank, served_model_name,
)

from .conftest import Meta


@pytest.mark.parametrize(
    ("rows", "counts", "expected"),
    [
        (600, Counts(4, 4, 1, 596, 600), (CallClass.MIXED, 4, 4, 5)),
        (640, Counts(4, 4, 1, 596, 600), (CallClass.MIXED, 4, 4, 5)),  # padded
        (596, Counts(4, 4, 1, 596, 600), (CallClass.PREFILL, 0, 0, 1)),  # decodes split off
        (100, Counts(4, 4, 1, 596, 600), (CallClass.PREFILL, 0, 0, 1)),  # a chunk of the prefill rows
        (598, Counts(4, 4, 1, 596, 600), (CallClass.UNKNOWN, 0, 0, 0)),  # more than the prefills, less than all
        (16, Counts(16, 16, 0, 0, 16), (CallClass.PURE_DECODE, 16, 16, 16)),
        (32, Counts(16, 16, 0), (CallClass.PURE_DECODE, 16, 16, 16)),  # padded to a graph size
        (12, Counts(4, 12, None, None, None, 3), (CallClass.PURE_DECODE, 12, 4, 4)),  # MTP: max_query_len 3
        (20, Counts(4, 12, None, None, None, 8), (CallClass.MIXED, 12, 4, 4)),  # a longer query: a prefill
        (700, Counts(0, 0, 2, 700, 700), (CallClass.PREFILL, 0, 0, 2)),
        (50, Counts(0, 0), (CallClass.PREFILL, 0, 0, 0)),
        (30, Counts(4, 4, 1), (CallClass.MIXED, 4, 4, 5)),  # no token totals: the call carries the batch
        (3, Counts(4, 4, 1), (CallClass.UNKNOWN, 0, 0, 0)),
        (8, Counts(4, 4), (CallClass.UNKNOWN, 0, 0, 0)),  # nothing says whether a prefill exists
        (8, Counts(5, 4, 0), (CallClass.UNKNOWN, 0, 0, 0)),  # inconsistent
    ],
)
def test_batch_from_counts(rows, counts, expected):
    b = batch_from_counts(rows, counts)
    assert (b.call_class, b.decode_rows, b.decode_requests, b.requests) == expected


def test_only_host_integers_are_read():
    assert counts_of(SimpleNamespace(num_decodes=np.int64(2), num_decode_tokens=2)) == Counts(2, 2)
    tensor_meta = SimpleNamespace(num_decodes=torch.tensor(2), num_decode_tokens=torch.tensor(2))
    assert counts_of(tensor_meta) is None  # a tensor is never converted (that could sync the device)
    assert counts_of(SimpleNamespace(num_decodes=True, num_decode_tokens=1)) is None
    meta = Meta(1, 1, 0)
    assert counts_of(meta) == Counts(1, 1, 0)
    assert meta.touched == []


def test_find_counts_skips_metadata_without_counts_and_handles_micro_batches():
    plain = SimpleNamespace(slot_mapping=torch.zeros(3))
    assert find_counts({"indexer": plain, "attn": Meta(1, 1, 1, 9, 10)}, 10) == Counts(1, 1, 1, 9, 10)
    assert find_counts(None, 4) is None
    assert find_counts({}, 4) is None
    two = [{"a": Meta(1, 1, 1, 9, 10)}, {"a": Meta(2, 2, 1, 6, 8)}]
    assert find_counts(two, 8).num_decodes == 2
    assert find_counts(two, 5) is None  # neither micro-batch matches: not a guess
    assert find_counts(Meta(3, 3, 0), 3) == Counts(3, 3, 0)


def test_forward_batch_outside_a_forward_pass():
    def unset():
        raise AssertionError("Forward context is not set.")

    assert ForwardBatch(unset, None)(8).call_class is CallClass.UNKNOWN
    assert ForwardBatch(unset, lambda: False)(8).call_class is CallClass.UNKNOWN
    assert ForwardBatch(None, None)(8).call_class is CallClass.UNKNOWN
    ctx = SimpleNamespace(attn_metadata={"l": Meta(2, 2, 0)})
    assert ForwardBatch(lambda: ctx, lambda: True)(2).call_class is CallClass.PURE_DECODE


def test_served_model_name_follows_vllms_resolution():
    cfg = lambda name, model="path/to/model": SimpleNamespace(  # noqa: E731
        model_config=SimpleNamespace(served_model_name=name, model=model))
    assert served_model_name(cfg("glm")) == "glm"
    assert served_model_name(cfg(["a", "b"])) == "a"
    assert served_model_name(cfg(None)) == "path/to/model"
    assert served_model_name(SimpleNamespace(model_config=None)) is None
    assert served_model_name(None) is None


def test_model_name_is_retried_then_kept():
    answers = iter([None, SimpleNamespace(model_config=SimpleNamespace(served_model_name="m", model="x"))])
    calls = []

    def getter():
        calls.append(1)
        return next(answers)

    m = ModelName(getter)
    assert m.get() is None and m.get() == "m" and m.get() == "m"
    assert len(calls) == 2


def test_model_name_gives_up_on_a_noisy_getter():
    calls = []

    def getter():
        calls.append(1)
        raise AssertionError("Current vLLM config is not set.")

    m = ModelName(getter, max_attempts=3)
    for _ in range(10):
        assert m.get() is None
    assert len(calls) == 3
    assert ModelName(getter, override="fixed").get() == "fixed"


def test_rank_resolution_order():
    assert resolve_rank([lambda: 3], {}) == "3"
    assert resolve_rank([lambda: (_ for _ in ()).throw(RuntimeError("not initialised"))], {"RANK": "5"}) == "5"
    assert resolve_rank([], {"LOCAL_RANK": "2"}) == "2"
    assert resolve_rank([], {}) == "0"


def test_positions_count_steps_by_metadata_container_and_calls_within_them():
    """An experiment's position: (step, call in step). A step is one forward context's metadata container (every
    layer of a step shares it); calls without a context count on in the last step."""
    holder = SimpleNamespace(ctx=None)

    def get():
        assert holder.ctx is not None, "Forward context is not set."
        return holder.ctx

    reader = ForwardBatch(get, lambda: holder.ctx is not None)
    seen = []
    reader(4)
    seen.append(reader.position)  # before any step
    for step in range(3):
        holder.ctx = SimpleNamespace(attn_metadata={"layer.0": Meta(0, 0, 1, 8, 8)})
        for rows in (8, 8, 5):  # three calls in the step, one of them of other rows
            reader(rows)
            seen.append(reader.position)
    holder.ctx = None
    reader(4)
    seen.append(reader.position)
    assert seen == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2), (3, 3)]
