"""What makes a B kernel unavailable for a vLLM call, asked from host facts before anything launches. vLLM here is
TEST DOUBLES (tests/vllm_plugin/doubles.py); AITER is tests/dispatcher/aiter_double.py's TEST DOUBLE or absent."""

from __future__ import annotations

import sys

import pytest
import torch

from dispatcher.kernels.aiter import MODULES, PA_PREFILL_SPARSE
from dispatcher.types import Kernel
from routescope.vllm.arms import PrefillCall, VllmArms
from tests.dispatcher import aiter_double

from .conftest import prefill_args


def _call(rows: int = 8, *, ragged_only: bool = False, sink: bool = True, nope: int = 12, rope: int = 4,
          dtype=torch.bfloat16) -> PrefillCall:
    args, _ = prefill_args(rows, sink=sink, nope=nope, rope=rope, dtype=dtype, full_lanes=True)
    call = PrefillCall(*args)
    if ragged_only:
        idx = call.indices
        keep = idx >= 0
        ptr = torch.zeros(rows + 1, dtype=torch.int32)
        ptr[1:] = keep.sum(1).cumsum(0)
        call = call._replace(indices=None, ragged_indices=idx[keep], ragged_indptr=ptr)
    return call


def vllm_ragged(call: PrefillCall, *, tail: int = 1) -> PrefillCall:
    """The call's dense indices in vLLM's ragged layout: a buffer of rows x W slots (the backend's
    paged_kv_indices), row i's valid slots packed from indptr[i]; the buffer's tail past indptr[-1] holds ``tail``
    (a valid slot, so that reading it would change the output)."""
    idx = call.indices
    keep = idx >= 0
    ptr = torch.zeros(idx.shape[0] + 1, dtype=torch.int32)
    ptr[1:] = keep.sum(1).cumsum(0)
    flat = torch.full((idx.numel(),), tail, dtype=torch.int32)
    flat[: int(ptr[-1])] = idx[keep]
    return call._replace(indices=None, ragged_indices=flat, ragged_indptr=ptr)


@pytest.fixture
def ops(vllm_doubles):
    return vllm_doubles(getters="opus_only").ops()


@pytest.mark.parametrize(("kernel", "change", "why"), [
    (Kernel.AITER_OPUS, {}, "_ON_GFX950 is False"),
    (Kernel.AITER_OPUS, {"_ON_GFX950": True, "HAVE_OPUS": False}, "returned None"),
    (Kernel.AITER_OPUS, {"_ON_GFX950": True, "_rocm_sparse_attn_prefill_ragged_aiter_opus": None},
     "no _rocm_sparse_attn_prefill_ragged_aiter_opus"),
    (Kernel.INTREE_RAGGED_PREFILL, {"_rocm_sparse_attn_prefill_triton": None}, "no _rocm_sparse_attn_prefill_triton"),
    (Kernel.INTREE_SPARSE_DECODE, {"rocm_sparse_decode_bf16_num_splits": None}, "no rocm_sparse_decode_bf16_num"),
])
def test_a_missing_piece_of_vllm_says_which(ops, kernel, change, why):
    for name, value in change.items():
        setattr(ops, name, value)
    reason = VllmArms(ops).unavailable(kernel, _call(), "bfloat16", "bfloat16")
    assert reason is not None and why in reason


