"""Candidate policies and where each sends the observed calls, decided by ``dispatcher.policy.decide``. Pure.

A target is the arch a latency table prices. On gfx942 (and gfx950) a gate is the AITER
branch's row threshold, and candidates are ``decide``'s own policies with another threshold.
Elsewhere (an H200: no AITER) ``decide`` sends every prefill-entry call to the in-tree prefill;
there a gate is the row count below which a call would go to the split-K decode kernel
instead, a rule the dispatcher does not have: advise applies it on top of ``decide``.

Besides gates: "decodes to split-K" (the active gate with the guard rerouting pure decodes),
and the fix the seed's reviewers asked for, decode rows never entering the prefill function
(pure decodes to the decode entry, mixed batches split into a prefill call and a decode call):
the difference to it is what the decode rows in prefill kernels cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from dispatcher.platform import Platform, what_if
from dispatcher.policy import Policy, decide
from dispatcher.types import PREFILL_KERNELS, Batch, CallClass, CallShape, GuardMode, Kernel

from .traffic import Traffic, TrafficEntry, bucket_bounds

SPLIT_K = Kernel.INTREE_SPARSE_DECODE.value
_PREFILL = frozenset(k.value for k in PREFILL_KERNELS)
DEFAULT_GATES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
FIXES = ("fix_pure", "fix_mixed", "fix_all")  # decode rows to the decode entry: pure decodes, mixed, both


@dataclass(frozen=True)
class Target:
    """The arch priced, as a what-if platform with AITER enabled, and which threshold a gate moves there."""

    arch: str
    platform: Platform
    gate_field: str | None  # "gfx942_min_rows", "gfx950_min_rows", or None: gates send small calls to split-K

    @property
    def gate_prefix(self) -> str:
        return self.gate_field.removesuffix("_min_rows") if self.gate_field else "split_below"


def target_for(arch: str) -> Target:
    platform = what_if(arch, aiter=True)
    field = "gfx942_min_rows" if platform.is_gfx942 else "gfx950_min_rows" if platform.is_gfx950 else None
    return Target(arch, platform, field)


@dataclass(frozen=True)
class Candidate:
    """A policy to price: ``decide``'s policy, plus advise's split rule (``split_below``) or a decode fix."""

    name: str
    kind: str  # active, counterfactual, gate, guard, fix
    label: str
    policy: Policy
    gate: int | None = None  # the gate it stands for (rows), for people
    split_below: int = 0  # prefill-entry calls under this many rows go to split-K (targets without AITER)
    fix: str = ""  # one of FIXES


@dataclass(frozen=True, slots=True)
class Launch:
    """Calls of one kernel at ``mean`` rows in the rows bucket [lo, hi] (hi None: open)."""

    kernel: str
    lo: float
    mean: float
    hi: float | None
    calls: int


def _gate_of(policy: Policy, target: Target) -> int | None:
    return getattr(policy, target.gate_field) if target.gate_field else None


def describe_policy(policy: Policy, target: Target, split_below: int = 0) -> str:
    guard = f"guard {policy.guard.value}"
    if target.gate_field:
        gate = _gate_of(policy, target)
        return f"{target.gate_prefix} ≥ {gate} rows, {guard}" if gate else f"{target.gate_prefix}: no row gate, {guard}"
    if split_below:
        return f"rows < {split_below} to split-K, {guard}"
    return f"no row gate on {target.arch} (every prefill-entry call on intree.ragged_prefill), {guard}"


def candidates(traffic: Traffic, target: Target, gates: Iterable[int] = DEFAULT_GATES) -> list[Candidate]:
    """The active policy, the counterfactuals that apply on the target, a scan of gates, the guard, the fixes."""
    active = traffic.active
    active_gate = _gate_of(active, target)
    out = [Candidate("active", "active", describe_policy(active, target), active, active_gate)]
    names = {"active"}
    cf_arch = traffic.counterfactual_arch or traffic.platform_arch
    if target.gate_field and cf_arch == target.arch:
        for p in traffic.counterfactuals:
            if p.name not in names and _gate_of(p, target) != active_gate:
                names.add(p.name)
                out.append(Candidate(p.name, "counterfactual", describe_policy(p, target), p, _gate_of(p, target)))
    seen = {c.gate for c in out}
    for g in sorted(set(gates)):
        name = f"{target.gate_prefix}_{g}"
        if name in names or (target.gate_field and g in seen):
            continue
        names.add(name)
        if target.gate_field:
            p = replace(active, name=name, **{target.gate_field: g})
            out.append(Candidate(name, "gate", describe_policy(p, target), p, g))
        else:
            out.append(Candidate(name, "gate", describe_policy(active, target, g), active, g, split_below=g))
    if active.guard is not GuardMode.REROUTE:
        p = replace(active, guard=GuardMode.REROUTE, name="decodes_split_k")
        out.append(Candidate("decodes_split_k", "guard", "decodes to split-K: " + describe_policy(p, target), p,
                             active_gate))
    for fix, what in zip(FIXES, ("pure decodes", "decode rows of mixed batches", "all decode rows")):
        out.append(Candidate(fix, "fix", f"{what} to the decode entry (split-K), the rest as active", active,
                             active_gate, fix=fix))
    return out


def _call_class(value: str) -> CallClass:
    try:
        return CallClass(value)
    except ValueError:
        return CallClass.UNKNOWN


def _layout(layout: str) -> tuple[int, int]:
    nope, _, rope = layout.partition("+")
    return int(nope), int(rope or 0)


def decided_kernel(entry: TrafficEntry, rows: float, call_class: CallClass, policy: Policy, target: Target,
                   split_below: int = 0) -> str:
    """``decide``'s kernel for a call of this entry's shape at ``rows`` on the target, then the split rule."""
    nope, rope = _layout(entry.layout)
    shape = CallShape(rows=int(rows), head_dim=nope + rope, nope_head_dim=nope, rope_head_dim=rope,
                      q_dtype=entry.q_dtype, kv_dtype=entry.kv_dtype, topk=entry.topk)
    kernel = decide(shape, target.platform, policy, Batch(call_class)).kernel.value
    if split_below and kernel in _PREFILL and rows < split_below:
        return SPLIT_K
    return kernel


def straddles(entry: TrafficEntry, cand: Candidate, target: Target) -> int | None:
    """The candidate's threshold when it falls inside the entry's rows bucket (the aggregates cannot split it)."""
    lo, hi = bucket_bounds(entry.rows_bucket)
    for t in (cand.split_below, _gate_of(cand.policy, target) or 0):
        if t and lo < t and (hi is None or t <= hi):
            return t
    return None


def launches(entry: TrafficEntry, cand: Candidate, target: Target, *, recorded: bool) -> tuple[Launch, ...]:
    """Where ``cand`` sends this entry's calls. ``recorded``: the active policy's kernel is the one that ran."""
    lo, hi = bucket_bounds(entry.rows_bucket)
    mean, n = entry.mean_rows, entry.calls
    cls = _call_class(entry.call_class)
    if cand.fix and entry.kernel in _PREFILL and entry.decode_rows and (
            (cls is CallClass.PURE_DECODE and cand.fix in ("fix_pure", "fix_all"))
            or (cls is CallClass.MIXED and cand.fix in ("fix_mixed", "fix_all"))):
        if cls is CallClass.PURE_DECODE:
            return (Launch(SPLIT_K, lo, mean, hi, n),)
        d = entry.mean_decode_rows
        rest = mean - d
        kernel = decided_kernel(entry, rest, CallClass.PREFILL, cand.policy, target)
        return (Launch(kernel, rest, rest, rest, n), Launch(SPLIT_K, d, d, d, n))
    if recorded and cand.kind in ("active", "fix"):
        return (Launch(entry.kernel, lo, mean, hi, n),)
    kernel = decided_kernel(entry, lo if lo > 0 else mean, cls, cand.policy, target, cand.split_below)
    return (Launch(kernel, lo, mean, hi, n),)

