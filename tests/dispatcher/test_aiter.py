"""The lazy AITER adapters (dispatcher/kernels/aiter.py) against AITER's public calling convention, through
tests/dispatcher/aiter_double.py, AITER's TEST DOUBLE (AITER needs ROCm): never AITER's kernels themselves."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

from dispatcher.kernels.aiter import (
    MODULES, OPUS, PA_PREFILL_SPARSE, aiter_symbol, csr_compact, csr_from_dense, make_adapter,
)
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill

from . import aiter_double

# AITER's public signatures, read from ROCm/aiter (mirror HEAD e4048607a535ace3a2b51ded31b1c8c2d45c0879):
# aiter/ops/triton/attention/pa_prefill_sparse.py at ca1909e300d7860bd6d002e8c95c6c2dae993a4d (no out; later
# versions add a trailing `out=None`), aiter/ops/pa_sparse_prefill_opus.py at 044f906a8d56f8d1577081f0aab730fcf659b9bd.
PA_PARAMS = ["q", "unified_kv", "kv_indices_prefix", "kv_indptr_prefix", "kv", "kv_indices_extend",
             "kv_indptr_extend", "attn_sink", "softmax_scale", "has_invalid"]
OPUS_PARAMS = ["q", "unified_kv", "kv_indices_prefix", "kv_indptr_prefix", "kv", "kv_indices_extend",
               "kv_indptr_extend", "attn_sink", "softmax_scale", "out"]
R, H, D, NOPE, SKV, W = 9, 2, 64, 48, 40, 16


@pytest.fixture
def aiter():
    yield aiter_double.install()
    aiter_double.uninstall()


def _fn(symbol):
    return getattr(sys.modules[f"{aiter_double.NAME}.{MODULES[symbol]}"], symbol)


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_double_has_aiters_signatures():
    """Names, order and defaults as AITER's files have them, so the adapter cannot drift from AITER."""
    want_pa = [(n, None if n == "has_invalid" else inspect.Parameter.empty) for n in PA_PARAMS]
    want_opus = [(n, None if n == "out" else inspect.Parameter.empty) for n in OPUS_PARAMS]
    aiter_double.install(with_out=False)
    assert _params(_fn(PA_PREFILL_SPARSE)) == want_pa
    aiter_double.install()
    assert _params(_fn(PA_PREFILL_SPARSE)) == want_pa + [("out", None)]
    assert _params(_fn(OPUS)) == want_opus
    aiter_double.uninstall()
    assert MODULES == {PA_PREFILL_SPARSE: "ops.triton.attention.pa_prefill_sparse", OPUS: "ops.pa_sparse_prefill_opus"}


