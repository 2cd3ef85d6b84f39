"""On a what-if gfx950 (the plugin's platform; vLLM itself runs on this CPU): vLLM declining OPUS without
calling its getter, vLLM's gate passing with the getter returning None, a flush in the middle of a call,
and a call vLLM raises on. Telemetry exports through a multiprocess directory, as in a worker."""

from __future__ import annotations

import importlib
import os

import torch

from dispatcher import what_if
from telemetry.multiproc.reader import multiprocess_registry
from tests.vllm_real.inside import batch
from tests.vllm_real.inside.common import OPS, emit, metric_samples, observer

ops = importlib.import_module(OPS)
# What-if: vLLM's OPUS threshold lowered from 1024 rows to 8, so the calls stay small in Triton's
# interpreter; the plugin reads vLLM's constant, vLLM's gate reads the same global at every call.
ops._GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES = 8
from routescope.vllm import plugin  # noqa: E402

state = plugin.install(env=os.environ, platform=what_if("gfx950"))
MP = os.environ["ROUTESCOPE_TELEMETRY_MULTIPROC_DIR"]


def exported() -> list:
    """Flush, then read the multiprocess directory as a scrape would."""
    observer().telemetry.flush()
    return metric_samples(multiprocess_registry(MP))


mid_call: list = []
in_tree = ops._rocm_sparse_attn_prefill_ragged_triton


def flush_then_in_tree(*args, **kwargs):
    """vLLM's in-tree ragged prefill, after a flush: what a scrape sees while a call is running."""
    mid_call.append(exported())
    return in_tree(*args, **kwargs)


def call(rows: int, heads: int, seed: int, q2d: bool = False) -> str | None:
    """A call OPUS-eligible by the plugin's policy: fp16, output of all lanes, an fp32 sink, ragged."""
    q, kv, g = batch.inputs(rows, heads, 576, 32, torch.float16, seed)
    out = torch.zeros_like(q)
    idx, ptr = batch.ragged(rows, 32, 4, g)
    try:
        ops.rocm_sparse_attn_prefill(q.flatten(1) if q2d else q, kv, None, None, 576 ** -0.5, 576, 512, 64,
                                     torch.randn(heads, generator=g), out, idx, ptr)
    except Exception as exc:  # noqa: BLE001 - the call vLLM raised on
        return type(exc).__name__
    return None


# 0. a call vLLM raises on (a 2-D q: vLLM's in-tree path cannot unpack its shape), before any call of the
#    in-tree kernel has finished in this process, so telemetry has no impl of that kernel to fall back on
raised = call(3, 2, 4, q2d=True)
after_raise = exported()
ops._rocm_sparse_attn_prefill_ragged_triton = flush_then_in_tree
# 1. vLLM's real gate declines (this CPU is no gfx950; q is not on a GPU): the getter is never called
call(8, 2, 1)
call(8, 2, 2)
declined = {"mid_call": mid_call[:2], "after": exported(), "mismatches": observer().status()["mismatches"]}
# 2. a STAND-IN for vLLM's gate as a gfx950 GPU would answer it (the real one needs q.is_cuda): vLLM then
#    calls its real getter, which returns None here (AITER MLA is not available), and falls through
real_gate = ops._can_use_aiter_sparse_prefill_opus
ops._can_use_aiter_sparse_prefill_opus = lambda q, kv, attn_sink, output, on_gfx950=True: True
call(8, 4, 3)
symbol = {"mid_call": mid_call[2:3], "after": exported(), "getter": ops._get_aiter_sparse_prefill_opus.__wrapped__()}
emit(state=state, declined=declined, symbol=symbol, raised=raised, after_raise=after_raise,
     errors=dict(observer().errors))
