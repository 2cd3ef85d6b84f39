"""Latency tables: load, check and index them; a bad or partial table is refused naming its file and field.

Two formats load:

- ``routescope-latency-table/1`` (the tables shipped in ``advise/data``): absolute points per
  kernel x rows x top-k (x layout), each citing its source, and optional ratios between two
  kernels (the seed's AITER/in-tree table) from which the second kernel's time is derived;
- the JSON ``routescope sweep`` writes (docs/benchmarks/h200-sweep*.json): median, p20 and p80
  per kernel x implementation x layout x top-k x rows, measured here, with the date and commit it
  ran at (sweeps before those were recorded say "not recorded in the file"). Where a sweep timed
  several implementations of one kernel, the one the dispatcher would launch prices it
  (``IMPL_PREFERENCE``), and the table's notes say so.

Every table says where its figures come from: device, date, and "measured here" or
"published, not measured here".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dispatcher.pools import format_bytes
from dispatcher.sweep.noise import noise_sentence, noisy_in_document
from dispatcher.types import Kernel

from .interp import Curve

FORMAT = "routescope-latency-table/1"
MEASURED = "measured here"
PUBLISHED = "published, not measured here"
SHIPPED = {"gfx942": "gfx942-mi325x-published.json", "h200": "h200-sweep-cupti.json"}
KernelName = Literal[tuple(k.value for k in Kernel)]  # type: ignore[valid-type]
Provenance = Literal["measured here", "published, not measured here"]
_LAYOUT = re.compile(r"^\d+\+\d+$")
# Devices a sweep JSON names, to the arch whose routing it prices (a sweep does not record the arch).
_DEVICE_ARCH = (("h200", "sm90"), ("h100", "sm90"), ("h800", "sm90"), ("mi300", "gfx942"), ("mi325", "gfx942"),
                ("mi350", "gfx950"), ("mi355", "gfx950"), ("a100", "sm80"), ("cpu", "cpu"))

# The implementations of a kernel in the order the dispatcher prefers them (dispatcher/kernels/registry.py's
# default_registry: Gluon on Hopper, then Triton, then torch; AITER's names have one). Where a sweep timed several
# implementations of one kernel at a point, the first of these prices it: what the dispatcher would launch there
# (unless ROUTESCOPE_GLUON=0 turns Gluon off: time Triton alone for a table of that). Implementations not listed
# come after, by name; a result without one (older sweeps) last.
IMPL_PREFERENCE = ("gluon", "triton", "torch", "aiter")
NOT_RECORDED = "not recorded in the file"

SeriesKey = tuple[str, int, str, str, str, "int | None"]  # kernel, top-k, layout, q dtype, kv dtype, kv pool bytes
RatioKey = tuple[str, str, int, str, str, str]  # kernel, over, top-k, layout, q dtype, kv dtype


class TableError(ValueError):
    """A table that cannot be used; the message names the file and the field."""

    def __init__(self, file: str, where: str, problem: str) -> None:
        super().__init__(f"{file}: {where}: {problem}")
        self.file, self.where, self.problem = file, where, problem


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PointIn(_Strict):
    kernel: KernelName
    rows: int = Field(gt=0)
    topk: int = Field(gt=0)
    layout: str | None = Field(None, description="null: every layout the table lists")
    us: float = Field(gt=0, description="microseconds per call")
    low_us: float | None = Field(None, gt=0)
    high_us: float | None = Field(None, gt=0)
    provenance: Provenance | None = Field(None, description="null: the table's")
    source: str = Field(min_length=1)
    kv_pool_bytes: int | None = Field(None, gt=0, description="the kv pool it was timed with; null: not recorded")

    @model_validator(mode="after")
    def _spread(self) -> PointIn:
        lo = self.low_us if self.low_us is not None else self.us
        hi = self.high_us if self.high_us is not None else self.us
        if not lo <= self.us <= hi:
            raise ValueError(f"need low_us <= us <= high_us; got {lo}, {self.us}, {hi}")
        return self


class RatioIn(_Strict):
    kernel: KernelName = Field(description="numerator: the kernel with absolute points")
    over: KernelName = Field(description="denominator: the kernel whose time is derived as kernel's / ratio")
    rows: int = Field(gt=0)
    topk: int = Field(gt=0)
    layout: str | None = None
    ratio: float = Field(gt=0)
    provenance: Provenance | None = None
    source: str = Field(min_length=1)


class TableIn(_Strict):
    format: Literal["routescope-latency-table/1"]
    name: str = Field(min_length=1)
    device: str = Field(min_length=1)
    arch: str = Field(min_length=1)
    date: str = Field(min_length=1)
    provenance: Provenance
    source: str = Field(min_length=1)
    command: str | None = None
    commit: str | None = None
    heads: int | None = Field(None, gt=0)
    q_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    layouts: list[str] = Field(min_length=1)
    kv_pools: list[int] = Field([], description="the kv pools (bytes) its points were timed with, if recorded")
    notes: list[str] = []
    points: list[PointIn] = Field(min_length=1)
    ratios: list[RatioIn] = []


class SweepResultIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    kernel: KernelName
    layout: str
    rows: int = Field(gt=0)
    topk: int = Field(gt=0)
    dtype: str
    kv_dtype: str | None = None
    median_us: float = Field(gt=0)
    p20_us: float | None = Field(None, gt=0)
    p80_us: float | None = Field(None, gt=0)
    heads: int | None = None
    impl: str | None = None
    timer: str | None = None
    kv_len: int | None = None
    head_dim: int | None = None
    kv_pool_bytes: int | None = Field(None, gt=0)


class SweepIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    device: str = Field(min_length=1)
    date: str | None = Field(None, description="the UTC day it ran (routescope sweep records it; older files not)")
    commit: str | None = Field(None, description="the checkout's commit it ran at, if it ran in one")
    command: str = ""
    kv_pools: list[int] = Field([], description="the pools a sweep over kv pools timed (routescope sweep --kv-pool)")
    results: list[SweepResultIn] = Field(min_length=1)


@dataclass(frozen=True)
class TableMeta:
    """Where a table's figures come from, as every report shows it."""

    name: str
    device: str
    arch: str
    date: str
    provenance: str
    source: str
    file: str
    command: str | None = None
    commit: str | None = None
    heads: int | None = None
    notes: tuple[str, ...] = ()
    noise: str | None = None  # why its figures cannot place a gate (a sweep's noisy points); None: they can
    pools: tuple[int, ...] = ()  # the kv pools (bytes) it times; () : not recorded

    @property
    def measured_here(self) -> bool:
        return self.provenance == MEASURED

    @property
    def pool_text(self) -> str:
        """'kv pools 8 MiB, 256 MiB, 4 GiB', or that the file does not record them."""
        if not self.pools:
            return f"kv pool {NOT_RECORDED}"
        return ("kv pool " if len(self.pools) == 1 else "kv pools ") + ", ".join(map(format_bytes, self.pools))

    def describe(self) -> str:
        pools = f", {self.pool_text}" if self.pools else ""
        return f"{self.name} ({self.device}, {self.date}{pools}, {self.provenance})"


