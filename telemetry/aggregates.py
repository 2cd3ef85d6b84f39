"""Everything one Telemetry records, each part with one writer: slot counters, the slot index, health, logs.

- ``counters`` (``SlotCounters``): the hot path, graph replays and timing add to them.
- ``index`` (``SlotIndex``): the rare path makes slots and tables.
- ``health`` (``Health``): every caught exception and dropped record, by stage and reason.
- ``kernel_errors``, ``decode_path``, ``first_decode_in_prefill``: rarer facts, each its own writer.

``view.build_totals`` reads them all into label-keyed series at flush.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dispatcher.platform import Platform
from dispatcher.policy import Policy
from dispatcher.types import Batch, CallShape

from .buckets import RowsBuckets
from .index import OTHER, SlotIndex
from .slots import SlotCounters, SlotInfo
from .spec import DROP_REASONS, STAGES

log = logging.getLogger("routescope.telemetry")

STAGE = {s: i for i, s in enumerate(STAGES)}
DROP = {r: i for i, r in enumerate(DROP_REASONS)}
MAX_ERROR_KEYS = 1024
MAX_FIRST_DIP = 256


class Health:
    """Caught exceptions per stage and dropped records per reason: lists indexed by ``STAGE`` / ``DROP``."""

    __slots__ = ("errors", "dropped")

    def __init__(self) -> None:
        self.errors = [0] * len(STAGES)
        self.dropped = [0] * len(DROP_REASONS)

    def error(self, stage: str) -> None:
        self.errors[STAGE[stage]] += 1

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[DROP[reason]] += n


class KernelErrors:
    """Launches that raised, per (slot, exception class); bounded, the overflow folded into ``other``."""

    def __init__(self, health: Health) -> None:
        self.counts: dict[tuple[int, str], int] = {}
        self._health = health
        self._lock = threading.Lock()

    def add(self, slot: int, exc: BaseException) -> None:
        key = (slot, exc.__class__.__name__)
        with self._lock:
            if key not in self.counts and len(self.counts) >= MAX_ERROR_KEYS:
                key = (slot, OTHER)
                self._health.drop("label_overflow")
            self.counts[key] = self.counts.get(key, 0) + 1


class DecodePath:
    """Calls and rows of the decode entry, per model index (so decode-in-prefill reads as a share)."""

    __slots__ = ("calls", "rows")

    def __init__(self, n_models: int) -> None:
        self.calls = [0] * n_models
        self.rows = [0] * n_models


class FirstDecodeInPrefill:
    """The first decode-in-prefill call per (model, kernel): kept for /routing and logged once."""

    def __init__(self, *, log_it: bool) -> None:
        self.records: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str]] = set()
        self._log_it = log_it

    def note(self, info: SlotInfo, shape: CallShape, batch: Batch) -> None:
        key = (info.model, info.kernel)
        if key in self._seen or len(self.records) >= MAX_FIRST_DIP:
            return
        self._seen.add(key)
        self.records.append({
            "ts": time.time(), "model": info.model, "kernel": info.kernel, "call_class": info.call_class,
            "reason_code": info.reason, "rows": shape.rows, "decode_rows": batch.decode_rows,
            "decode_requests": batch.decode_requests, "requests": batch.requests,
            "heads": shape.heads, "head_dim": shape.head_dim, "nope_head_dim": shape.nope_head_dim,
            "rope_head_dim": shape.rope_head_dim, "topk": shape.topk, "q_dtype": shape.q_dtype,
            "kv_dtype": shape.kv_dtype,
        })
        if self._log_it:
            log.warning(
                "decode rows in prefill: model %s, %s batch (%d decode rows of %d, %d requests) ran on %s, "
                "a prefill kernel with no split-K; q [%d, %d, %d] %s, top-k %d (logged once per model x kernel)",
                info.model, info.call_class, batch.decode_rows, shape.rows, batch.requests, info.kernel,
                shape.rows, shape.heads, shape.head_dim, shape.q_dtype, shape.topk,
            )


class Aggregates:
    """One Telemetry's recorded state, built for a platform, an active policy and its counterfactuals."""

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
        self.health = Health()
        self.counters = SlotCounters(max_slots)
        self.first_decode_in_prefill = FirstDecodeInPrefill(log_it=log_first_dip)
        self.index = SlotIndex(
            buckets=self.buckets, models=models, counterfactuals=counterfactuals,
            counterfactual_platform=platform if counterfactual_platform is None else counterfactual_platform,
            platform=platform, policy=policy, max_slots=max_slots, max_decisions=max_decisions,
            on_slot=self._on_slot,
        )
        self.kernel_errors = KernelErrors(self.health)
        self.decode_path = DecodePath(self.index.n_models)

    def _on_slot(self, slot: int, info: SlotInfo, shape: CallShape, batch: Batch) -> None:
        self.counters.open(slot)
        if info.decode_in_prefill and not info.refused:
            self.first_decode_in_prefill.note(info, shape, batch)

    @property
    def info(self) -> list[SlotInfo]:
        return self.index.info

    @property
    def n_slots(self) -> int:
        return self.index.n_slots

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.index.model_names

    @property
    def max_slots(self) -> int:
        return self.index.max_slots
