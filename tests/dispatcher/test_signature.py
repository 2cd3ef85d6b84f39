"""The validation cache rejects every malformed call validate rejects, the second time too (a hit never skips a
check that could fail), and a repeated good call is served from the cache."""

from __future__ import annotations

import pytest
import torch

import dispatcher.signature as signature
from dispatcher.signature import ValidatedCalls
from dispatcher.validate import validate

from .test_validate import CASES, D, SQ, good


@pytest.mark.parametrize("over,msg", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_malformed_call_is_rejected_twice(over, msg):
    calls = ValidatedCalls()
    calls(**good())  # a good call of the same family first: its signature is in the cache
    for _ in range(2):
        with pytest.raises(ValueError, match=msg):
            calls(**good(**over))


def test_a_good_call_is_validated_once(monkeypatch):
    seen = []

    def counting(*args):
        seen.append(1)
        return validate(*args)

    monkeypatch.setattr(signature, "validate", counting)
    calls = ValidatedCalls()
    args = good(attn_sink=torch.zeros(2))
    first, memo = calls(**args)
    for _ in range(5):
        assert calls(**good(attn_sink=torch.zeros(2))) == (first, memo)  # new tensors, same signature
    assert memo == {} and calls(**good(attn_sink=torch.zeros(2)))[1] is memo
    assert len(seen) == 1
    calls(**good(q=torch.randn(SQ + 1, 2, D), output=torch.empty(SQ + 1, 2, 48),
                 indices=torch.zeros(SQ + 1, 8, dtype=torch.int32)))
    assert len(seen) == 2, "another shape is validated again"


@pytest.mark.parametrize("over", [dict(head_dim=64.0, nope_head_dim=48, rope_head_dim=16), dict(scale=True),
                                  dict(scale=float("inf")),
                                  dict(q=torch.randn(SQ, 2, D).transpose(0, 1))])
def test_values_equal_to_a_cached_signature_are_still_checked(over):
    calls = ValidatedCalls()
    calls(**good())
    with pytest.raises(ValueError):
        calls(**good(**over))


def test_a_layout_change_is_a_new_signature():
    calls = ValidatedCalls()
    base = good(output=torch.empty(SQ, 2, D))
    assert calls(**base)[0].out_strides_match_q
    strided = torch.empty(SQ, 2, 2 * D)[:, :, :D]
    assert not calls(**good(output=strided))[0].out_strides_match_q


def test_bounded(monkeypatch):
    monkeypatch.setattr(signature, "MAX_SIGNATURES", 3)
    calls = ValidatedCalls()
    for rows in range(1, 8):
        calls(**good(q=torch.randn(rows, 2, D), output=torch.empty(rows, 2, 48),
                     indices=torch.zeros(rows, 8, dtype=torch.int32)))
    assert len(calls._shapes) == 3
