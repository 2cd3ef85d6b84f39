"""On a what-if gfx950 (the plugin's platform; vLLM itself runs on this CPU): vLLM declining OPUS without
calling its getter, vLLM's gate passing with the getter returning None, a flush in the middle of a call,
and a call vLLM raises on. Telemetry exports through a multiprocess directory, as in a worker. Then two
experiments from that directory: gfx950_4 (B cannot run here: never moved) and split_below_16 (B is vLLM's
split-K decode, routed by the plugin)."""

from __future__ import annotations

import importlib
import os

import torch

from dispatcher import what_if
from dispatcher.kernels.common import SparseIndex
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
ops._can_use_aiter_sparse_prefill_opus, ops._rocm_sparse_attn_prefill_ragged_triton = real_gate, in_tree

# 3. experiments, started as `routescope experiment start --multiproc-dir` starts one: a config in the directory,
#    which this process's registry picks up at its flush. The arms are vLLM's own functions on this CPU.
from experiments import control  # noqa: E402
from experiments.assignment import STREAM_ARM, uniform  # noqa: E402
from experiments.config import ExperimentConfig  # noqa: E402

router = observer().router
FRACTION = 0.1


def seed_with_b(calls: int, at_least: int) -> int:
    """A seed whose draws at the next ``calls`` positions (no forward context: step 0) put the first on B and
    ``at_least`` in all on B, so a few interpreted calls exercise arm B."""
    step, index = observer().batch_reader.position
    for seed in range(100_000):
        draws = [uniform(seed, STREAM_ARM, step, index + 1 + i) < FRACTION for i in range(calls)]
        if draws[0] and sum(draws) >= at_least:
            return seed
    raise LookupError("no seed")


def experiment(config: ExperimentConfig, rows: int, calls: int, heads: int = 2, nope: int = 512,
               rope: int = 64) -> dict:
    """``calls`` direct calls of vLLM's entry while ``config`` runs: what each call's arms did, and the views."""
    d = nope + rope
    control.start(MP, config)
    router.registry.flush()
    picked_up = router.chooser is not None
    runs, errs = [], []
    for i in range(calls):
        before = dict(router.routed)
        q, kv, g = batch.inputs(rows, heads, d, 32, torch.float16, 50 + i)
        out = torch.full_like(q, 7.0)
        idx, ptr = batch.ragged(rows, 32, 4, g)
        sink = torch.randn(heads, generator=g)
        ops.rocm_sparse_attn_prefill(q, kv, None, None, d ** -0.5, d, nope, rope, sink, out, idx, ptr)
        ref = batch.reference(q, kv, SparseIndex(None, None, idx.long(), ptr.long()), d ** -0.5, sink, d)
        errs.append((out.float() - ref).abs().max().item())
        runs.append([k for k, v in router.routed.items() if v != before.get(k, 0)])
    router.registry.flush()
    (mine,) = [v for v in router.registry.views() if v["id"] == config.id]
    shared = [v for v in control.experiments(MP) if v["id"] == config.id]
    control.stop(MP, config.id)
    router.registry.flush()
    return {"picked_up": picked_up, "runs": runs, "errs": errs, "view": mine, "directory_view": shared,
            "position_after": list(observer().batch_reader.position)}


# 3a. gfx950_4: OPUS for 4-7 rows; vLLM's arch flag _ON_GFX950 is False on this CPU, so B cannot run: never moved
unavailable = experiment(ExperimentConfig(id="opus4", candidate="gfx950_4", fraction=FRACTION,
                                          seed=seed_with_b(2, 1)), rows=6, calls=2)
# 3b. split_below_16: calls under 16 rows to vLLM's split-K decode (rocm_sparse_attn_decode_bf16), in the interpreter;
#     the cell's first B call is a numerics sample (vLLM's entry into the output, split-K into scratch)
split_seed = seed_with_b(10, 3)
split_start = list(observer().batch_reader.position)
split = experiment(ExperimentConfig(id="split16", candidate="split_below_16", fraction=FRACTION, seed=split_seed),
                   rows=8, calls=10, nope=448)  # DeepSeek-V4's 448+64: vLLM's split-K reduce spans nope + rope
split.update(seed=split_seed, position_before=split_start, samples=exported())
emit(state=state, declined=declined, symbol=symbol, raised=raised, after_raise=after_raise,
     errors=dict(observer().errors), experiments={"unavailable": unavailable, "split": split},
     routing=router.status())
