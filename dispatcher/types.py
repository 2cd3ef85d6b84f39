"""Plain value types shared by the policy, the kernels and whoever observes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple


class Kernel(str, Enum):
    """Kernel names: a stable contract (docs/metrics.md, "Label values") used as metric label values."""

    INTREE_RAGGED_PREFILL = "intree.ragged_prefill"
    INTREE_SPARSE_DECODE = "intree.sparse_decode"
    AITER_PA_PREFILL_SPARSE = "aiter.pa_prefill_sparse"
    AITER_OPUS = "aiter.pa_sparse_prefill_opus"

    def __str__(self) -> str:
        return self.value

    @property
    def splits_k(self) -> bool:
        """True for kernels that split the top-k across programs (decode-shaped work)."""
        return self is Kernel.INTREE_SPARSE_DECODE


PREFILL_KERNELS = frozenset(
    {Kernel.INTREE_RAGGED_PREFILL, Kernel.AITER_PA_PREFILL_SPARSE, Kernel.AITER_OPUS}
)


class CallClass(str, Enum):
    """What kind of batch reached the prefill entry: the ``call_class`` label (docs/metrics.md, "Label values")."""

    PREFILL = "prefill"
    MIXED = "mixed"
    PURE_DECODE = "pure_decode"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


class GuardMode(str, Enum):
    """What to do when decode rows reach the prefill entry."""

    OBSERVE = "observe"
    REROUTE = "reroute"
    RAISE = "raise"

    def __str__(self) -> str:
        return self.value


class Batch(NamedTuple):
    """The host-side batch facts a call may carry; never read from a device tensor."""

    call_class: CallClass = CallClass.UNKNOWN
    decode_rows: int = 0
    decode_requests: int = 0
    requests: int = 0

    @property
    def known(self) -> bool:
        return self.call_class is not CallClass.UNKNOWN


UNKNOWN_BATCH = Batch()


class CallShape(NamedTuple):
    """Everything the routing decision may look at; built from tensors, or by hand for what-ifs.

    A NamedTuple, not a dataclass: it is built once per call and a tuple is the cheapest
    immutable record CPython has. ``rows`` comes first so ``shape[1:]`` is the row-free key.
    Dtypes are torch names without the ``torch.`` prefix ("bfloat16", "float8_e4m3fnuz").
    """

    rows: int
    heads: int = 16
    head_dim: int = 512  # DeepSeek-V4.x layout: 448 nope + 64 rope (GLM-5.3: 512 + 0)
    nope_head_dim: int = 448
    rope_head_dim: int = 64
    q_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    out_dtype: str | None = None  # None: same as q
    out_lanes: int | None = None  # None: nope_head_dim
    topk: int = 2048  # dense: the index width; ragged: validate.ragged_width (mean positions a row, power of two)
    has_sink: bool = False
    sink_ok: bool = False  # the sink has shape [H] and dtype fp32
    same_device: bool = True
    unit_last_stride: bool = True
    out_strides_match_q: bool = True
    ragged: bool = False
    kv_pool_bytes: int = 0  # the kv pool's size bucket (dispatcher.pools.pool_bucket); 0: not known

    @property
    def effective_out_dtype(self) -> str:
        return self.out_dtype or self.q_dtype


@dataclass(frozen=True, slots=True)
class Gate:
    """One evaluated condition of one branch: the trace a person reads in `explain`."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Decision:
    """Which kernel a call goes to, why, and every gate looked at on the way.

    A decision depends on the rows only through the thresholds, so its text says
    "rows >= 512", never the exact count: one decision object can serve every call of
    the same class, which is what lets the dispatcher memoise ``decide``.
    """

    kernel: Kernel
    reason: str  # one line for people
    reason_code: str  # low-cardinality label for metrics
    gates: tuple[Gate, ...] = ()
    branch: str = "intree"  # gfx950_opus, gfx942_pa, intree, or guard
    call_class: CallClass = CallClass.UNKNOWN
    rerouted_from: Kernel | None = None
    refused: bool = False  # the guard (mode "raise") refuses this call
    # Process-unique number of a memoised decision (DecisionCache sets it), so an observer can
    # index its own per-decision state by a small int instead of id() + dict. -1: not memoised.
    # Not compared, hashed, shown or copied by replace(): it is identity, not content.
    ordinal: int = field(default=-1, init=False, compare=False, repr=False)

    @property
    def decode_in_prefill(self) -> bool:
        """Decode rows arrived and a no-split-K prefill kernel is about to run them."""
        return (
            self.call_class in (CallClass.MIXED, CallClass.PURE_DECODE)
            and self.kernel in PREFILL_KERNELS
        )

    def to_dict(self, batch: Batch | None = None) -> dict:
        """JSON shape shared by `routescope explain --json` and GET /routing/explain."""
        return {
            "kernel": self.kernel.value,
            "reason": self.reason,
            "reason_code": self.reason_code,
            "branch": self.branch,
            "gates": [{"name": g.name, "passed": g.passed, "detail": g.detail} for g in self.gates],
            "call_class": self.call_class.value,
            "decode_rows": batch.decode_rows if batch else 0,
            "decode_in_prefill": self.decode_in_prefill,
            "rerouted_from": self.rerouted_from.value if self.rerouted_from else None,
            "refused": self.refused,
        }
