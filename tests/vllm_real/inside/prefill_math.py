"""vLLM's real rocm_sparse_attn_prefill on CPU (its Triton kernels in the interpreter), wrapped by the
plugin, against routescope's torch reference: dense and ragged indices, layouts 448+64, 512+0 and
512+64, fp16 and fp32, with an attention sink (and two cases without)."""

from __future__ import annotations

import torch

from dispatcher.kernels.common import SparseIndex
from tests.vllm_real.inside import batch
from tests.vllm_real.inside.common import OPS, emit, flushed_samples, observer

from vllm.plugins import load_general_plugins  # noqa: I001 - vLLM after routescope's helpers

load_general_plugins()
import importlib  # noqa: E402

ops = importlib.import_module(OPS)
ROWS, HEADS, SKV, TOPK = 5, 4, 40, 8


def case(nope: int, rope: int, dtype: torch.dtype, ragged: bool, sink: bool, lanes: int, seed: int) -> dict:
    d = nope + rope
    q, kv, g = batch.inputs(ROWS, HEADS, d, SKV, dtype, seed)
    dense = torch.randint(0, SKV, (ROWS, TOPK), generator=g, dtype=torch.int32)
    dense[1, 5:] = -1  # -1 padding at the end of a row
    dense[3, :] = -1  # a row with no valid slot: its output is 0
    attn_sink = torch.randn(HEADS, generator=g) if sink else None
    valid = [row[row >= 0] for row in dense]
    r_idx = torch.cat(valid).to(torch.int32)
    r_ptr = torch.tensor([0] + [len(v) for v in valid], dtype=torch.int32).cumsum(0).to(torch.int32)
    out = torch.full((ROWS, HEADS, lanes), 7.0, dtype=dtype)  # the kernel must write every element
    ops.rocm_sparse_attn_prefill(q, kv, dense, None, d ** -0.5, d, nope, rope, attn_sink, out,
                                 *((r_idx, r_ptr) if ragged else ()))
    ref = batch.reference(q, kv, SparseIndex(dense, None), d ** -0.5, attn_sink, lanes)
    return {"layout": f"{nope}+{rope}", "dtype": str(dtype).removeprefix("torch."), "index": "ragged" if ragged else "dense",
            "sink": sink, "lanes": lanes, "max_abs_err": (out.float() - ref).abs().max().item(),
            "ref_max_abs": ref.abs().max().item()}


mid_call: list = []
in_tree = ops._rocm_sparse_attn_prefill_ragged_triton


def flush_then_in_tree(*args, **kwargs):
    """vLLM's in-tree ragged prefill after a flush, for the first call only: what a scrape sees meanwhile."""
    ops._rocm_sparse_attn_prefill_ragged_triton = in_tree
    mid_call.append(flushed_samples())
    return in_tree(*args, **kwargs)


ops._rocm_sparse_attn_prefill_ragged_triton = flush_then_in_tree
cases = []
seed = 0
for nope, rope in ((448, 64), (512, 0), (512, 64)):
    for dtype in (torch.float16, torch.float32):
        for ragged in (False, True):
            seed += 1
            cases.append(case(nope, rope, dtype, ragged, True, nope, seed))
cases.append(case(512, 64, torch.float16, True, True, 576, 100))  # output of all D lanes: V is the whole row
cases.append(case(448, 64, torch.float16, False, False, 448, 101))
cases.append(case(512, 0, torch.float32, True, False, 512, 102))


def ragged_layout(rows: int, width: int, seed: int) -> dict:
    """vLLM's own build_ragged_indices_from_dense (its Triton kernels, interpreted) against the AITER adapter's
    csr_from_dense (dispatcher/kernels/aiter.py), which makes the gfx942 arm's dense calls ragged: the same
    buffer size, the same indptr, every row's slots the same."""
    from dispatcher.kernels.aiter import csr_from_dense
    from routescope.vllm.arms import PrefillCall, ragged_refusal

    g = torch.Generator().manual_seed(seed)
    dense = torch.randint(0, SKV, (rows, width), generator=g, dtype=torch.int32)
    dense[0, 3:] = -1  # a short row
    dense[1, :] = -1  # an empty one
    dense[-1, 1] = -1  # a -1 inside the row's length, which vLLM skips
    dense[-1, 2] = SKV + 5  # a slot past the pool, which vLLM skips too
    lengths = torch.full((rows,), width, dtype=torch.int32)
    flat, ptr = ops.build_ragged_indices_from_dense(dense, lengths, num_rows=SKV)
    call = PrefillCall(torch.empty(rows, 1, 1), None, None, None, 1.0, 1, 1, 0, None, None, flat, ptr)
    got, got_ptr = csr_from_dense(dense, lengths, SKV)
    n = int(ptr[-1])
    match = (got.shape == flat.shape and torch.equal(got_ptr, ptr.to(torch.int32))
             and torch.equal(got[:n], flat[:n].to(torch.int32)))
    return {"rows": rows, "width": width, "numel": int(flat.numel()), "refusal": ragged_refusal(call), "match": match}


layouts = [ragged_layout(5, 8, 7), ragged_layout(3, 16, 8), ragged_layout(6, 2048, 9)]
emit(cases=cases, mid_call=mid_call, samples=flushed_samples(), calls=observer().calls, errors=dict(observer().errors),
     layouts=layouts)
