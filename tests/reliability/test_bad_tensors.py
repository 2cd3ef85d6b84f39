"""Bad tensors at the dispatcher: errors that name the argument, NaN that stays NaN, and vLLM's index contract."""

from __future__ import annotations

import pytest
import torch

from dispatcher import Dispatcher, Policy, what_if
from dispatcher.kernels import default_registry
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill
from dispatcher.kernels.torch_splitk import sparse_decode
from tests.dispatcher.naive import naive_sparse_mla

H, NOPE, ROPE = 2, 48, 16
D = NOPE + ROPE


def dispatcher() -> Dispatcher:
    return Dispatcher(platform=what_if("cpu"), policy=Policy(), registry=default_registry(triton=False))


def tensors(rows: int = 3, skv: int = 20, device: str = "cpu"):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(rows, H, D, generator=g).to(device)
    kv = torch.randn(skv, 1, D, generator=g).to(device)
    idx = torch.randint(0, max(skv, 1), (rows, 8), generator=g, dtype=torch.int32).to(device)
    return q, kv, idx, torch.zeros(rows, H, NOPE, device=device)


def test_empty_kv_pool_names_kv():
    q, _kv, idx, out = tensors()
    kv = torch.zeros(0, 1, D)
    with pytest.raises(ValueError, match=r"^kv is an empty pool \(shape \[0, 1, 64\]\)"):
        dispatcher()(q, kv, idx.fill_(-1), None, 0.3, D, NOPE, ROPE, None, out)


@pytest.mark.parametrize("which", ["q", "kv", "output", "indices"])
def test_meta_tensors_are_rejected_naming_the_argument(which):
    q, kv, idx, out = tensors()
    args = {"q": q, "kv": kv, "indices": idx, "output": out}
    args[which] = torch.empty_like(args[which], device="meta")
    with pytest.raises(ValueError, match=rf"^{which} is on meta\b.*(meta device holds no data)"):
        dispatcher()(args["q"], args["kv"], args["indices"], None, 0.3, D, NOPE, ROPE, None, args["output"])


@pytest.mark.parametrize("kernel", ["prefill", "splitk"])
@pytest.mark.parametrize("sink", [False, True])
def test_nan_in_q_gives_nan_like_the_float64_reference(kernel, sink):
    q, kv, idx, out = tensors(rows=4)
    q[1, 0, 5] = float("nan")  # row 1, head 0 only
    s = torch.randn(H) if sink else None
    args = KernelArgs(q, kv, SparseIndex(idx, None), 0.3, s, out)
    if kernel == "prefill":
        ragged_prefill(args)
    else:
        sparse_decode(args, split=3)
    ref = naive_sparse_mla(q, kv, idx, None, 0.3, s, NOPE)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[1, 0]).all()
    ok = ~torch.isnan(ref)
    torch.testing.assert_close(out[ok].double(), ref[ok], rtol=1e-5, atol=1e-5)


def test_negative_indices_follow_vllm_contract():
    """Without topk_length a row's length is its count of entries >= 0: later positions are ignored, even valid
    slots; negatives inside the length are skipped. With topk_length, positions past it are ignored."""
    q, kv, _idx, _out = tensors(rows=3)
    idx = torch.tensor([[3, -1, 5, -1], [-1, -1, -1, 7], [4, 9, -1, 2]], dtype=torch.int32)
    out = torch.zeros(3, H, NOPE)
    dispatcher()(q, kv, idx, None, 0.3, D, NOPE, ROPE, None, out)
    only = {0: [3], 1: [], 2: [4, 9]}  # row 0: count 2 -> positions 0, 1 -> slot 3; row 1: count 1 -> position 0 -> none
    for row, slots in only.items():
        dense = torch.tensor([slots + [-1] * (4 - len(slots))], dtype=torch.int32)
        want = naive_sparse_mla(q[row:row + 1], kv, dense, None, 0.3, None, NOPE)
        torch.testing.assert_close(out[row:row + 1].double(), want, rtol=1e-5, atol=1e-5)
    assert out[1].abs().sum() == 0  # no valid slot: 0
    lengths = torch.tensor([4, 4, 2], dtype=torch.int32)
    out2 = torch.zeros(3, H, NOPE)
    dispatcher()(q, kv, idx, lengths, 0.3, D, NOPE, ROPE, None, out2)
    torch.testing.assert_close(out2.double(), naive_sparse_mla(q, kv, idx, lengths, 0.3, None, NOPE), rtol=1e-5,
                               atol=1e-5)
    want = naive_sparse_mla(q[0:1], kv, torch.tensor([[3, 5, -1, -1]], dtype=torch.int32), None, 0.3, None, NOPE)
    torch.testing.assert_close(out2[0:1].double(), want, rtol=1e-5, atol=1e-5)  # topk_length 4: slot 5 counts now
