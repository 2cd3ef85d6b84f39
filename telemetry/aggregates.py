"""Preallocated per-slot counters and the rare path that creates a slot; the hot path only indexes them.

A slot is one (decision object, fine rows bucket, model) combination. The dispatcher memoises
decisions, so one decision object stands for one row-free call shape and call class; with
every counterfactual threshold a fine-bucket edge, a slot's counterfactual kernels are
fixed and computed once here, never per call, on the counterfactual platform (the real
one, or a what-if arch such as gfx942 when the calls run elsewhere).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, NamedTuple

from dispatcher.platform import Platform
from dispatcher.policy import DecisionCache, Policy, decide
from dispatcher.types import Batch, CallShape, Decision

from .buckets import N_LATENCY_BUCKETS, RowsBuckets
from .spec import DROP_REASONS, STAGES

log = logging.getLogger("routescope.telemetry")

OTHER, UNKNOWN = "other", "unknown"
STAGE = {s: i for i, s in enumerate(STAGES)}
DROP = {r: i for i, r in enumerate(DROP_REASONS)}
MAX_ERROR_KEYS = 1024
MAX_FIRST_DIP = 256
MAX_ORDINAL = 1 << 20  # decisions numbered past this use the id() path
MAX_MODEL_NAMES = 4096  # distinct names remembered (as 'other'); past this, each call looks up


class SlotInfo(NamedTuple):
    """Labels and flags of one slot, fixed when the slot is made."""

    kernel: str
    reason: str
    call_class: str
    fine: int
    bucket: str
    model: str
    refused: bool
    rerouted_from: str | None
    decode_in_prefill: bool
    would: tuple[str, ...]  # kernel per counterfactual policy, in config order
    would_dip: tuple[bool, ...]  # per counterfactual policy: its kernel would run these decode rows with no split-K
    decision: Decision
    shape: CallShape  # one call of the slot: row-free part shared by all its calls


class Aggregates:
    """Counters indexed by slot, plus the dict from decision identity to that decision's slot table."""

    def __init__(
        self,
        *,
        platform: Platform,
        policy: Policy,
        counterfactuals: tuple[Policy, ...],
        counterfactual_platform: Platform | None = None,
        models: tuple[str, ...],
        max_slots: int,
        max_decisions: int,
        log_first_dip: bool = True,
    ) -> None:
        self.platform = platform
        self.policy = policy
        self.counterfactuals = counterfactuals
        extra = [t for p in counterfactuals for t in (p.gfx942_min_rows, p.gfx950_min_rows)]
        self.buckets = RowsBuckets(policy.thresholds, extra)
        self.model_names = tuple(models) + (OTHER, UNKNOWN)
        self.model_index: dict[Any, int] = {m: i for i, m in enumerate(models)}
        self.model_index[None] = len(models) + 1
        self.other = len(models)
        self.nm = len(self.model_names)
        self.max_slots = max_slots
        self.max_decisions = max_decisions
        self.log_first_dip = log_first_dip
        n = max_slots
        self.calls = [0] * n
        self.rows = [0] * n
        self.drows = [0] * n
        self.captured = [0] * n
        self.hsum = [0] * n  # ns
        self.hists: list[list[int] | None] = [None] * n
        self.impl: list[str | None] = [None] * n
        self.info: list[SlotInfo] = []
        self.tables: dict[int, list[int]] = {}  # id(decision) -> slot per (fine bucket, model); -1: none yet
        self.sentinel = [-1] * (self.buckets.n_fine * self.nm)  # "no table yet": never written
        # Decision.ordinal -> table (the hot path's lookup); the last entry stays the sentinel
        self.by_ordinal: list[list[int]] = [self.sentinel] * 1024
        self.pins: dict[int, Decision] = {}  # keeps each tabled decision alive, so its id is never reused
        self.spill: dict[tuple, list[int]] = {}  # past max_decisions: tables by content
        self.impl_extra: dict[tuple[int, str], int] = {}
        self.errors: dict[tuple[int, str], int] = {}
        self.fallback: dict[int, int] = {}  # OPUS slot -> the slot its declined calls moved to
        self.errs = [0] * len(STAGES)
        self.dropped = [0] * len(DROP_REASONS)
        self.dp_calls = [0] * self.nm
        self.dp_rows = [0] * self.nm
        self.first_dip: list[dict] = []
        self._dip_seen: set[tuple[str, str]] = set()
        cf_platform = platform if counterfactual_platform is None else counterfactual_platform
        self._cf = tuple(DecisionCache(cf_platform, p) for p in counterfactuals)
        self.lock = threading.RLock()

    # -- rare paths: first call of a decision or of a slot ------------------------------------
    def enter(self, decision: Decision) -> list[int]:
        """The slot table of a decision seen for the first time (pinned, so its id stays unique)."""
        with self.lock:
            t = self.tables.get(id(decision))
            if t is None:
                t = [-1] * (self.buckets.n_fine * self.nm)
                if len(self.tables) < self.max_decisions:
                    self.pins[id(decision)] = decision
                    self.tables[id(decision)] = t
                else:
                    key = (decision.kernel, decision.reason_code, decision.call_class, decision.refused,
                           decision.rerouted_from)
                    t = self.spill.setdefault(key, t)
            o = getattr(decision, "ordinal", -1)
            if 0 <= o < MAX_ORDINAL:
                table = self.by_ordinal
                if o + 2 > len(table):  # grow in place (the hot path holds this list), keep the last sentinel
                    table.extend([self.sentinel] * max(o + 2 - len(table), len(table)))
                table[o] = t
            return t

    def new_slot(self, decision: Decision, t: list[int], i: int, shape: CallShape, batch: Batch) -> int:
        """Allocate entry ``i`` of table ``t`` (or collapse the model to ``other`` when full); -1: dropped.

        Returns the table value: ``-(slot + 2)`` for a new slot (its first calls take the rare path)."""
        with self.lock:
            s = t[i]
            if s != -1:
                return s
            fine, mi = divmod(i, self.nm)
            if len(self.info) >= self.max_slots:
                s = t[fine * self.nm + self.other]
                if s == -1:
                    self.dropped[DROP["label_overflow"]] += 1
                    return -1
                t[i] = s
                return s
            s = len(self.info)
            self.hists[s] = [0] * N_LATENCY_BUCKETS
            would = tuple(c.decide(shape, decision.call_class) for c in self._cf)
            info = SlotInfo(
                decision.kernel.value, decision.reason_code, decision.call_class.value, fine,
                self.buckets.labels[self.buckets.fine_to_label[fine]], self.model_names[mi],
                decision.refused, decision.rerouted_from.value if decision.rerouted_from else None,
                decision.decode_in_prefill,
                tuple(w.kernel.value for w in would), tuple(w.decode_in_prefill and not w.refused for w in would),
                decision, shape,
            )
            self.info.append(info)
            t[i] = -(s + 2)  # the rare path until the slot's first calls are done (OPUS: always)
            if info.decode_in_prefill and not info.refused:
                self._first_dip(info, shape, batch)
            return t[i]

    def _first_dip(self, info: SlotInfo, shape: CallShape, batch: Batch) -> None:
        key = (info.model, info.kernel)
        if key in self._dip_seen or len(self.first_dip) >= MAX_FIRST_DIP:
            return
        self._dip_seen.add(key)
        rec = {
            "ts": time.time(), "model": info.model, "kernel": info.kernel, "call_class": info.call_class,
            "reason_code": info.reason, "rows": shape.rows, "decode_rows": batch.decode_rows,
            "decode_requests": batch.decode_requests, "requests": batch.requests,
            "heads": shape.heads, "head_dim": shape.head_dim, "nope_head_dim": shape.nope_head_dim,
            "rope_head_dim": shape.rope_head_dim, "topk": shape.topk, "q_dtype": shape.q_dtype,
            "kv_dtype": shape.kv_dtype,
        }
        self.first_dip.append(rec)
        if self.log_first_dip:
            log.warning(
                "decode rows in prefill: model %s, %s batch (%d decode rows of %d, %d requests) ran on %s, "
                "a prefill kernel with no split-K; q [%d, %d, %d] %s, top-k %d (logged once per model x kernel)",
                info.model, info.call_class, batch.decode_rows, shape.rows, batch.requests, info.kernel,
                shape.rows, shape.heads, shape.head_dim, shape.q_dtype, shape.topk,
            )

    def slot_of(self, decision: Decision, shape: CallShape, batch: Batch, model: Any) -> int:
        """The hot path's lookup, spelled out for rare paths (returns the plain slot, -1 if dropped)."""
        t = self.tables.get(id(decision)) or self.enter(decision)
        mi = self.model_index.get(model)
        i = self.buckets.fine(shape[0]) * self.nm + (self.model_slot(model) if mi is None else mi)
        s = t[i]
        if s == -1:
            s = self.new_slot(decision, t, i, shape, batch)
        return s if s >= -1 else -s - 2

    def opus_fallback(self, s: int) -> int:
        """The slot for a call the dispatcher re-decided because the OPUS symbol was missing."""
        with self.lock:
            t = self.fallback.get(s)
            if t is None:
                info = self.info[s]
                platform = replace(self.platform, opus_importable=False)
                d = decide(info.shape, platform, self.policy, Batch(info.decision.call_class))
                table = self.enter(d)
                i = info.fine * self.nm + self.model_names.index(info.model)
                t = table[i]
                if t == -1:
                    t = self.new_slot(d, table, i, info.shape, Batch(info.decision.call_class))
                t = t if t >= -1 else -t - 2
                self.fallback[s] = t
            return t

    def model_slot(self, model: Any) -> int:
        """Index of a model name not seen before: its own if configured, else ``other`` (remembered, bounded)."""
        with self.lock:
            mi = self.model_index.get(model)
            if mi is None:
                mi = self.other
                if len(self.model_index) < MAX_MODEL_NAMES:
                    self.model_index[model] = mi
            return mi

    def count_error(self, s: int, exc: BaseException) -> None:
        key = (s, exc.__class__.__name__)
        with self.lock:
            if key not in self.errors and len(self.errors) >= MAX_ERROR_KEYS:
                key = (s, OTHER)
                self.dropped[DROP["label_overflow"]] += 1
            self.errors[key] = self.errors.get(key, 0) + 1

    def note_impl(self, s: int, impl: str) -> None:
        """First impl seen for a slot becomes its own; others are counted beside it."""
        cur = self.impl[s]
        if cur is None:
            self.impl[s] = impl
        elif cur != impl:
            with self.lock:
                self.impl_extra[(s, impl)] = self.impl_extra.get((s, impl), 0) + 1

    @property
    def n_slots(self) -> int:
        return len(self.info)