def test_what_each_kernel_takes(ops):
    ops._ON_GFX950 = True
    arms = VllmArms(ops, aiter_module=aiter_double.NAME)
    aiter_double.install()
    try:
        assert arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, _call(), "bfloat16", "bfloat16") is None
        assert arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, vllm_ragged(_call()), "bfloat16", "bfloat16") is None
        # packed with no room to spare (23 slots for 8 rows): still AITER's CSR form, taken as it is
        packed = _call(ragged_only=True)
        packed = packed._replace(ragged_indices=packed.ragged_indices[1:], ragged_indptr=(
            packed.ragged_indptr - torch.tensor([0] + [1] * 8, dtype=torch.int32)))
        assert arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, packed, "bfloat16", "bfloat16") is None
        short = vllm_ragged(_call())
        short = short._replace(ragged_indptr=short.ragged_indptr[:-1])
        assert "expected 1-D indices and [rows + 1]" in arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, short,
                                                                       "bfloat16", "bfloat16")
        assert "fp16/bf16" in arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, _call(), "float32", "float32")
    finally:
        aiter_double.uninstall()
    assert arms.unavailable(Kernel.AITER_OPUS, _call(), "bfloat16", "bfloat16") is None
    assert "sink" in arms.unavailable(Kernel.AITER_OPUS, _call(sink=False), "bfloat16", "bfloat16")
    assert arms.unavailable(Kernel.INTREE_SPARSE_DECODE, _call(), "bfloat16", "bfloat16") is None
    assert "power of two" in arms.unavailable(Kernel.INTREE_SPARSE_DECODE, _call(nope=8), "bfloat16", "bfloat16")
    assert "q's dtype" in arms.unavailable(Kernel.INTREE_SPARSE_DECODE, _call(), "bfloat16", "float8_e4m3fn")


def test_aiter_missing_is_asked_once(ops):
    """No AITER module: the adapter's import fails once, is remembered, and is not tried again per call."""
    arms = VllmArms(ops, aiter_module="routescope_no_such_aiter_module")
    first = arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, _call(), "bfloat16", "bfloat16")
    assert first is not None and "cannot be loaded" in first
    for _ in range(5):
        assert arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, _call(), "bfloat16", "bfloat16") == first
    assert arms.pa.loads == 1


@pytest.mark.parametrize("kernel", [Kernel.INTREE_RAGGED_PREFILL, Kernel.INTREE_SPARSE_DECODE, Kernel.AITER_OPUS])
@pytest.mark.parametrize("ragged_only", [False, True])
def test_every_launcher_writes_the_reference(ops, kernel, ragged_only):
    ops._ON_GFX950 = True
    call = _call(ragged_only=ragged_only)
    expected = call.output.clone()
    out = torch.full_like(call.output, 7.0)
    _, ref = prefill_args(8, sink=True, nope=12, rope=4, full_lanes=True)  # the same operands (seed 0)
    VllmArms(ops).launch(kernel, call, out)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert torch.equal(call.output, expected)  # the caller's output untouched when B writes elsewhere


def test_pa_prefill_sparse_takes_vllms_ragged_layout_straight_through(ops):
    """A ragged-only call (GLM's pure-decode path passes the backend's paged_kv_indices / paged_kv_indptr) reaches
    pa_prefill_sparse (AITER's TEST DOUBLE, AITER's signature) as AITER's CSR arguments, the same tensors, and writes
    the reference bit for bit; the buffer's tail past the rows is never read. A dense call is made ragged by the
    adapter; nothing is prepared before B's clock."""
    aiter = aiter_double.install()
    seen = []
    fn = sys.modules[f"{aiter_double.NAME}.{MODULES[PA_PREFILL_SPARSE]}"].pa_prefill_sparse
    sys.modules[f"{aiter_double.NAME}.{MODULES[PA_PREFILL_SPARSE]}"].pa_prefill_sparse = (
        lambda *a, **k: seen.append(a[2:4]) or fn(*a, **k))
    try:
        arms = VllmArms(ops, aiter_module=aiter_double.NAME)
        _, ref = prefill_args(8, sink=True, nope=12, rope=4, full_lanes=True)
        for tail in (1, 5):
            call = vllm_ragged(_call(), tail=tail)
            assert arms.prepare(Kernel.AITER_PA_PREFILL_SPARSE, call) is call
            out = torch.full_like(call.output, 7.0)
            arms.launch(Kernel.AITER_PA_PREFILL_SPARSE, call, out)
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
            assert seen[-1][0] is call.ragged_indices and seen[-1][1] is call.ragged_indptr  # straight through
        dense = _call()
        out = torch.full_like(dense.output, 7.0)
        arms.launch(Kernel.AITER_PA_PREFILL_SPARSE, dense, out)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        assert [name for name, _ in aiter.calls] == ["pa_prefill_sparse"] * 3
    finally:
        aiter_double.uninstall()
