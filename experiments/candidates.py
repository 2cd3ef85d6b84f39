"""Arm B's routing: advise's candidate as a kernel per call, which calls are eligible, and which are never moved.

Arm A is the active policy (the Dispatcher's own decision). Arm B is one of advise's candidates (``advise.policies``):
a gfx942 or gfx950 gate (``decide`` with another threshold), ``split_below_N`` (prefill-entry calls under N rows to
the split-K decode kernel), ``decodes_split_k`` (the guard rerouting pure decodes), or ``aa`` (B runs A's kernel:
the control that measures the experiment's own noise and cost).
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum

from advise.policies import Candidate, Target, describe_policy
from dispatcher.platform import Platform
from dispatcher.policy import DecisionCache, Policy
from dispatcher.types import PREFILL_KERNELS, CallClass, CallShape, Decision, GuardMode, Kernel

from .config import ExperimentConfig


class NotMoved(str, Enum):
    """Why an eligible call stays on A whatever its draw; each is counted (``never_moved`` in the report)."""

    CAPTURE = "capture"  # inside a CUDA graph capture: the graph fixes the kernel
    UNAVAILABLE = "candidate_unavailable"  # B's kernel cannot run here (no implementation, AITER missing, OPUS declines)
    GUARD = "guard_refusal"  # the guard refuses the call (mode raise) under either arm
    BATCH_INVARIANT = "batch_invariant"  # VLLM_BATCH_INVARIANT: every call keeps its kernel
    DECODE_ON_PREFILL = "decode_on_prefill"  # B would send decode rows onto a prefill kernel A does not use
    STOPPED = "not_running"  # the experiment has stopped or finished

    def __str__(self) -> str:
        return self.value


class StartRefused(ValueError):
    """An experiment that cannot start as configured; the message says why and what to change."""


def candidate_of(config: ExperimentConfig, platform: Platform, active: Policy) -> Candidate:
    """The config's arm B as advise's ``Candidate`` on this platform."""
    name, threshold = config.candidate, config.threshold
    target = Target(platform.arch, platform, "gfx942_min_rows" if name.startswith("gfx942_") else
                    "gfx950_min_rows" if name.startswith("gfx950_") else None)
    if name == "aa":
        return Candidate("aa", "active", "A/A: " + describe_policy(active, target), active)
    if name == "decodes_split_k":
        p = replace(active, guard=GuardMode.REROUTE, name=name)
        return Candidate(name, "guard", "decodes to split-K: " + describe_policy(p, target), p)
    if name.startswith("split_below_"):
        return Candidate(name, "gate", describe_policy(active, target, threshold or 0), active, threshold,
                         split_below=threshold or 0)
    p = replace(active, name=name, **{target.gate_field: threshold})  # type: ignore[arg-type]
    return Candidate(name, "gate", describe_policy(p, target), p, threshold)


class ArmRouter:
    """B's kernel for a call the active policy decided; pure given the platform, the policy and the config."""

    def __init__(self, config: ExperimentConfig, platform: Platform, active: Policy) -> None:
        self.config = config
        self.candidate = candidate_of(config, platform, active)
        self._cache_b = DecisionCache(platform, self.candidate.policy)
        self._aa_cells = {(c.model, c.rows_bucket) for c in config.cells}

    def kernel_b(self, decision: Decision, shape: CallShape) -> Kernel:
        """The kernel arm B runs for this call (A's own when the arms agree)."""
        cand = self.candidate
        if cand.name == "aa":
            return decision.kernel
        if cand.split_below:
            if decision.kernel in PREFILL_KERNELS and shape[0] < cand.split_below:
                return Kernel.INTREE_SPARSE_DECODE
            return decision.kernel
        b = self._cache_b.decide(shape, decision.call_class)
        return decision.kernel if b.refused else b.kernel

    def aa_cell(self, model: str | None, rows_bucket: str, kernel: Kernel) -> bool:
        """Does the aa control run in this cell? (Every prefill-kernel call when it names no cells.)"""
        if not self._aa_cells:
            return kernel in PREFILL_KERNELS
        return (model, rows_bucket) in self._aa_cells or (None, rows_bucket) in self._aa_cells

    def decode_on_prefill(self, decision: Decision, kernel_b: Kernel) -> bool:
        """Would B put this call's decode rows on a prefill kernel that A does not use (the seed's 9x harm)?"""
        return (decision.call_class in (CallClass.MIXED, CallClass.PURE_DECODE) and kernel_b in PREFILL_KERNELS
                and kernel_b is not decision.kernel)


PROBE_ROWS = tuple(1 << p for p in range(15))


def refuse_decode_on_prefill(router: ArmRouter, active: DecisionCache) -> None:
    """Refuse to start a candidate that can route decode rows onto a prefill kernel A does not use, unless allowed.

    Looked at on both head layouts, bf16 and fp16, dense and ragged, mixed and pure-decode batches, 1 to 16384 rows.
    """
    if router.config.allow_decode_on_prefill or router.candidate.name == "aa":
        return
    for layout in ((512, 448, 64), (512, 512, 0)):
        for dtype in ("bfloat16", "float16"):
            for ragged in (False, True):
                for cls in (CallClass.MIXED, CallClass.PURE_DECODE):
                    for rows in PROBE_ROWS:
                        shape = CallShape(rows, 16, *layout, q_dtype=dtype, kv_dtype=dtype, ragged=ragged)
                        a = active.decide(shape, cls)
                        b = router.kernel_b(a, shape)
                        if not a.refused and router.decode_on_prefill(a, b):
                            raise StartRefused(
                                f"candidate {router.candidate.name} would send decode rows onto a prefill kernel "
                                f"({cls.value} batch of {rows} rows: {a.kernel.value} under A, {b.value} under B; "
                                "the seed's 9x slower decodes); set allow_decode_on_prefill to run it anyway, or "
                                "pick a candidate that keeps decode rows where they are")
