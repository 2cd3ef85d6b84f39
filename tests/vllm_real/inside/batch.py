"""Real vLLM batches for the scripts in this folder: vLLM's own metadata class, ForwardContext and backend.

``forward`` runs ``ROCMAiterMLASparseImpl._forward_mla`` (vLLM 0.33.0's ROCm sparse MLA backend) inside
a real ``ForwardContext`` holding a real ``ROCMAiterMLASparseMetadata``: vLLM's code picks the entry
(``rocm_sparse_attn_decode_bf16`` for a split-K decode, else ``rocm_sparse_attn_prefill`` with the
whole batch, decode rows included: GLM-5.3's path) from the metadata's host ints, as in a worker.
"""

from __future__ import annotations

from typing import Any

import torch

from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill

LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def impl(heads: int = 16, kv_lora_rank: int = 512) -> Any:
    """vLLM's ROCMAiterMLASparseImpl, its __init__ skipped (it wants a whole VllmConfig and a GPU), with
    what ``_forward_mla`` reads set: GLM-5.3's layout (head size == kv_lora_rank: 512+0), no sinks."""
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseImpl

    self = object.__new__(ROCMAiterMLASparseImpl)
    self.num_heads, self.sinks, self.kv_cache_dtype = heads, None, "auto"
    self.kv_lora_rank, self.scale = kv_lora_rank, kv_lora_rank ** -0.5
    return self


def metadata(*, decodes: int, decode_tokens: int, prefills: int, tokens: int, max_query_len: int,
             max_seq_len: int, dtype: torch.dtype = torch.float16) -> Any:
    """vLLM's ROCMAiterMLASparseMetadata; its device tensors are placeholders the Triton path never reads."""
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseMetadata

    z = torch.zeros(1, dtype=torch.int32)
    return ROCMAiterMLASparseMetadata(
        num_reqs=decodes + prefills, max_query_len=max_query_len, max_seq_len=max_seq_len, num_actual_tokens=tokens,
        query_start_loc=z, slot_mapping=z, num_decodes=decodes, num_decode_tokens=decode_tokens,
        num_prefills=prefills, block_table=z, req_id_per_token=z, attn_out_dtype=dtype)


def ragged(rows: int, skv: int, per_row: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR indices: ``per_row`` kv slots for every row."""
    indices = torch.randint(0, skv, (rows * per_row,), generator=g, dtype=torch.int32)
    return indices, torch.arange(0, rows * per_row + 1, per_row, dtype=torch.int32)


def inputs(rows: int, heads: int, dim: int, skv: int, dtype: torch.dtype, seed: int) -> tuple:
    """q [rows, heads, dim], kv [skv, 1, dim] (values kept small: fp16 rounds to < 1e-3 below 2)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, dim, generator=g).to(dtype)
    kv = (torch.randn(skv, 1, dim, generator=g) * 0.5).to(dtype)
    return q, kv, g


def forward(backend: Any, meta: Any, q: torch.Tensor, kv: torch.Tensor, index: tuple, layers: int = 1) -> Any:
    """``layers`` attention layers of one step through vLLM's backend, in one real ForwardContext."""
    from vllm.forward_context import ForwardContext, override_forward_context

    meta.paged_kv_indices, meta.paged_kv_indptr = index
    ctx = ForwardContext(no_compile_layers={}, attn_metadata={name: meta for name in LAYERS}, slot_mapping={})
    with override_forward_context(ctx):
        return [backend._forward_mla(None, q, kv, meta)[0] for _ in range(layers)][-1]


def reference(q: torch.Tensor, kv: torch.Tensor, index: SparseIndex, scale: float, sink: Any, lanes: int) -> torch.Tensor:
    """routescope's torch reference (dispatcher/kernels/torch_ref.py), into an fp32 output."""
    out = torch.zeros(q.shape[0], q.shape[1], lanes, dtype=torch.float32)
    ragged_prefill(KernelArgs(q, kv, index, scale, sink, out))
    return out
