"""The A/B check of ``advise``: replay the demo's traffic under two gates, time each arm, compare with the prediction.

The calls are the demo's (workloads/traffic.py: DeepSeek-V4.1 and GLM-5.3 with the GLM
decode bug, so decode rows reach the prefill entry), sampled evenly over one cycle of its
scenarios. Arm A routes them as the active policy does on this device, arm B as the advised
gate does (rows under the gate to the split-K decode kernel). Both arms launch the project's
own kernels on the same operands. On a CUDA GPU each call's kernel time comes from CUPTI
(torch.profiler: first kernel start to last kernel end) with the sweep's protocol (L2 flushed
and the GPU held before each call), so the table and the replay time calls alike. On a CPU
the host clock times torch kernels at the demo's scaled shapes: that checks the plumbing only.

The prediction is ``advise``'s, from the replayed calls aggregated as telemetry would
aggregate them (rows buckets, mean rows), priced by each table asked for: a shipped one
(``h200``), a sweep JSON, or ``fresh``, a sweep run here first at the replay's shapes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.registry import default_registry
from dispatcher.policy import Policy
from dispatcher.pools import pool_bucket, pool_bytes
from dispatcher.sweep.inputs import topk_indices
from dispatcher.types import CallClass, Kernel
from workloads.scale import ScaledShape, scaled
from workloads.traffic import DEMO_MODELS, CallSpec, traffic

from .policies import Target, decided_kernel, target_for
from .traffic import ObservedCall, Traffic, TrafficEntry, aggregate

FULL_KV_POOL = 16384  # slots: the sweep's largest default pool (max(rows, 4 x top-k)), inside an H200's L2


def sample_cycle(seed: int, calls: int, *, glm_bug: bool = True, max_steps: int = 200_000) -> list[CallSpec]:
    """``calls`` prefill-entry calls spread evenly over one cycle of the demo's scenarios (every model's)."""
    cycle: list[CallSpec] = []
    last = {m.name: 0 for m in DEMO_MODELS}
    wrapped: set[str] = set()
    for i, spec in enumerate(traffic(seed, glm_bug=glm_bug)):
        if spec.scenario < last[spec.model]:
            wrapped.add(spec.model)
        last[spec.model] = spec.scenario
        if len(wrapped) == len(last) or i >= max_steps:
            break
        if spec.model not in wrapped and spec.entry == "prefill":
            cycle.append(spec)
    if calls >= len(cycle):
        return cycle
    stride = len(cycle) / calls
    return [cycle[int(i * stride)] for i in range(calls)]


@dataclass(frozen=True)
class Arm:
    """One side of the A/B: a policy and, where the target has no AITER gate, the split rule."""

    name: str
    policy: Policy
    split_below: int = 0


def _entry_like(shape: ScaledShape) -> TrafficEntry:
    layout = f"{shape.nope_head_dim}+{shape.rope_head_dim}"
    return TrafficEntry(model=shape.model, kernel="", rows_bucket="1", call_class="prefill", topk=shape.topk,
                        layout=layout, q_dtype="bfloat16", kv_dtype="bfloat16", calls=0, rows=0)


def route(spec: CallSpec, shape: ScaledShape, arm: Arm, target: Target) -> str:
    """The kernel ``arm`` sends this call to on ``target``."""
    return decided_kernel(_entry_like(shape), spec.rows, CallClass(spec.kind), arm.policy, target, arm.split_below)


def observed(specs: Sequence[CallSpec], shapes: dict[str, ScaledShape], arm: Arm, target: Target,
             kv_slots: int | None = None) -> list[ObservedCall]:
    """The calls as telemetry would see them under ``arm`` (the traffic advise is given); with ``kv_slots``, each
    labelled with its model's pool of that many slots, as telemetry labels it (``kv_pool_bytes``)."""
    out = []
    for s in specs:
        sh = shapes[s.model]
        d = sh.nope_head_dim + sh.rope_head_dim
        pool = pool_bucket(pool_bytes(kv_slots, d, 2)) if kv_slots else None  # the replay's pools are bf16
        out.append(ObservedCall(s.model, route(s, sh, arm, target), s.rows, s.kind, s.decode_rows, sh.topk,
                                f"{sh.nope_head_dim}+{sh.rope_head_dim}", kv_pool_bytes=pool))
    return out