@dataclass(frozen=True)
class LatencyTable:
    """One table: absolute curves per series, and ratio curves that derive one kernel from another."""

    meta: TableMeta
    series: dict[SeriesKey, Curve] = field(default_factory=dict)
    ratios: dict[RatioKey, Curve] = field(default_factory=dict)


def _where(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _raise_first(file: str, exc: ValidationError) -> None:
    err = exc.errors()[0]
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    raise TableError(file, _where(err["loc"]), err["msg"] + more) from None


def _check_layout(file: str, where: str, layout: str) -> None:
    if not _LAYOUT.match(layout):
        raise TableError(file, where, f"a layout is NOPE+ROPE like 448+64; got {layout!r}")


def _curves(file: str, pts: dict[tuple, list[tuple[int, tuple[float, float, float], str]]]) -> dict[tuple, Curve]:
    out = {}
    for key, items in pts.items():
        items.sort(key=lambda t: t[0])
        for (r0, _, _), (r1, _, where) in zip(items, items[1:]):
            if r0 == r1:
                raise TableError(file, where, f"a second value at rows {r1} for {' '.join(map(str, key))}")
        out[key] = Curve(tuple(float(r) for r, _, _ in items), tuple(v for _, v, _ in items))
    return out


def table_from_doc(doc: Any, file: str) -> LatencyTable:
    """A table from a parsed JSON document in either format; TableError naming the field if it is not usable."""
    if not isinstance(doc, dict):
        raise TableError(file, "(top level)", "expected a JSON object")
    if "format" in doc:
        return _from_table(doc, file)
    if "results" in doc:
        return table_from_sweep(doc, file)
    raise TableError(file, "format", f"missing: expected {FORMAT!r}, or a routescope sweep JSON (with `results`)")


def _from_table(doc: dict, file: str) -> LatencyTable:
    try:
        t = TableIn.model_validate(doc)
    except ValidationError as exc:
        _raise_first(file, exc)
    for i, lay in enumerate(t.layouts):
        _check_layout(file, f"layouts[{i}]", lay)
    pts: dict[tuple, list] = {}
    for i, p in enumerate(t.points):
        for lay in _layouts_of(file, f"points[{i}].layout", p.layout, t.layouts):
            lo = p.low_us if p.low_us is not None else p.us
            hi = p.high_us if p.high_us is not None else p.us
            pts.setdefault((p.kernel, p.topk, lay, t.q_dtype, t.kv_dtype, p.kv_pool_bytes), []).append(
                (p.rows, (lo, p.us, hi), f"points[{i}].rows"))
    rts: dict[tuple, list] = {}
    for i, r in enumerate(t.ratios):
        if r.kernel == r.over:
            raise TableError(file, f"ratios[{i}].over", f"a ratio needs two kernels; both are {r.kernel}")
        if not any(k[0] == r.kernel for k in pts):
            raise TableError(file, f"ratios[{i}].kernel", f"no absolute points for {r.kernel}: nothing to derive "
                                                          f"{r.over} from")
        for lay in _layouts_of(file, f"ratios[{i}].layout", r.layout, t.layouts):
            rts.setdefault((r.kernel, r.over, r.topk, lay, t.q_dtype, t.kv_dtype), []).append(
                (r.rows, (r.ratio,) * 3, f"ratios[{i}].rows"))
    pooled = sorted({k[5] for k in pts if k[5] is not None})
    if t.kv_pools and sorted(t.kv_pools) != pooled:
        raise TableError(file, "kv_pools", f"lists {sorted(t.kv_pools)} but the points are timed at {pooled}")
    if pooled and any(k[5] is None for k in pts):
        raise TableError(file, "points", "some points name their kv pool and some do not: every point needs one")
    meta = TableMeta(t.name, t.device, t.arch, t.date, t.provenance, t.source, file, t.command, t.commit, t.heads,
                     tuple(t.notes), pools=tuple(pooled))
    return LatencyTable(meta, _curves(file, pts), _curves(file, rts))


def _layouts_of(file: str, where: str, layout: str | None, layouts: list[str]) -> list[str]:
    if layout is None:
        return list(layouts)
    if layout not in layouts:
        raise TableError(file, where, f"{layout!r} is not one of the table's layouts {layouts}")
    return [layout]


def arch_of_device(device: str) -> str | None:
    low = device.lower()
    return next((arch for key, arch in _DEVICE_ARCH if key in low), None)


def table_from_sweep(doc: dict, file: str, *, date: str | None = None, commit: str | None = None) -> LatencyTable:
    """A table from ``routescope sweep``'s JSON (its ``device`` and ``results``), measured here."""
    try:
        s = SweepIn.model_validate(doc)
    except ValidationError as exc:
        _raise_first(file, exc)
    arch = arch_of_device(s.device)
    if arch is None:
        raise TableError(file, "device", f"{s.device!r}: which arch's routing it prices is unknown "
                                         "(known: H100/H200 -> sm90, MI300/MI325 -> gfx942, MI350/MI355 -> gfx950, cpu)")
    timed: dict[tuple, dict[int, dict[str, tuple]]] = {}  # series -> rows -> impl -> (lo, mid, hi), where
    again: list[str] = []
    for i, r in enumerate(s.results):
        _check_layout(file, f"results[{i}].layout", r.layout)
        lo = min(r.p20_us if r.p20_us is not None else r.median_us, r.median_us)
        hi = max(r.p80_us if r.p80_us is not None else r.median_us, r.median_us)
        key = (r.kernel, r.topk, r.layout, r.dtype, r.kv_dtype or r.dtype, _result_pool(r) if s.kv_pools else None)
        at = timed.setdefault(key, {}).setdefault(r.rows, {})
        if (r.impl or "") in at:  # e.g. Gluon handed these calls to Triton, which the sweep also timed
            again.append(f"results[{i}]")
            continue
        at[r.impl or ""] = ((lo, r.median_us, hi), f"results[{i}].rows")
    pts, notes = _preferred_points(timed)
    if again:
        notes.append(f"{', '.join(again[:5])}{' and more' if len(again) > 5 else ''}: a second timing of an "
                     "implementation at a point it was timed at already (one handed the calls to another): the "
                     "first kept")
    heads = {r.heads for r in s.results if r.heads}
    timers = sorted({r.timer for r in s.results if r.timer})
    notes.insert(0, f"median per call; band p20-p80 of {', '.join(timers) or 'its'} timings")
    if doc.get("kv_pool"):
        notes.insert(1, str(doc["kv_pool"]))
    noisy, tolerance = noisy_in_document(doc)
    labels = {doc.get("a"), doc.get("b")} - {None}
    points = sum(1 for r in s.results if not labels or f"{r.kernel}:{r.impl or ''}" in labels)
    pooled = tuple(sorted({k[5] for k in pts if k[5] is not None}))
    meta = TableMeta(
        name=Path(file).stem, device=s.device, arch=arch, date=date or s.date or NOT_RECORDED,
        provenance=MEASURED, source="routescope sweep", file=file, command=s.command or None,
        commit=commit or s.commit, heads=heads.pop() if len(heads) == 1 else None, notes=tuple(notes),
        noise=noise_sentence(noisy, points, tolerance) if noisy else None, pools=pooled,
    )
    return LatencyTable(meta, _curves(file, pts))


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def _result_pool(r: SweepResultIn) -> int | None:
    """A sweep result's kv pool in bytes: recorded, or its slots x head dim x the pool's element size."""
    if r.kv_pool_bytes is not None:
        return r.kv_pool_bytes
    if r.kv_len is None or r.head_dim is None:
        return None
    return r.kv_len * r.head_dim * _ITEMSIZE.get(r.kv_dtype or r.dtype, 1)


def impl_rank(impl: str) -> tuple[int, str]:
    """Sort key: the dispatcher's preference (``IMPL_PREFERENCE``), then other names, then none ("")."""
    if impl in IMPL_PREFERENCE:
        return IMPL_PREFERENCE.index(impl), impl
    return (len(IMPL_PREFERENCE), impl) if impl else (len(IMPL_PREFERENCE) + 1, "")


def _preferred_points(timed: dict[tuple, dict[int, dict[str, tuple]]]) -> tuple[dict[tuple, list], list[str]]:
    """Each series' points, at each row count the implementation the dispatcher prefers among those timed
    there; and a note per kernel that had several, naming which priced it. Pure."""
    pts: dict[tuple, list] = {}
    used: dict[str, set[str]] = {}
    seen: dict[str, set[str]] = {}
    for key, by_rows in timed.items():
        for rows, by_impl in by_rows.items():
            impl = min(by_impl, key=impl_rank)
            value, where = by_impl[impl]
            pts.setdefault(key, []).append((rows, value, where))
            used.setdefault(key[0], set()).add(impl)
            seen.setdefault(key[0], set()).update(by_impl)
    notes = [f"{kernel}: timed as {_names(seen[kernel])}; priced with {_names(used[kernel])}, at each point the one "
             f"the dispatcher would launch ({', '.join(IMPL_PREFERENCE)}, in that order)"
             for kernel in sorted(seen) if len(seen[kernel]) > 1]
    return pts, notes


def _names(impls: Iterable[str]) -> str:
    return ", ".join(i or "(unnamed)" for i in sorted(impls, key=impl_rank))


def sweep_to_table_doc(sweep: dict, *, name: str, date: str, commit: str, source: str, file: str) -> dict:
    """A sweep JSON as a routescope-latency-table/1 document (how advise/data/h200-sweep-cupti.json is made)."""
    t = table_from_sweep(sweep, file, date=date, commit=commit)
    layouts = sorted({k[2] for k in t.series})
    (q_dtype,), (kv_dtype,) = {k[3] for k in t.series}, {k[4] for k in t.series}
    points = []
    for k, c in sorted(t.series.items(), key=lambda kv: (kv[0][:5], kv[0][5] or 0)):
        pool = {} if k[5] is None else {"kv_pool_bytes": k[5]}
        where = "" if k[5] is None else f" pool {format_bytes(k[5])}"
        points += [{"kernel": k[0], "rows": int(r), "topk": k[1], "layout": k[2], "us": round(v[1], 3),
                    "low_us": round(v[0], 3), "high_us": round(v[2], 3), **pool,
                    "source": f"{source}: {k[0]} top-k {k[1]} layout {k[2]}{where} rows {int(r)}"}
                   for r, v in zip(c.rows, c.values)]
    return {"format": FORMAT, "name": name, "device": t.meta.device, "arch": t.meta.arch, "date": date,
            "provenance": MEASURED, "source": source, "command": t.meta.command, "commit": commit,
            "heads": t.meta.heads, "q_dtype": q_dtype, "kv_dtype": kv_dtype, "layouts": layouts,
            "kv_pools": list(t.meta.pools), "notes": list(t.meta.notes), "points": points}


def read_json(path: Path, file: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TableError(file, "(file)", "no such file") from None
    except json.JSONDecodeError as exc:
        raise TableError(file, f"line {exc.lineno} column {exc.colno}", f"not JSON: {exc.msg}") from None


def shipped_path(name: str) -> Path:
    return Path(str(resources.files("advise") / "data" / SHIPPED[name]))


def load_table(spec: str) -> LatencyTable:
    """A shipped table by name (``gfx942``, ``h200``) or a file (either format)."""
    if spec in SHIPPED:
        path = shipped_path(spec)
        return table_from_doc(read_json(path, f"advise/data/{SHIPPED[spec]}"), f"advise/data/{SHIPPED[spec]}")
    path = Path(spec)
    return table_from_doc(read_json(path, spec), spec)
