"""Which slot a call belongs to: per-decision slot tables, the model index, and slot creation (the rare path).

The dispatcher memoises decisions, so one decision object stands for one row-free call shape
and call class; its slot table maps (fine rows bucket, model) to a slot. With every
counterfactual threshold a fine-bucket edge, a slot's counterfactual kernels are fixed and
computed here once, never per call, on the counterfactual platform (the real one, or a what-if
arch such as gfx942 when the calls run elsewhere).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dispatcher.platform import Platform
from dispatcher.policy import DecisionCache, Policy, decide
from dispatcher.types import Batch, CallShape, Decision, Kernel

from .buckets import RowsBuckets
from .slots import NO_SLOT, SlotInfo, slot_of_value, warming

OTHER, UNKNOWN = "other", "unknown"
MAX_ORDINAL = 1 << 20  # decisions numbered past this use the id() path
MAX_MODEL_NAMES = 4096  # distinct names remembered (as 'other'); past this, each call looks up


class SlotIndex:
    """Owns the slot tables, the model index and ``info`` (one SlotInfo per slot); written under ``lock``."""

    def __init__(
        self,
        *,
        buckets: RowsBuckets,
        models: tuple[str, ...],
        counterfactuals: tuple[Policy, ...],
        counterfactual_platform: Platform,
        platform: Platform,
        policy: Policy,
        max_slots: int,
        max_decisions: int,
        on_slot: Callable[[int, SlotInfo, CallShape, Batch], None],
    ) -> None:
        self.buckets = buckets
        self.platform = platform
        self.policy = policy
        self.model_names = tuple(models) + (OTHER, UNKNOWN)
        self.model_index: dict[Any, int] = {m: i for i, m in enumerate(models)}
        self.model_index[None] = len(models) + 1
        self.other = len(models)
        self.n_models = len(self.model_names)
        self.max_slots = max_slots
        self.max_decisions = max_decisions
        self.info: list[SlotInfo] = []
        self.tables: dict[int, list[int]] = {}  # id(decision) -> its slot table
        table_size = buckets.n_fine * self.n_models
        self.no_table = [NO_SLOT] * table_size  # "no table yet": never written
        # Decision.ordinal -> table (the hot path's lookup); the last entry stays ``no_table``, so a
        # decision with no ordinal (-1) finds it too and takes the rare path
        self.by_ordinal: list[list[int]] = [self.no_table] * 1024
        self.pins: dict[int, Decision] = {}  # keeps each tabled decision alive, so its id is never reused
        self.spill: dict[tuple, list[int]] = {}  # past max_decisions: tables by content
        self.fallback: dict[int, int] = {}  # OPUS slot -> the slot its declined calls move to
        self._on_slot = on_slot
        self._cf = tuple(DecisionCache(counterfactual_platform, p) for p in counterfactuals)
        self.lock = threading.RLock()

    @property
    def n_slots(self) -> int:
        return len(self.info)

    def table_for(self, decision: Decision) -> list[int]:
        """The slot table of a decision seen for the first time (pinned, so its id stays unique)."""
        with self.lock:
            table = self.tables.get(id(decision))
            if table is None:
                table = [NO_SLOT] * len(self.no_table)
                if len(self.tables) < self.max_decisions:
                    self.pins[id(decision)] = decision
                    self.tables[id(decision)] = table
                else:
                    key = (decision.kernel, decision.reason_code, decision.call_class, decision.refused,
                           decision.rerouted_from)
                    table = self.spill.setdefault(key, table)
            ordinal = getattr(decision, "ordinal", -1)
            if 0 <= ordinal < MAX_ORDINAL:
                by_ordinal = self.by_ordinal
                if ordinal + 2 > len(by_ordinal):  # grow in place (the hot path holds this list); keep the last
                    by_ordinal.extend([self.no_table] * max(ordinal + 2 - len(by_ordinal), len(by_ordinal)))
                by_ordinal[ordinal] = table
            return table

    def model_slot(self, model: Any) -> int:
        """Index of a model name not seen before: its own if configured, else ``other`` (remembered, bounded)."""
        with self.lock:
            index = self.model_index.get(model)
            if index is None:
                index = self.other
                if len(self.model_index) < MAX_MODEL_NAMES:
                    self.model_index[model] = index
            return index

    def position(self, shape: CallShape, model: Any) -> int:
        """A call's entry in its decision's table."""
        index = self.model_index.get(model)
        return self.buckets.fine(shape[0]) * self.n_models + (self.model_slot(model) if index is None else index)

    def new_slot(self, decision: Decision, table: list[int], position: int, shape: CallShape, batch: Batch) -> int:
        """Fill entry ``position`` of ``table`` (or collapse the model to ``other`` when full); the table value.

        A new slot starts as ``warming(slot)``: its first calls take the rare path. ``NO_SLOT``: dropped."""
        with self.lock:
            value = table[position]
            if value != NO_SLOT:
                return value
            fine, model = divmod(position, self.n_models)
            if len(self.info) >= self.max_slots:
                value = table[fine * self.n_models + self.other]
                if value != NO_SLOT:
                    table[position] = value
                return value
            slot = len(self.info)
            would = tuple(c.decide(shape, decision.call_class) for c in self._cf)
            info = SlotInfo(
                decision.kernel.value, decision.reason_code, decision.call_class.value, fine,
                self.buckets.labels[self.buckets.fine_to_label[fine]], self.model_names[model],
                decision.refused, decision.rerouted_from.value if decision.rerouted_from else None,
                decision.decode_in_prefill,
                tuple(w.kernel.value for w in would), tuple(w.decode_in_prefill and not w.refused for w in would),
                decision, shape,
            )
            self.info.append(info)
            table[position] = warming(slot)
            self._on_slot(slot, info, shape, batch)
            return table[position]

    def slot_of(self, decision: Decision, shape: CallShape, batch: Batch, model: Any) -> int:
        """The hot path's lookup, spelled out for rare paths: the plain slot, or ``NO_SLOT`` if dropped."""
        table = self.tables.get(id(decision)) or self.table_for(decision)
        position = self.position(shape, model)
        value = table[position]
        if value == NO_SLOT:
            value = self.new_slot(decision, table, position, shape, batch)
        return slot_of_value(value)

    def opus_fallback(self, slot: int) -> int:
        """The slot for a call the dispatcher re-decided because the OPUS symbol was missing."""
        with self.lock:
            moved = self.fallback.get(slot)
            if moved is None:
                info = self.info[slot]
                platform = replace(self.platform, opus_importable=False)
                batch = Batch(info.decision.call_class)
                decision = decide(info.shape, platform, self.policy, batch)
                table = self.table_for(decision)
                position = info.fine * self.n_models + self.model_names.index(info.model)
                value = table[position]
                if value == NO_SLOT:
                    value = self.new_slot(decision, table, position, info.shape, batch)
                moved = slot_of_value(value)
                self.fallback[slot] = moved
            return moved

    def counted_at_stop(self, slot: int) -> bool:
        """OPUS calls are counted when they end: the launch may decline and move them to another kernel."""
        return self.info[slot].decision.kernel is Kernel.AITER_OPUS
