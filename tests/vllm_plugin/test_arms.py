"""What makes a B kernel unavailable for a vLLM call, asked from host facts before anything launches. vLLM here is
TEST DOUBLES (tests/vllm_plugin/doubles.py); AITER is tests/dispatcher/aiter_double.py's TEST DOUBLE or absent."""

from __future__ import annotations

import pytest
import torch

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
        assert "dense indices" in arms.unavailable(Kernel.AITER_PA_PREFILL_SPARSE, _call(ragged_only=True),
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
