"""Call classification from host-side facts only; no metadata means unknown, never a guess."""

from __future__ import annotations

import pytest
import torch

from dispatcher import CallClass, classify
from dispatcher.classify import classify_counts, classify_query_lens


@pytest.mark.parametrize(
    "lens,spec,cls,decode_rows,decode_reqs",
    [
        ([1, 1, 1, 1], 0, CallClass.PURE_DECODE, 4, 4),
        ([8000], 0, CallClass.PREFILL, 0, 0),
        ([1, 1, 8000], 0, CallClass.MIXED, 2, 2),
        ([2, 2], 0, CallClass.PREFILL, 0, 0),  # 2-row requests are prefill chunks without spec decode
        ([2, 2], 1, CallClass.PURE_DECODE, 4, 2),  # ... and decodes with one speculative token
        ([6, 6, 1], 5, CallClass.PURE_DECODE, 13, 3),  # MTP verify up to 6 rows
        ([7, 1], 5, CallClass.MIXED, 1, 1),
    ],
)
def test_query_lens(lens, spec, cls, decode_rows, decode_reqs):
    b = classify_query_lens(lens, spec_tokens=spec, rows=sum(lens))
    assert (b.call_class, b.decode_rows, b.decode_requests, b.requests) == (cls, decode_rows, decode_reqs, len(lens))


def test_query_lens_from_cpu_tensor():
    b = classify(rows=3, query_lens=torch.tensor([1, 2]), spec_tokens=0)
    assert b.call_class is CallClass.MIXED and b.decode_rows == 1


def test_refuses_device_tensor_without_reading_it():
    class FakeDeviceTensor:  # stands in for a CUDA tensor: only .device is looked at
        device = "cuda:0"

        def tolist(self):
            raise AssertionError("must not read a device tensor")

    with pytest.raises(ValueError, match="sync"):
        classify(rows=1, query_lens=FakeDeviceTensor())


@pytest.mark.parametrize(
    "lens,rows,msg",
    [([], 0, "empty"), ([0, 1], 1, ">= 1"), ([1, 2], 4, "sum to 3"), (["1"], 1, "integers"), ("1,2", 3, "sequence")],
)
def test_query_lens_errors(lens, rows, msg):
    with pytest.raises(ValueError, match=msg):
        classify(rows=rows, query_lens=lens)


@pytest.mark.parametrize(
    "rows,nd,ndt,npf,cls",
    [
        (16, 16, 16, 0, CallClass.PURE_DECODE),
        (16, 8, 16, None, CallClass.PURE_DECODE),  # decode tokens fill the call (MTP 2 per request)
        (8016, 16, 16, 1, CallClass.MIXED),
        (8000, 0, 0, 1, CallClass.PREFILL),
    ],
)
def test_vllm_counts(rows, nd, ndt, npf, cls):
    b = classify(rows=rows, num_decodes=nd, num_decode_tokens=ndt, num_prefills=npf)
    assert b.call_class is cls and b.decode_rows == ndt


def test_counts_errors():
    with pytest.raises(ValueError, match="exceeds"):
        classify_counts(rows=4, num_decodes=1, num_decode_tokens=5)
    with pytest.raises(ValueError, match="come together"):
        classify(rows=4, num_decodes=1)
    with pytest.raises(ValueError, match="num_decodes"):
        classify_counts(rows=4, num_decodes=3, num_decode_tokens=2)


def test_no_metadata_is_unknown():
    b = classify(rows=4)
    assert b.call_class is CallClass.UNKNOWN and not b.known and b.decode_rows == 0


def test_counts_cache_answers_as_classify_does_and_keeps_only_answers(monkeypatch):
    import importlib

    classify_mod = importlib.import_module("dispatcher.classify")  # the package's `classify` is the function

    cache = classify_mod.CountsCache()
    kw = dict(query_lens=None, spec_tokens=0)
    for rows, nd, ndt, npf in ((2, 2, 2, 0), (16, 4, 4, None), (600, 4, 4, 1), (600, 0, 0, 1)):
        want = classify(rows=rows, num_decodes=nd, num_decode_tokens=ndt, num_prefills=npf)
        assert cache(rows=rows, num_decodes=nd, num_decode_tokens=ndt, num_prefills=npf, **kw) == want
        assert cache(rows=rows, num_decodes=nd, num_decode_tokens=ndt, num_prefills=npf, **kw) is \
            cache(rows=rows, num_decodes=nd, num_decode_tokens=ndt, num_prefills=npf, **kw)
    assert len(cache) == 4
    for _ in range(2):  # counts the rows contradict raise every time: never kept
        with pytest.raises(ValueError, match="exceeds"):
            cache(rows=2, num_decodes=3, num_decode_tokens=3, num_prefills=0, **kw)
    with pytest.raises(ValueError, match="non-negative integer"):  # not a plain int: checked, as before
        cache(rows=2, num_decodes=2.0, num_decode_tokens=2, num_prefills=0, **kw)
    lens = cache(rows=3, num_decodes=None, num_decode_tokens=None, num_prefills=None, query_lens=[1, 2],
                 spec_tokens=1)
    assert lens.call_class is CallClass.PURE_DECODE and len(cache) == 4, "query_lens: classified, not kept"
    monkeypatch.setattr(classify_mod, "MAX_COUNTS", 4)
    assert cache(rows=5, num_decodes=1, num_decode_tokens=1, num_prefills=1, **kw).call_class is CallClass.MIXED
    assert len(cache) == 4, "full: answers, stores no more"
