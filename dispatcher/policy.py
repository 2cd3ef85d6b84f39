"""The routing rule itself: a pure ``decide(call, platform, policy)`` with a readable gate trace.

Branch order follows vLLM's ``rocm_sparse_attn_prefill`` (docs/kernels.md): the gfx950 OPUS
attempt, then the gfx942 ``pa_prefill_sparse`` gate of the seed PR, then the in-tree kernel.
Nothing here touches a tensor, the environment or a global.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .platform import Platform
from .types import (
    PREFILL_KERNELS,
    UNKNOWN_BATCH,
    Batch,
    CallClass,
    CallShape,
    Decision,
    Gate,
    GuardMode,
    Kernel,
)

HALF_DTYPES = frozenset({"float16", "bfloat16"})
DEFAULT_GFX942_MIN_ROWS = 512  # _GFX942_AITER_PA_PREFILL_SPARSE_MIN_QUERIES
DEFAULT_GFX950_MIN_ROWS = 1024  # _GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES


@dataclass(frozen=True, slots=True)
class Policy:
    """Gate thresholds and the decode guard; ``name`` labels it among counterfactual policies."""

    gfx942_min_rows: int = DEFAULT_GFX942_MIN_ROWS
    gfx950_min_rows: int = DEFAULT_GFX950_MIN_ROWS
    guard: GuardMode = GuardMode.OBSERVE
    spec_tokens: int = 0  # a request with query length <= 1 + spec_tokens is a decode
    name: str = "active"
    thresholds: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for label, value in (("gfx942_min_rows", self.gfx942_min_rows), ("gfx950_min_rows", self.gfx950_min_rows)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{label} must be a non-negative integer; got {value!r}")
        if not isinstance(self.spec_tokens, int) or self.spec_tokens < 0:
            raise ValueError(f"spec_tokens must be a non-negative integer; got {self.spec_tokens!r}")
        object.__setattr__(self, "guard", GuardMode(self.guard))
        object.__setattr__(
            self, "thresholds", tuple(sorted({self.gfx942_min_rows, self.gfx950_min_rows} - {0}))
        )

    @property
    def decode_max_query_len(self) -> int:
        return 1 + self.spec_tokens

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "gfx942_min_rows": self.gfx942_min_rows,
            "gfx950_min_rows": self.gfx950_min_rows,
            "guard": self.guard.value,
            "spec_tokens": self.spec_tokens,
        }


POLICY_FIELDS = frozenset({"gfx942_min_rows", "gfx950_min_rows", "guard", "spec_tokens"})


def policy_from(source: object) -> Policy:
    """A Policy from any object carrying the policy fields (settings, an explain request)."""
    return Policy(**{name: getattr(source, name) for name in POLICY_FIELDS})


class PolicySettings(BaseSettings):
    """The active policy from ROUTESCOPE_* environment variables (read when called, never at import)."""

    model_config = SettingsConfigDict(env_prefix="ROUTESCOPE_", extra="ignore")

    gfx942_min_rows: int = Field(DEFAULT_GFX942_MIN_ROWS, ge=0)
    gfx950_min_rows: int = Field(DEFAULT_GFX950_MIN_ROWS, ge=0)
    guard: GuardMode = GuardMode.OBSERVE
    spec_tokens: int = Field(0, ge=0)

    def policy(self, **overrides: object) -> Policy:
        values = self.model_dump()
        values.update({k: v for k, v in overrides.items() if v is not None})
        return Policy(**values)


def _dtype_gate(name: str, dtype: str, allowed: frozenset[str]) -> Gate:
    ok = dtype in allowed
    return Gate(name, ok, f"{dtype} {'in' if ok else 'not in'} {{{', '.join(sorted(allowed))}}}")


def _eq_gate(name: str, left_name: str, left: str, right_name: str, right: str) -> Gate:
    ok = left == right
    return Gate(name, ok, f"{left_name} {left} {'==' if ok else '!='} {right_name} {right}")


def _rows_gate(name: str, rows: int, minimum: int) -> Gate:
    ok = rows >= minimum
    return Gate(name, ok, f"rows {'>=' if ok else '<'} {minimum}")


def _gfx950_gates(call: CallShape, platform: Platform, policy: Policy) -> list[Gate]:
    arch = Gate("gfx950.arch", platform.is_gfx950, f"arch {platform.arch}")
    if not arch.passed:
        return [arch]
    q = call.q_dtype
    gates = [
        arch,
        Gate(
            "gfx950.aiter_mla_enabled",
            platform.aiter_enabled and platform.aiter_mla_enabled,
            f"VLLM_ROCM_USE_AITER={int(platform.aiter_enabled)} "
            f"VLLM_ROCM_USE_AITER_MLA={int(platform.aiter_mla_enabled)}",
        ),
        _rows_gate("gfx950.min_rows", call.rows, policy.gfx950_min_rows),
        _dtype_gate("gfx950.q_dtype", q, HALF_DTYPES),
        _eq_gate("gfx950.kv_dtype", "kv", call.kv_dtype, "q", q),
        _eq_gate("gfx950.out_dtype", "output", call.effective_out_dtype, "q", q),
        Gate("gfx950.same_device", call.same_device, "q, kv, indices, output on one device"),
        Gate("gfx950.unit_last_stride", call.unit_last_stride, "last-dim stride 1"),
        Gate("gfx950.out_strides", call.out_strides_match_q, "output strides equal q's"),
        Gate(
            "gfx950.sink",
            call.sink_ok,
            "sink [H] fp32" if call.sink_ok else ("sink not [H] fp32" if call.has_sink else "no sink"),
        ),
    ]
    if platform.opus_importable is False:
        gates.append(Gate("gfx950.symbol", False, "aiter pa_sparse_prefill_opus not importable"))
    return gates


def _gfx942_gates(call: CallShape, platform: Platform, policy: Policy) -> list[Gate]:
    arch = Gate("gfx942.arch", platform.is_gfx942, f"arch {platform.arch}")
    if not arch.passed:
        return [arch]
    return [
        arch,
        Gate("gfx942.aiter_enabled", platform.aiter_enabled, f"VLLM_ROCM_USE_AITER={int(platform.aiter_enabled)}"),
        _dtype_gate("gfx942.q_dtype", call.q_dtype, HALF_DTYPES),
        _eq_gate("gfx942.kv_dtype", "kv", call.kv_dtype, "q", call.q_dtype),
        _rows_gate("gfx942.min_rows", call.rows, policy.gfx942_min_rows),
    ]


def _first_failure(gates: list[Gate]) -> Gate | None:
    return next((g for g in gates if not g.passed), None)


def _code(gate: Gate) -> str:
    """gfx942.min_rows -> gfx942_min_rows: the reason label for a declined gate."""
    return gate.name.replace(".", "_")


def _route(call: CallShape, platform: Platform, policy: Policy) -> Decision:
    trace: list[Gate] = []
    g950 = _gfx950_gates(call, platform, policy)
    trace += g950
    if _first_failure(g950) is None:
        return Decision(
            Kernel.AITER_OPUS,
            f"gfx950 OPUS gate passed (rows >= {policy.gfx950_min_rows})",
            "gfx950_opus",
            tuple(trace),
            "gfx950_opus",
        )
    g942 = _gfx942_gates(call, platform, policy)
    trace += g942
    failed942 = _first_failure(g942)
    if failed942 is None:
        return Decision(
            Kernel.AITER_PA_PREFILL_SPARSE,
            f"gfx942 gate passed (rows >= {policy.gfx942_min_rows})",
            "gfx942_pa_prefill_sparse",
            tuple(trace),
            "gfx942_pa",
        )
    layout = "ragged indices" if call.ragged else "dense indices"
    trace.append(Gate("intree.fallback", True, f"in-tree ragged prefill from {layout}"))
    declined = failed942 if g942[0].passed else (_first_failure(g950) if g950[0].passed else None)
    if declined is None:
        return Decision(
            Kernel.INTREE_RAGGED_PREFILL,
            f"in-tree: no AITER branch for arch {platform.arch}",
            "arch_not_gated",
            tuple(trace),
        )
    return Decision(
        Kernel.INTREE_RAGGED_PREFILL,
        f"in-tree: {declined.name} declined ({declined.detail})",
        _code(declined),
        tuple(trace),
    )


def _guard(decision: Decision, call_class: CallClass, policy: Policy) -> Decision:
    trace = list(decision.gates)
    if decision.kernel not in PREFILL_KERNELS or call_class is not CallClass.PURE_DECODE:
        return Decision(
            decision.kernel, decision.reason, decision.reason_code, tuple(trace),
            decision.branch, call_class,
        )
    mode = policy.guard
    trace.append(Gate("guard.pure_decode", False, f"pure-decode batch reached {decision.kernel}; mode {mode}"))
    if mode is GuardMode.REROUTE:
        return Decision(
            Kernel.INTREE_SPARSE_DECODE,
            f"guard rerouted a pure-decode batch from {decision.kernel} to split-K decode",
            "guard_rerouted_pure_decode",
            tuple(trace),
            "guard",
            call_class,
            rerouted_from=decision.kernel,
        )
    return Decision(
        decision.kernel, decision.reason, decision.reason_code, tuple(trace),
        decision.branch, call_class, refused=mode is GuardMode.RAISE,
    )


def decide(
    call: CallShape,
    platform: Platform,
    policy: Policy,
    batch: Batch = UNKNOWN_BATCH,
) -> Decision:
    """Route one call. Pure: same inputs, same Decision; the rows matter only against thresholds."""
    return _guard(_route(call, platform, policy), batch.call_class, policy)


def rows_class(rows: int, policy: Policy) -> tuple[bool, ...]:
    """Which side of each threshold ``rows`` falls on: all that ``decide`` reads of the rows."""
    return (rows >= policy.gfx950_min_rows, rows >= policy.gfx942_min_rows)


_ORDINALS = itertools.count()  # Decision.ordinal: unique per process, never reused (next() is atomic)


class DecisionCache:
    """Memoised ``decide`` for one platform and policy: the hot path pays a tuple hash, not the trace.

    Bounded: the key space is (row-free shape) x (rows class) x (call class), small in practice;
    past ``max_entries`` it stops storing and just decides.
    """

    __slots__ = ("platform", "policy", "_cache", "max_entries", "_t950", "_t942")

    def __init__(self, platform: Platform, policy: Policy, *, max_entries: int = 4096) -> None:
        self.platform = platform
        self.policy = policy
        self.max_entries = max_entries
        self._cache: dict[tuple, Decision] = {}
        self._t950 = policy.gfx950_min_rows
        self._t942 = policy.gfx942_min_rows

    def decide(self, call: CallShape, call_class: CallClass = CallClass.UNKNOWN) -> Decision:
        rows = call[0]
        key = (call[1:], rows >= self._t950, rows >= self._t942, call_class)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        decision = decide(call, self.platform, self.policy, Batch(call_class))
        if len(self._cache) < self.max_entries:
            object.__setattr__(decision, "ordinal", next(_ORDINALS))  # fresh, not yet shared: safe to set
            self._cache[key] = decision
        return decision