def replay_traffic(specs: Sequence[CallSpec], shapes: dict[str, ScaledShape], arm: Arm, target: Target,
                   kv_slots: int | None = None) -> Traffic:
    thresholds = (arm.policy.gfx942_min_rows, arm.policy.gfx950_min_rows)
    entries = aggregate(observed(specs, shapes, arm, target, kv_slots), thresholds)
    return Traffic(entries, target.arch, arm.policy, source="the replayed calls", span_note="a replay: no span")


class Operands:
    """One model's operands at the largest rows any call needs; each call launches on leading slices."""

    def __init__(self, shape: ScaledShape, max_rows: int, kv_pool: int, device: torch.device, seed: int) -> None:
        gen = torch.Generator(device=device).manual_seed(seed)
        h, d = shape.heads, shape.nope_head_dim + shape.rope_head_dim
        self.q = torch.randn((max_rows, h, d), device=device, generator=gen).to(torch.bfloat16)
        self.kv = torch.randn((kv_pool, 1, d), device=device, generator=gen).to(torch.bfloat16)
        self.indices = topk_indices(max_rows, shape.topk, kv_pool, device, gen)
        self.out = torch.empty((max_rows, h, shape.nope_head_dim), device=device, dtype=torch.bfloat16)
        self.scale = d ** -0.5

    def args(self, rows: int) -> KernelArgs:
        return KernelArgs(self.q[:rows], self.kv, SparseIndex(self.indices[:rows], None), self.scale, None,
                          self.out[:rows])


@dataclass
class ArmTimes:
    """Per-call seconds of one arm, one list per repeat."""

    runs: list[list[float]] = field(default_factory=list)

    def per_call(self) -> list[float]:
        """Each call's median over the repeats."""
        return [statistics.median(col) for col in zip(*self.runs)]


def launchers(specs: Sequence[CallSpec], kernels: Sequence[str], ops: dict[str, Operands],
              device: torch.device) -> list[Callable[[], object]]:
    registry = default_registry()
    impls = {k: registry.resolve(Kernel(k), device.type) for k in set(kernels)}
    return [lambda s=s, k=k: impls[k].launch(ops[s.model].args(s.rows)) for s, k in zip(specs, kernels)]


def time_calls(calls: Sequence[Callable[[], object]], device: torch.device) -> list[float]:
    """Seconds of each call: CUPTI kernel time under the sweep's protocol on CUDA, the host clock elsewhere."""
    if device.type != "cuda":
        out = []
        for call in calls:
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
        return out
    from torch.profiler import ProfilerActivity, profile, record_function

    from dispatcher.sweep.cupti import call_name, call_seconds, spans
    from dispatcher.sweep.timing import GpuTimer

    timer = GpuTimer(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timer._run(list(calls), len(calls), lambda i: record_function(call_name(i)))  # noqa: SLF001 - its protocol
    seconds = call_seconds(spans(prof.events()))
    missing = [i for i in range(len(calls)) if i not in seconds]
    if missing:
        raise RuntimeError(f"the profiler recorded no GPU range for {len(missing)} of {len(calls)} calls "
                           f"(first: call {missing[0]}); kernel time needs CUPTI's CUDA activity")
    return [seconds[i] for i in range(len(calls))]


def measure(arms: dict[str, list[Callable[[], object]]], device: torch.device, repeats: int) -> dict[str, ArmTimes]:
    """One untimed pass of each arm (kernels compile), then ``repeats`` timed passes, arms interleaved."""
    for calls in arms.values():
        for call in calls:
            call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out = {name: ArmTimes() for name in arms}
    for _ in range(repeats):
        for name, calls in arms.items():
            out[name].runs.append(time_calls(calls, device))
    return out


def shapes_for(device: torch.device) -> dict[str, ScaledShape]:
    """The demo models at full shape on a GPU, scaled down (as the CPU demo runs them) elsewhere."""
    return {m.name: scaled(m, full=device.type == "cuda") for m in DEMO_MODELS}


def device_target(device: torch.device) -> Target:
    """The routing target of this device: its arch as detected (sm90 on an H200), or cpu."""
    if device.type != "cuda":
        return target_for("cpu")
    from dispatcher.platform import detect

    return target_for(detect().arch)
