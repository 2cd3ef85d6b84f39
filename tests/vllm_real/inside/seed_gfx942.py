"""The seed PR's variant: vLLM 0.33.0's ops module with the gfx942 pa_prefill_sparse branch patched in
(tests/vllm_real/seed_gfx942.patch, applied to a copy by the test), on a what-if gfx942, with a stand-in
for AITER's leaf kernel. vLLM's patched code decides; the plugin labels what it launched."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import types
from importlib.machinery import ModuleSpec

import torch

from dispatcher import what_if
from dispatcher.kernels.common import SparseIndex
from tests.vllm_real.inside import batch
from tests.vllm_real.inside.common import (
    OPS, configure_vllm_logging, emit, flushed_samples, import_binding_sites, observer, wrapped_sites,
)


class PatchedOps(importlib.abc.MetaPathFinder):
    """Serves the patched copy under vLLM's module name (the plugin's import hook asks the finders after it)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != OPS:
            return None
        return importlib.util.spec_from_file_location(OPS, os.environ["ROUTESCOPE_SEED_MODULE"])


stand_in_calls: list[int] = []


def pa_prefill_sparse(q, kv, indices, indptr, attn_sink, scale, out=None):
    """STAND-IN for AITER's pa_prefill_sparse (ROCm/aiter#6002 needs ROCm): routescope's torch reference."""
    stand_in_calls.append(q.shape[0])
    ref = batch.reference(q, kv.unsqueeze(1), SparseIndex(None, None, indices.long(), indptr.long()), scale,
                          attn_sink, q.shape[-1]).to(q.dtype)
    if out is None:
        return ref
    out.copy_(ref)
    return out


def install_aiter_stand_in() -> None:
    for name in ("aiter", "aiter.ops", "aiter.ops.pa_prefill_sparse"):
        m = types.ModuleType(name, "STAND-IN for AITER (tests/vllm_real/inside/seed_gfx942.py): not AMD's library.")
        m.__spec__ = ModuleSpec(name, None)
        sys.modules[name] = m
    sys.modules["aiter.ops.pa_prefill_sparse"].pa_prefill_sparse = pa_prefill_sparse


sys.meta_path.insert(0, PatchedOps())
configure_vllm_logging()
from routescope.vllm import plugin  # noqa: E402

state = plugin.install(env=os.environ, platform=what_if("gfx942"))
modules = import_binding_sites()
ops = modules[OPS]
# What-if gfx942 with AITER: vLLM's own arch flag (False on this CPU), and vLLM's check that AITER is
# installed on a CDNA3+ GPU (rocm_aiter_ops.is_enabled() asks it before reading VLLM_ROCM_USE_AITER=1).
ops._ON_GFX942 = True
importlib.import_module("vllm._aiter_ops").is_aiter_found_and_supported = lambda: True
install_aiter_stand_in()


def direct(rows: int, lanes: int, seed: int, heads: int = 2) -> float:
    """One call of the patched entry; the largest difference from the reference."""
    q, kv, g = batch.inputs(rows, heads, 576, 64, torch.float16, seed)
    idx, ptr = batch.ragged(rows, 64, 4, g)
    sink = torch.randn(heads, generator=g)
    out = torch.zeros(rows, heads, lanes, dtype=torch.float16)
    ops.rocm_sparse_attn_prefill(q, kv, None, None, 576 ** -0.5, 576, 512, 64, sink, out, idx, ptr)
    ref = batch.reference(q, kv, SparseIndex(None, None, idx.long(), ptr.long()), 576 ** -0.5, sink, lanes)
    return (out.float() - ref).abs().max().item()


errs = {"600 rows, 512 lanes": direct(600, 512, 1), "512 rows, 576 lanes": direct(512, 576, 2),
        "8 rows, 512 lanes": direct(8, 512, 3)}
# GLM-style pure decodes through vLLM's backend (the whole batch to the prefill entry, short sequences)
backend = batch.impl(heads=16)
for rows, seed in ((512, 4), (4, 5)):
    q, kv, g = batch.inputs(rows, 16, 512, 32, torch.float16, seed)
    meta = batch.metadata(decodes=rows, decode_tokens=rows, prefills=0, tokens=rows, max_query_len=1, max_seq_len=64)
    batch.forward(backend, meta, q, kv, batch.ragged(rows, 32, 4, g))
obs = observer()
seen = {"samples": flushed_samples(), "mismatches": dict(obs.status()["mismatches"]),
        "stand_in_calls": list(stand_in_calls)}

# vLLM's arch flag off (a process vLLM does not take for gfx942): its inline branch declines a 600-row call
# the plugin's what-if gfx942 policy would send to AITER. A flush where vLLM's in-tree kernel runs shows
# what a scrape in mid-call would read. Another head count: a call class not decided yet.
ops._ON_GFX942 = False
mid_call: list = []
in_tree_calls: list[int] = []


def flush_then_in_tree_stand_in(*, q, kv, indices, indptr, scale, attn_sink, nope_head_dim, rope_head_dim, out):
    """A flush, then a STAND-IN for vLLM's in-tree ragged Triton prefill (600 rows take minutes in Triton's
    interpreter; the 8-row calls above ran the real one): routescope's torch reference."""
    mid_call.append(flushed_samples())
    in_tree_calls.append(q.shape[0])
    index = SparseIndex(None, None, indices.long(), indptr.long())
    out.copy_(batch.reference(q, kv.unsqueeze(1), index, scale, attn_sink, out.shape[-1]).to(out.dtype))


ops._rocm_sparse_attn_prefill_ragged_triton = flush_then_in_tree_stand_in
direct(600, 512, 6, heads=4)
declined = {"mid_call": mid_call, "after": flushed_samples(), "mismatches": obs.status()["mismatches"],
            "stand_in_calls": list(stand_in_calls), "in_tree_calls": in_tree_calls}
emit(state=state, sites=wrapped_sites(modules), errs=errs, stand_in_calls=seen["stand_in_calls"],
     samples=seen["samples"], mismatches=seen["mismatches"], errors=dict(obs.errors), policy=obs.policy.to_dict(),
     declined=declined)
