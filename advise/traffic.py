"""The observed traffic, as telemetry aggregates it: calls and rows per model x kernel x rows bucket x shape. Pure.

Where it comes from (a running service's ``/routing``, a multiprocess directory, Prometheus)
is ``sources``'s business; everything here takes plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dispatcher.policy import Policy
from dispatcher.types import GuardMode

TRAFFIC_LABELS = ("model", "kernel", "rows_bucket", "call_class", "topk", "layout", "q_dtype", "kv_dtype",
                  "kv_pool_bytes")


class TrafficEntry(BaseModel):
    """One entry of ``/routing``'s ``traffic``: the calls of one label combination."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str
    kernel: str
    rows_bucket: str
    call_class: str
    topk: int = Field(gt=0)
    layout: str
    q_dtype: str
    kv_dtype: str
    calls: int = Field(ge=0)
    rows: int = Field(ge=0)
    decode_rows: int | None = Field(0, ge=0, description="null: not known per entry (merged from several processes)")
    kv_pool_bytes: int | None = Field(None, gt=0, description="the kv pool's power-of-two bucket in bytes (telemetry's "
                                                             "label); null: not recorded (older series)")

    @field_validator("kv_pool_bytes", mode="before")
    @classmethod
    def _no_pool(cls, value: object) -> object:
        return None if value in ("", "0", 0, None) else value

    @property
    def mean_rows(self) -> float:
        return self.rows / self.calls if self.calls else 0.0

    @property
    def mean_decode_rows(self) -> float:
        return (self.decode_rows or 0) / self.calls if self.calls else 0.0


def bucket_bounds(label: str) -> tuple[int, int | None]:
    """``1`` -> (1, 1), ``512-767`` -> (512, 767), ``16384+`` -> (16384, None)."""
    label = label.strip()
    if label.endswith("+"):
        return int(label[:-1]), None
    lo, sep, hi = label.partition("-")
    return (int(lo), int(hi)) if sep else (int(lo), int(lo))


@dataclass(frozen=True)
class Traffic:
    """The calls to price and what is known about where they ran and under which policy."""

    entries: tuple[TrafficEntry, ...]
    platform_arch: str
    active: Policy
    counterfactuals: tuple[Policy, ...] = ()
    counterfactual_arch: str | None = None  # where the counterfactuals were decided ("gfx942" for the demo)
    span_s: float | None = None  # how long the traffic took; None: unknown (no per-hour figures)
    span_note: str = ""
    source: str = ""
    notes: tuple[str, ...] = ()
    demo: Mapping | None = None  # /routing's demo section, when the traffic is the demo's

    @property
    def models(self) -> list[str]:
        return sorted({e.model for e in self.entries})

    def with_notes(self, *notes: str) -> Traffic:
        return replace(self, notes=self.notes + tuple(notes))


def policy_from_dict(d: Mapping, *, name: str | None = None) -> Policy:
    """A Policy from ``/routing``'s ``policy`` or ``counterfactuals[]`` (extra keys ignored)."""
    return Policy(
        gfx942_min_rows=int(d.get("gfx942_min_rows", 512)),
        gfx950_min_rows=int(d.get("gfx950_min_rows", 1024)),
        guard=GuardMode(d.get("guard", "observe")),
        spec_tokens=int(d.get("spec_tokens", 0)),
        name=name or str(d.get("name", "active")),
    )


def entries_from(rows: Iterable[Mapping]) -> tuple[TrafficEntry, ...]:
    """Entries with calls, merged where the labels repeat (several ranks, several processes)."""
    merged: dict[tuple, list] = {}
    for r in rows:
        e = TrafficEntry.model_validate(r)
        if not e.calls:
            continue
        key = tuple(getattr(e, k) for k in TRAFFIC_LABELS)
        acc = merged.setdefault(key, [0, 0, 0])
        acc[0] += e.calls
        acc[1] += e.rows
        acc[2] = None if acc[2] is None or e.decode_rows is None else acc[2] + e.decode_rows
    return tuple(
        TrafficEntry(**dict(zip(TRAFFIC_LABELS, k)), calls=c, rows=n, decode_rows=d)
        for k, (c, n, d) in sorted(merged.items(), key=lambda kv: kv[0][:-1] + (kv[0][-1] or 0,))  # pool None: 0
    )