def _operands(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(R, H, D, generator=g).to(dtype)
    kv = torch.randn(SKV, 1, D, generator=g).to(dtype)
    idx = torch.randint(-1, SKV + 3, (R, W), generator=g, dtype=torch.int32)  # -1 and past-the-pool slots inside
    idx[2, :] = -1  # a row with no valid slot
    length = torch.randint(1, W + 1, (R,), generator=g, dtype=torch.int32)
    length[4] = 0  # a zero-length row
    return q, kv, idx, length, torch.randn(H, generator=g)


def _want_csr(idx, length):
    rows = []
    for i in range(idx.shape[0]):
        n = int(length[i]) if length is not None else int((idx[i] >= 0).sum())
        rows.append([int(s) for s in idx[i, :n] if 0 <= s < SKV])
    return rows


@pytest.mark.parametrize("with_length", [True, False])
def test_dense_indices_become_aiters_csr(with_length):
    _, _, idx, length, _ = _operands(torch.float16)
    length = length if with_length else None
    flat, ptr = csr_from_dense(idx, length, SKV)
    assert flat.dtype == ptr.dtype == torch.int32 and flat.shape == (R * W,) and ptr.shape == (R + 1,)
    assert [flat[ptr[i]:ptr[i + 1]].tolist() for i in range(R)] == _want_csr(idx, length)
    assert sorted(flat.tolist()) == sorted(idx.reshape(-1).tolist())  # a permutation: the tail holds the dropped


def test_csr_is_built_without_reading_the_device():
    """On the meta device any host read (item, a boolean mask, nonzero) raises: the builders use none."""
    idx = torch.empty(R, W, dtype=torch.int32, device="meta")
    length = torch.empty(R, dtype=torch.int32, device="meta")
    for lengths in (length, None):
        flat, ptr = csr_from_dense(idx, lengths, SKV)
        assert flat.shape == (R * W,) and ptr.shape == (R + 1,)
    flat, ptr = csr_compact(torch.empty(50, dtype=torch.int64, device="meta"),
                            torch.empty(R + 1, dtype=torch.int64, device="meta"), length, SKV)
    assert flat.shape == (50,) and ptr.shape == (R + 1,)


def _ragged(idx):
    """The dense indices as a ragged index with a tail past indptr[-1] (a valid slot: reading it would show)."""
    ptr = torch.zeros(R + 1, dtype=torch.int32)
    ptr[1:] = torch.tensor([W] * R).cumsum(0)
    return torch.cat([idx.reshape(-1), torch.full((7,), 3, dtype=torch.int32)]), ptr


@pytest.mark.parametrize("symbol", [PA_PREFILL_SPARSE, OPUS])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lanes", [D, NOPE])
@pytest.mark.parametrize("form", ["dense", "dense_no_length", "ragged", "ragged_length"])
def test_calls_through_the_adapter_equal_the_reference_bit_for_bit(aiter, symbol, dtype, lanes, form):
    q, kv, idx, length, sink = _operands(dtype)
    if form.startswith("dense"):
        index = SparseIndex(idx, length if form == "dense" else None)
    else:
        flat, ptr = _ragged(idx)
        index = SparseIndex(None, length if form == "ragged_length" else None, flat, ptr)
    out = torch.full((R, H, lanes), float("nan"), dtype=dtype)
    ref = torch.empty_like(out)
    make_adapter(aiter_symbol(symbol, aiter_double.NAME))(KernelArgs(q, kv, index, 0.2, sink, out))
    ragged_prefill(KernelArgs(q, kv, index, 0.2, sink, ref))
    assert torch.equal(out, ref)
    assert aiter.calls == [(symbol, lanes == D)]  # out= only when the output matches q


def test_a_non_contiguous_output_is_copied_and_an_aiter_without_out_is_too():
    q, kv, idx, length, sink = _operands(torch.bfloat16)
    args = lambda out: KernelArgs(q, kv, SparseIndex(idx, length), 0.2, sink, out)  # noqa: E731
    ref = torch.empty(R, H, D, dtype=torch.bfloat16)
    ragged_prefill(args(ref))
    mod = aiter_double.install()
    strided = torch.empty(R, D, H, dtype=torch.bfloat16).transpose(1, 2)  # q's shape, not contiguous
    make_adapter(aiter_symbol(PA_PREFILL_SPARSE, aiter_double.NAME))(args(strided))
    assert torch.equal(strided, ref) and mod.calls == [(PA_PREFILL_SPARSE, False)]
    old = aiter_double.install(with_out=False)
    symbol = aiter_symbol(PA_PREFILL_SPARSE, aiter_double.NAME)
    launch = make_adapter(symbol)
    for _ in range(2):
        out = torch.empty(R, H, D, dtype=torch.bfloat16)
        launch(args(out))
        assert torch.equal(out, ref)
    assert symbol.takes_out is False and old.calls == [(PA_PREFILL_SPARSE, False)] * 2  # refused once, remembered
    aiter_double.uninstall()


def test_an_error_inside_the_kernel_is_not_taken_for_a_missing_out(aiter):
    q, kv, idx, length, _ = _operands(torch.float32)  # OPUS refuses fp32 q
    out = torch.empty(R, H, D)
    with pytest.raises(RuntimeError, match="fp16/bf16"):
        make_adapter(aiter_symbol(OPUS, aiter_double.NAME))(KernelArgs(q, kv, SparseIndex(idx, length), 0.2,
                                                                        torch.zeros(H), out))
