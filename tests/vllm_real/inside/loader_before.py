"""ROUTESCOPE_VLLM=1 before vLLM loads anything, as in a worker: vLLM's logging configured, vLLM's loader
runs the plugin (an import hook waits), then vLLM's modules load and real batches go through vLLM's
ROCm sparse MLA backend inside real ForwardContexts."""

from __future__ import annotations

import torch

from tests.vllm_real.inside import batch
from tests.vllm_real.inside.common import (
    BACKEND, MODELS, OPS, configure_vllm_logging, emit, flushed_samples, import_binding_sites, observer, wrapped_sites,
)

configure_vllm_logging()
from vllm.plugins import load_general_plugins  # noqa: E402

load_general_plugins()
from routescope.vllm import plugin  # noqa: E402

state_before_import = plugin.current().state
modules = import_binding_sites()
sites = wrapped_sites(modules)
backend = batch.impl(heads=16)


def step(rows: int, layers: int, seed: int, **meta) -> None:
    q, kv, g = batch.inputs(rows, 16, 512, 32, torch.float16, seed)
    batch.forward(backend, batch.metadata(**meta), q, kv, batch.ragged(rows, 32, 4, g), layers)


# GLM-style: the whole batch (2 decode rows, then a 4-token prefill) through the prefill entry, 2 layers
step(6, 2, 1, decodes=2, decode_tokens=2, prefills=1, tokens=6, max_query_len=4, max_seq_len=64)
# pure decode with short sequences: vLLM picks no split-K, so the prefill entry again, 2 layers
step(3, 2, 2, decodes=3, decode_tokens=3, prefills=0, tokens=3, max_query_len=1, max_seq_len=64)
# pure decode with long sequences: split-K, the decode entry (rocm_sparse_attn_decode_bf16), twice
step(3, 1, 3, decodes=3, decode_tokens=3, prefills=0, tokens=3, max_query_len=1, max_seq_len=4096)
step(2, 1, 4, decodes=2, decode_tokens=2, prefills=0, tokens=2, max_query_len=1, max_seq_len=4096)
# a prefill-only step of 5 tokens
step(5, 1, 5, decodes=0, decode_tokens=0, prefills=1, tokens=5, max_query_len=5, max_seq_len=64)
# DeepSeek-V4's shape (vllm/models/deepseek_v4/amd/rocm.py, _forward_prefill): only the prefill rows after
# the decode rows, by keyword, dense top-k indices with their lengths, 448+64, the layer's sink
from vllm.forward_context import ForwardContext, override_forward_context  # noqa: E402

q, kv, g = batch.inputs(6, 8, 512, 32, torch.float16, 6)
meta = batch.metadata(decodes=2, decode_tokens=2, prefills=1, tokens=6, max_query_len=4, max_seq_len=64)
indices = torch.randint(0, 32, (4, 8), generator=g, dtype=torch.int32)
out = torch.zeros(4, 8, 448, dtype=torch.float16)
with override_forward_context(ForwardContext(no_compile_layers={}, attn_metadata={"swa": meta}, slot_mapping={})):
    modules[MODELS[0]].rocm_sparse_attn_prefill(
        q=q[2:], kv=kv, indices=indices, topk_length=torch.tensor([8, 5, 8, 3], dtype=torch.int32),
        scale=512 ** -0.5, head_dim=512, nope_head_dim=448, rope_head_dim=64, attn_sink=torch.zeros(8), output=out)

obs = observer()
emit(state_before_import=state_before_import, state=plugin.current().state, sites=sites, samples=flushed_samples(),
     errors=dict(obs.errors), mismatches=obs.status()["mismatches"], calls=obs.calls, decode_calls=obs.decode_calls,
     modules=[OPS, BACKEND, *MODELS])
