"""Every validation error names the argument and the shapes it saw."""

from __future__ import annotations

import pytest
import torch

from dispatcher.validate import validate

SQ, H, NOPE, ROPE = 4, 2, 48, 16
D = NOPE + ROPE


def good(**over):
    args = dict(
        q=torch.randn(SQ, H, D),
        kv=torch.randn(10, 1, D),
        indices=torch.zeros(SQ, 8, dtype=torch.int32),
        topk_length=None,
        scale=0.1,
        head_dim=D,
        nope_head_dim=NOPE,
        rope_head_dim=ROPE,
        attn_sink=None,
        output=torch.empty(SQ, H, NOPE),
        ragged_indices=None,
        ragged_indptr=None,
    )
    args.update(over)
    return args


def test_good_call_shape():
    s = validate(**good(attn_sink=torch.zeros(H)))
    assert (s.rows, s.heads, s.head_dim, s.topk, s.q_dtype, s.sink_ok, s.out_lanes) == (SQ, H, D, 8, "float32", True, NOPE)
    assert not s.out_strides_match_q
    s2 = validate(**good(output=torch.empty(SQ, H, D), attn_sink=torch.zeros(H, dtype=torch.bfloat16)))
    assert s2.out_strides_match_q and s2.has_sink and not s2.sink_ok


CASES = [
    ("q not a tensor", dict(q=[1, 2]), "q must be a torch.Tensor"),
    ("q rank", dict(q=torch.randn(SQ, D)), r"q must be \[sq, H, D\]; got shape \[4, 64\]"),
    ("q last dim", dict(q=torch.randn(SQ, H, D + 1)), "q's last dim 65 != head_dim 64"),
    ("q int", dict(q=torch.zeros(SQ, H, D, dtype=torch.int32)), "q dtype"),
    ("head_dim sum", dict(head_dim=D + 1), "head_dim 65 != nope_head_dim 48 \\+ rope_head_dim 16"),
    ("nope zero", dict(nope_head_dim=0, head_dim=ROPE), "nope_head_dim must be > 0"),
    ("head_dim type", dict(head_dim=64.0), "head_dim must be a non-negative int"),
    ("scale nan", dict(scale=float("nan")), "scale must be a finite number"),
    ("scale str", dict(scale="0.1"), "scale must be a finite number"),
    ("kv rank", dict(kv=torch.randn(10, D)), r"kv must be \[skv, 1, D\]; got shape \[10, 64\]"),
    ("kv heads", dict(kv=torch.randn(10, 2, D)), r"kv must be \[skv, 1, D\]"),
    ("kv dim", dict(kv=torch.randn(10, 1, D - 1)), "kv's last dim 63 != head_dim 64"),
    ("kv dtype", dict(kv=torch.zeros(10, 1, D, dtype=torch.int8)), "kv dtype"),
    ("output shape", dict(output=torch.empty(SQ, H, 10)), r"output must be \[4, 2, 48\] or \[4, 2, 64\]; got \[4, 2, 10\]"),
    ("output rows", dict(output=torch.empty(SQ + 1, H, NOPE)), "output must be"),
    ("output rank", dict(output=torch.empty(SQ, H * NOPE)), "output must be"),
    ("output dtype", dict(output=torch.empty(SQ, H, NOPE, dtype=torch.int32)), "output dtype"),
    ("indices rows", dict(indices=torch.zeros(SQ + 1, 8, dtype=torch.int32)), r"indices must be \[4, topk\]; got \[5, 8\]"),
    ("indices dtype", dict(indices=torch.zeros(SQ, 8)), "indices dtype must be int32 or int64"),
    ("no indices", dict(indices=None), "indices is None"),
    ("topk_length shape", dict(topk_length=torch.zeros(SQ + 1, dtype=torch.int32)), r"topk_length must be \[4\]"),
    ("topk_length dtype", dict(topk_length=torch.zeros(SQ)), r"topk_length must be \[4\] int32/int64"),
    ("sink shape", dict(attn_sink=torch.zeros(H + 1)), r"attn_sink must be \[2\]; got \[3\]"),
    ("ragged alone", dict(ragged_indices=torch.zeros(3, dtype=torch.int32)), "come together; got only ragged_indices"),
    ("indptr alone", dict(ragged_indptr=torch.zeros(SQ + 1, dtype=torch.int32)), "got only ragged_indptr"),
    ("indptr length", dict(ragged_indices=torch.zeros(3, dtype=torch.int32), ragged_indptr=torch.zeros(SQ, dtype=torch.int32)), r"ragged_indptr must be \[5\]"),
    ("ragged rank", dict(ragged_indices=torch.zeros(3, 1, dtype=torch.int32), ragged_indptr=torch.zeros(SQ + 1, dtype=torch.int32)), "ragged_indices must be 1-D"),
]


@pytest.mark.parametrize("over,msg", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_errors(over, msg):
    with pytest.raises(ValueError, match=msg):
        validate(**good(**over))


def test_device_mismatch_is_named():
    meta = torch.empty(10, 1, D, device="meta")
    with pytest.raises(ValueError, match="kv is on meta but q is on cpu"):
        validate(**good(kv=meta))


def test_ragged_without_dense_indices_is_fine():
    s = validate(**good(indices=None, ragged_indices=torch.zeros(3, dtype=torch.int32), ragged_indptr=torch.zeros(SQ + 1, dtype=torch.int32)))
    assert s.ragged and s.topk == 1  # 3 positions over 4 rows: a mean of 1, a power of two


@pytest.mark.parametrize(("positions", "rows", "width"), [(0, 4, 0), (4096, 2, 2048), (4000, 2, 2048), (4100, 2, 4096),
                                                          (300, 600, 1), (16384 * 2048, 16384, 2048)])
def test_a_ragged_calls_width_is_its_mean_row_rounded_up_to_a_power_of_two(positions, rows, width):
    from dispatcher.validate import ragged_width

    assert ragged_width(positions, rows) == width
