"""What the gfx942 gate would do with the demo's traffic: the same calls decided on a what-if gfx942.

Telemetry's counterfactual counters evaluate on the platform the calls ran on, so on a CPU
every policy answers "in-tree". The demo knows each call's real model shape, so it decides
each one again, purely, on ``what_if("gfx942")`` with AITER enabled, under the active policy
and each counterfactual one. Nothing here launches anything: these are what-ifs, labelled so.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from dispatcher.classify import classify_query_lens
from dispatcher.platform import Platform, what_if
from dispatcher.policy import DecisionCache, Policy
from dispatcher.types import CallShape

from .traffic import CallSpec, ModelSpec


def bucket_low(label: str) -> int:
    """"512-1023" -> 512, "16384+" -> 16384, "1" -> 1: the lower edge of a rows-bucket label."""
    return int(label.split("-")[0].rstrip("+"))


class WhatIf:
    """Counts (policy, kernel, rows bucket, model), and decode-in-prefill among them, for every prefill-entry call."""

    def __init__(
        self,
        policies: Sequence[Policy],
        bucket_labels: Sequence[str],
        models: Sequence[ModelSpec],
        *,
        platform: Platform | None = None,
        dtype: str = "bfloat16",
    ) -> None:
        if not bucket_labels:
            raise ValueError("WhatIf needs the rows-bucket labels")
        self.platform = platform if platform is not None else what_if("gfx942", aiter=True)
        self.policies = tuple(policies)
        self.labels = tuple(bucket_labels)
        self._edges = [bucket_low(b) for b in self.labels]
        self._caches = [DecisionCache(self.platform, p) for p in self.policies]
        self._shapes = {
            m.name: CallShape(0, m.heads, m.head_dim, m.nope_head_dim, m.rope_head_dim, dtype, dtype, dtype,
                              m.nope_head_dim, m.topk)
            for m in models
        }
        self._counts: dict[tuple[str, str, str, str], list[int]] = {}  # [calls, decode-in-prefill calls]
        self._spec_tokens = self.policies[0].spec_tokens if self.policies else 0

    def label(self, rows: int) -> str:
        return self.labels[max(0, bisect_right(self._edges, rows) - 1)]

    def record(self, spec: CallSpec) -> None:
        """One prefill-entry call: decide it under every policy on the what-if platform and count."""
        base = self._shapes.get(spec.model)
        if base is None:
            return
        rows = spec.rows
        shape = base._replace(rows=rows)
        call_class = classify_query_lens(spec.query_lens, spec_tokens=self._spec_tokens).call_class
        bucket = self.label(rows)
        counts = self._counts
        for policy, cache in zip(self.policies, self._caches):
            d = cache.decide(shape, call_class)
            key = (policy.name, d.kernel.value, bucket, spec.model)
            c = counts.get(key)
            if c is None:
                c = counts[key] = [0, 0]
            c[0] += 1
            c[1] += d.decode_in_prefill

    def rows(self) -> list[dict]:
        """JSON rows, sorted; a copy, so the demo thread may keep counting."""
        snap = dict(self._counts)
        return [
            {"policy": p, "kernel": k, "rows_bucket": b, "model": m, "calls": c[0], "decode_in_prefill_calls": c[1]}
            for (p, k, b, m), c in sorted(snap.items())
        ]

    def info(self) -> dict:
        return {
            "platform": self.platform.to_dict(),
            "policies": [p.to_dict() for p in self.policies],
            "counts": self.rows(),
        }
