"""A plain reference probe: what the telemetry series must hold, written as obviously as possible.

Dicts keyed by label tuples, one update per call, no slots, no tables, no sampling: slow and
simple, so that tests/telemetry/test_reference.py can hold the real probe's every series against it.
"""

from __future__ import annotations

from typing import Any

from dispatcher.platform import Platform
from dispatcher.policy import Policy, decide
from dispatcher.types import Batch, CallShape, Decision
from telemetry.buckets import RowsBuckets


class ReferenceProbe:
    def __init__(self, *, models: tuple[str, ...], arch: str, policy: Policy, counterfactuals: tuple[Policy, ...],
                 counterfactual_platform: Platform) -> None:
        extra = [t for p in counterfactuals for t in (p.gfx942_min_rows, p.gfx950_min_rows)]
        self.buckets = RowsBuckets(policy.thresholds, extra)
        self.models = models
        self.arch = arch
        self.cf = counterfactuals
        self.cf_platform = counterfactual_platform
        self.series: dict[str, dict[tuple, int]] = {}

    def _add(self, name: str, key: tuple, n: int = 1) -> None:
        d = self.series.setdefault(name, {})
        d[key] = d.get(key, 0) + n

    def _model(self, model: Any) -> str:
        if model is None:
            return "unknown"
        return model if model in self.models else "other"

    def start(self, decision: Decision, shape: CallShape, batch: Batch, model: Any, q: Any, stream: Any,
              impl: str | None = None) -> Any:
        return decision, shape, batch, self._model(model)

    def _count(self, token: Any, impl: str | None) -> None:
        decision, shape, batch, model = token
        k, b, cc = decision.kernel.value, self.buckets.label(shape.rows), decision.call_class.value
        self._add("decisions", (k, decision.reason_code, model))
        for policy in self.cf:
            would = decide(shape, self.cf_platform, policy, Batch(decision.call_class))
            self._add("would_route", (policy.name, would.kernel.value, b, model))
        if decision.refused:
            self._add("refused", (k, model))
            return
        self._add("calls", (k, impl, b, model, cc, self.arch))
        self._add("rows", (k, b, model, cc), shape.rows)
        traffic = (k, b, model, cc, str(shape.topk), f"{shape.nope_head_dim}+{shape.rope_head_dim}",
                   shape.q_dtype, shape.kv_dtype, str(shape.kv_pool_bytes) if shape.kv_pool_bytes else "")
        self._add("traffic_calls", traffic)
        self._add("traffic_rows", traffic, shape.rows)
        if decision.decode_in_prefill:
            self._add("dip_calls", (k, model, cc))
            self._add("dip_rows", (k, model, cc), batch.decode_rows)
        if decision.rerouted_from is not None:
            self._add("rerouted", (decision.rerouted_from.value, k, model))

    def stop(self, token: Any, impl: str, announced: str | None = None) -> None:
        self._count(token, impl)

    def error(self, token: Any, exc: BaseException, impl: str | None = None, announced: str | None = None) -> None:
        decision, _, _, model = token
        self._count(token, impl)
        if not decision.refused:
            self._add("kernel_errors", (decision.kernel.value, type(exc).__name__, model))

    def record_decode_path(self, rows: int, model: Any = None) -> None:
        self._add("decode_path_calls", (self._model(model),))
        self._add("decode_path_rows", (self._model(model),), rows)
