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
from tests.vllm_real.inside.common import OPS, emit, install_amdsmi_stand_in, metric_samples, observer

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


def seed_with_b(positions: list[tuple[int, int]], at_least: int) -> int:
    """A seed whose draws put the first of these positions on B and ``at_least`` of them in all, so a few
    interpreted calls exercise arm B (the assignment is the experiment's pure function of seed and position)."""
    for seed in range(100_000):
        draws = [uniform(seed, STREAM_ARM, step, index) < FRACTION for step, index in positions]
        if draws[0] and sum(draws) >= at_least:
            return seed
    raise LookupError("no seed")


def direct_positions(calls: int) -> list[tuple[int, int]]:
    """The next ``calls`` positions of direct calls (no forward context: they count on in the last step)."""
    step, index = observer().batch_reader.position
    return [(step, index + 1 + i) for i in range(calls)]


def direct_call(i: int, rows: int, heads: int = 2, nope: int = 512, rope: int = 64) -> float:
    """One direct call of vLLM's entry (ragged, fp16, a sink, all lanes out); its largest error from the reference."""
    d = nope + rope
    q, kv, g = batch.inputs(rows, heads, d, 32, torch.float16, 50 + i)
    out = torch.full_like(q, 7.0)
    idx, ptr = batch.ragged(rows, 32, 4, g)
    sink = torch.randn(heads, generator=g)
    ops.rocm_sparse_attn_prefill(q, kv, None, None, d ** -0.5, d, nope, rope, sink, out, idx, ptr)
    ref = batch.reference(q, kv, SparseIndex(None, None, idx.long(), ptr.long()), d ** -0.5, sink, d)
    return (out.float() - ref).abs().max().item()


install_amdsmi_stand_in()  # vLLM's backend imports vllm.platforms.rocm, which reads the arch from amdsmi
BACKEND = batch.impl(heads=16)


def decode_step(i: int, rows: int = 4, layers: int = 2) -> float:
    """One GLM-style pure-decode step through vLLM's backend (two layers): vLLM sends it to the prefill entry (its
    split count is 1 for 32-slot sequences); the largest error of the last layer's output from the reference."""
    q, kv, g = batch.inputs(rows, 16, 512, 32, torch.float16, 80 + i)
    index = batch.ragged(rows, 32, 4, g)
    meta = batch.metadata(decodes=rows, decode_tokens=rows, prefills=0, tokens=rows, max_query_len=1, max_seq_len=32)
    out = batch.forward(BACKEND, meta, q, kv, index, layers=layers)
    ref = batch.reference(q, kv, SparseIndex(None, None, index[0].long(), index[1].long()), 512 ** -0.5, None, 512)
    return (out.float() - ref).abs().max().item()


def experiment(config: ExperimentConfig, calls: list) -> dict:
    """Run ``calls`` (no-argument functions, each returning an error) while ``config`` runs from the directory: what
    the router did during each, the errors, this process's view and the directory's."""
    control.start(MP, config)
    router.registry.flush()
    picked_up = router.chooser is not None
    runs, errs = [], []
    for call in calls:
        before = dict(router.routed)
        errs.append(call())
        runs.append({k: v - before.get(k, 0) for k, v in router.routed.items() if v != before.get(k, 0)})
    router.registry.flush()
    (mine,) = [v for v in router.registry.views() if v["id"] == config.id]
    shared = [v for v in control.experiments(MP) if v["id"] == config.id]
    control.stop(MP, config.id)
    router.registry.flush()
    return {"picked_up": picked_up, "runs": runs, "errs": errs, "view": mine, "directory_view": shared,
            "seed": config.seed}


def config(name: str, candidate: str, positions: list, at_least: int) -> ExperimentConfig:
    return ExperimentConfig(id=name, candidate=candidate, fraction=FRACTION, seed=seed_with_b(positions, at_least))


# 3a. gfx950_4: OPUS for 4-7 rows; vLLM's arch flag _ON_GFX950 is False on this CPU, so B cannot run: never moved
at = direct_positions(2)
unavailable = experiment(config("opus4", "gfx950_4", at, 1), [lambda i=i: direct_call(i, 6) for i in range(2)])
# 3b. split_below_16: calls under 16 rows to vLLM's split-K decode (rocm_sparse_attn_decode_bf16), in the interpreter;
#     the cell's first B call is a numerics sample (vLLM's entry into the output, split-K into scratch). DeepSeek-V4's
#     448+64: vLLM's split-K reduce spans nope + rope, a power of two
at = direct_positions(10)
split = experiment(config("split16", "split_below_16", at, 3), [lambda i=i: direct_call(i, 8, nope=448)
                                                                 for i in range(10)])
split.update(positions=at, samples=exported())
# 3c. aa: the active kernel (vLLM's in-tree ragged prefill) on both arms, B's launched by the plugin
at = direct_positions(6)
aa = experiment(config("aa", "aa", at, 2), [lambda i=i: direct_call(i, 8, nope=448) for i in range(6)])
aa["positions"] = at
# 3d. decodes_split_k: pure decodes reaching the prefill entry through vLLM's backend, in real forward contexts:
#     positions are (step, layer), steps counted from vLLM's ForwardContext
step = observer().batch_reader.step
at = [(step + 1 + k, layer) for k in range(5) for layer in range(2)]
decodes = experiment(config("dsk", "decodes_split_k", at, 2), [lambda i=i: decode_step(i) for i in range(5)])
decodes.update(positions=at, samples=exported())
emit(state=state, declined=declined, symbol=symbol, raised=raised, after_raise=after_raise,
     errors=dict(observer().errors), routing=router.status(),
     experiments={"unavailable": unavailable, "split": split, "aa": aa, "decodes": decodes})
