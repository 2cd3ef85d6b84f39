"""Traffic fixtures with exactly the shape telemetry's `traffic` aggregate has (docs/advise.md), built from the demo.

The demo's calls (workloads/traffic.py) aggregated by ``advise.traffic.aggregate`` (telemetry's
rows buckets), as a CPU demo's /routing would carry them (scaled shapes: top-k 32, head dims / 8):
a known traffic in a millisecond, where running the demo until it has made these calls would take
minutes. Telemetry's own aggregate is what the end-to-end tests read: `serve --demo` to
`advise --url` (test_e2e_serve.py), real telemetry's multiprocess files (test_multiproc_route.py)
and a real Prometheus scraping two demos (tests/dashboards/test_e2e_demo.py).
"""

from __future__ import annotations

import itertools
from typing import Any

from advise.traffic import ObservedCall, TrafficEntry, aggregate
from workloads.traffic import DEMO_MODELS, traffic

RAGGED = "intree.ragged_prefill"
SPLIT = "intree.sparse_decode"


def demo_entries(*, glm_bug: bool = True, steps: int = 3000, scaled: bool = True) -> list[dict[str, Any]]:
    """The demo's prefill-entry calls of ``steps`` scheduler steps, aggregated: /routing's `traffic` rows."""
    calls = []
    for spec in itertools.islice(traffic(7, glm_bug=glm_bug), steps):
        if spec.entry != "prefill":
            continue
        m = next(m for m in DEMO_MODELS if m.name == spec.model)
        topk, layout = (32, f"{m.nope_head_dim // 8}+{m.rope_head_dim // 8}") if scaled else (
            m.topk, f"{m.nope_head_dim}+{m.rope_head_dim}")
        calls.append(ObservedCall(spec.model, RAGGED, spec.rows, spec.kind, spec.decode_rows, topk, layout))
    return [e.model_dump() for e in aggregate(calls, (512, 1024))]


def entry(model: str, bucket: str, call_class: str, calls: int, rows: int, decode_rows: int = 0, *,
          kernel: str = RAGGED, topk: int = 2048, layout: str = "512+0",
          kv_pool_bytes: int | None = None) -> dict[str, Any]:
    return TrafficEntry(model=model, kernel=kernel, rows_bucket=bucket, call_class=call_class, topk=topk,
                        layout=layout, q_dtype="bfloat16", kv_dtype="bfloat16", calls=calls, rows=rows,
                        decode_rows=decode_rows, kv_pool_bytes=kv_pool_bytes).model_dump()


def routing_doc(entries: list[dict[str, Any]] | None, *, arch: str = "cpu", uptime_s: float = 600.0,
                demo: bool = True, gfx942_min_rows: int = 512) -> dict[str, Any]:
    """The /routing keys advise reads, as a CPU demo's /routing has them (what-if gfx942 counterfactuals)."""
    policy = {"name": "active", "gfx942_min_rows": gfx942_min_rows, "gfx950_min_rows": 1024, "guard": "observe",
              "spec_tokens": 0}
    doc: dict[str, Any] = {
        "platform": {"vendor": "cpu", "arch": arch, "aiter_enabled": False, "aiter_mla_enabled": True},
        "policy": policy,
        "counterfactuals": [dict(policy, name="gfx942_1024", gfx942_min_rows=1024, platform="what-if gfx942"),
                            dict(policy, name="no_row_gate", gfx942_min_rows=0, platform="what-if gfx942")],
        "counterfactual_platform": {"vendor": "rocm", "arch": "gfx942", "what_if": True, "aiter_enabled": True,
                                    "aiter_mla_enabled": True},
        "service": {"version": "0.1.0", "ts": 1.0e9, "started_ts": 1.0e9 - uptime_s, "uptime_s": uptime_s, "rank": "0",
                    "models": [m.name for m in DEMO_MODELS], "refresh_s": 2.0},
        "scope": {"series": "this process", "decisions": "this process", "health": "this process"},
        "demo": {"scaled": True, "shapes": [{"model": m.name} for m in DEMO_MODELS]} if demo else None,
    }
    if entries is not None:
        doc["traffic"] = entries
    return doc