def fill_decode_rows(entries: Sequence[TrafficEntry], mixed_decode_rows: Mapping[tuple[str, str], float]) -> tuple[TrafficEntry, ...]:
    """Decode rows where a source has none per entry: all rows of a pure decode; for mixed calls, the
    (kernel, model) total of decode-in-prefill rows shared out by calls (an estimate, said so by the caller)."""
    mixed_calls: dict[tuple[str, str], int] = {}
    for e in entries:
        if e.call_class == "mixed":
            mixed_calls[(e.kernel, e.model)] = mixed_calls.get((e.kernel, e.model), 0) + e.calls
    out = []
    for e in entries:
        d = e.decode_rows
        if e.call_class == "pure_decode":
            d = e.rows
        elif e.call_class == "mixed" and d is None:
            key = (e.kernel, e.model)
            total = mixed_decode_rows.get(key, 0.0)
            d = min(e.rows, round(total * e.calls / mixed_calls[key])) if mixed_calls.get(key) else 0
        out.append(e.model_copy(update={"decode_rows": int(d or 0)}))
    return tuple(out)


def unknown_decode_rows(entries: Sequence[TrafficEntry]) -> bool:
    """True when some mixed entry does not carry its decode rows (the source has them per kernel x model only)."""
    return any(e.call_class == "mixed" and e.decode_rows is None for e in entries)


@dataclass(frozen=True)
class DemoShapes:
    """The demo's scaled shapes mapped back to the real models' (rows per call are real already)."""

    by_model: dict[str, tuple[int, str]] = field(default_factory=dict)  # model -> (top-k, layout)

    def apply(self, entries: Sequence[TrafficEntry]) -> tuple[TrafficEntry, ...]:
        out = []
        for e in entries:
            real = self.by_model.get(e.model)
            out.append(e if real is None else e.model_copy(update={"topk": real[0], "layout": real[1]}))
        return tuple(out)

    def note(self) -> str:
        shapes = "; ".join(f"{m}: top-k {k}, {lay}" for m, (k, lay) in sorted(self.by_model.items()))
        return (f"the demo ran scaled-down shapes; its calls are priced at the real models' shapes ({shapes}), "
                "with the rows per call as they were")


def demo_shapes(demo: Mapping | None, models: Iterable[str]) -> DemoShapes | None:
    """For a scaled demo, the real top-k and layout of each of ``models`` it ran (workloads/traffic.py)."""
    if not demo or not demo.get("scaled"):
        return None
    from workloads.traffic import DEMO_MODELS

    names = {s.get("model") for s in demo.get("shapes", [])} & set(models)
    return DemoShapes({m.name: (m.topk, f"{m.nope_head_dim}+{m.rope_head_dim}") for m in DEMO_MODELS if m.name in names})


class ObservedCall(NamedTuple):
    """One prefill-entry call as telemetry sees it (for replays and fixtures that aggregate calls themselves)."""

    model: str
    kernel: str
    rows: int
    call_class: str
    decode_rows: int
    topk: int
    layout: str
    q_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    kv_pool_bytes: int | None = None


def with_pool(entries: Sequence[TrafficEntry], kv_pool_bytes: int) -> tuple[TrafficEntry, ...]:
    """Every entry priced at one pool (``--kv-pool-bytes``: for sources without the label, or a what-if)."""
    from dispatcher.pools import pool_bucket

    bucket = pool_bucket(kv_pool_bytes)
    return tuple(e.model_copy(update={"kv_pool_bytes": bucket}) for e in entries)


def aggregate(calls: Iterable[ObservedCall], thresholds: Iterable[int] = ()) -> tuple[TrafficEntry, ...]:
    """Calls into entries as telemetry aggregates them: rows buckets are powers of two plus the thresholds."""
    from telemetry.buckets import RowsBuckets

    buckets = RowsBuckets(tuple(thresholds))
    rows = []
    for c in calls:
        d = c._asdict()
        d["rows_bucket"] = buckets.label(c.rows)
        d["calls"] = 1
        rows.append(d)
    return entries_from(rows)
