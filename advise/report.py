"""The advice as typed JSON (the CLI's ``--json`` and ``/routing``'s ``advice``), built from traffic and tables.

Every figure here is a prediction: a latency table times the observed calls. The output says
which table (device, date, measured here or published) each figure rests on, and leaves a
figure out, with the reason, where no table covers the calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, Field

from dispatcher.pools import format_bytes
from dispatcher.types import Kernel

from .latency import LatencyModel, Miss, Shape
from .policies import DEFAULT_GATES, Candidate, Target, candidates, launches, target_for
from .scan import ESTIMATE, Band, Priced, price_model
from .tables import LatencyTable, TableMeta
from .traffic import Traffic, demo_shapes

PREDICTION = ("predicted: the observed calls (calls and mean rows per rows bucket) times a latency table; "
              "nothing here was measured on this traffic")
BAND = ("band: lowest to highest over the power-law and linear interpolants between timed rows (between rows more "
        "than 2x apart, also every curve from flat to proportional to rows), each kernel's timings at their low, "
        "middle or high value (a sweep's p20/median/p80), across the kv pools a call is priced between, and calls "
        "at their bucket's mean rows or spread to its edges; the estimate is power-law, middle, mean")
BEST_KINDS = ("gate", "counterfactual")
# Savings this close are one choice: far inside any table's own spread (a sweep's p20-p80 is about 1%), so which of
# them is "best" would be noise; the tie goes to the kernels' crossing (``_best``).
TIE = 1e-3
# What a share is of: only prefill-entry calls are priced (the decode entry's calls are not in the traffic aggregate),
# so a saving is a share of their predicted kernel time, not of all sparse-attention time.
SHARE_OF = "of the predicted prefill-entry kernel time"


class BandOut(BaseModel):
    mid: float = Field(description="the estimate")
    low: float
    high: float

    @classmethod
    def of(cls, band: Band | None, factor: float | None = 1.0) -> BandOut | None:
        if band is None or factor is None:
            return None
        b = band.scaled(factor)
        return cls(mid=b.mid, low=b.low, high=b.high)


class TableOut(BaseModel):
    name: str
    device: str
    arch: str
    date: str
    provenance: Literal["measured here", "published, not measured here"]
    source: str
    file: str
    command: str | None = None
    commit: str | None = None
    kv_pools: list[int] = Field([], description="the kv pools (bytes) the table times; empty: not recorded")
    notes: list[str] = []
    noise: str | None = Field(None, description="why no gate is recommended from this table (a sweep's noisy "
                                                "points); null: its spread is within its tolerance")

    @classmethod
    def of(cls, m: TableMeta) -> TableOut:
        return cls(name=m.name, device=m.device, arch=m.arch, date=m.date, provenance=m.provenance, source=m.source,
                   file=m.file, command=m.command, commit=m.commit, kv_pools=list(m.pools), notes=list(m.notes),
                   noise=m.noise)


class Unpriced(BaseModel):
    reason: str
    calls: int


class CandidateOut(BaseModel):
    """One policy's predicted kernel time on the traffic, and its saving against the active policy."""

    name: str
    kind: Literal["active", "counterfactual", "gate", "guard", "fix"]
    label: str
    gate: int | None = Field(None, description="the gate (rows) it stands for")
    calls: int
    covered_calls: int = Field(description="calls a table prices; the totals cover these only")
    seconds: BandOut | None = Field(None, description="predicted kernel seconds of the covered calls")
    seconds_per_hour: BandOut | None = Field(None, description="the same per hour of traffic; null: span unknown")
    uncovered: list[Unpriced] = []
    moved_calls: int = Field(0, description="calls it sends to another kernel than the active policy does")
    saving: BandOut | None = Field(None, description="kernel seconds saved against the active policy (negative: "
                                                     "a cost); null when a moved call is outside the table")
    saving_per_hour: BandOut | None = None
    saving_share: BandOut | None = Field(None, description="saving / the active policy's predicted kernel time of the "
                                                           "prefill-entry calls (decode-entry calls are not priced)")
    saving_note: str | None = None
    tables: list[str] = []


class DecodeCostOut(BaseModel):
    """What the decode rows that reached a prefill kernel cost, against sending them to the decode entry."""

    calls: int = 0
    decode_rows: int = 0
    cost: BandOut | None = None
    cost_per_hour: BandOut | None = None
    pure_decode: BandOut | None = Field(None, description="of it, pure-decode calls (what the guard's reroute fixes)")
    mixed: BandOut | None = Field(None, description="of it, decode rows inside mixed batches")
    note: str = ""


class ModelAdviceOut(BaseModel):
    model: str
    calls: int
    rows: int
    shapes: list[str] = Field(description="top-k, layout and dtypes seen, as priced")
    candidates: list[CandidateOut] = Field(description="the active policy first")
    best: str | None = Field(None, description="the gate or counterfactual predicted to save the most; null: keep")
    headline: str
    decode_in_prefill: DecodeCostOut


class TargetOut(BaseModel):
    arch: str = Field(description="the arch whose routing is priced (the tables')")
    platform_arch: str = Field(description="where the traffic ran")
    what_if: bool = Field(description="true when the traffic is priced as if on another device")
    note: str = ""


class SourceOut(BaseModel):
    kind: str = Field(description="routing, multiproc, prometheus, replay")
    where: str
    span_s: float | None = Field(None, description="seconds of traffic; null: unknown (no per-hour figures)")
    span_note: str = ""


class AdviceOut(BaseModel):
    """`routescope advise --json`, and /routing's `advice`."""

    status: Literal["ok", "no_table", "no_traffic", "error"]
    message: str = ""
    prediction: str = PREDICTION
    band: str = BAND
    target: TargetOut | None = None
    tables: list[TableOut] = []
    source: SourceOut
    notes: list[str] = []
    models: list[ModelAdviceOut] = []


def fmt_seconds(s: float, digits: int = 3) -> str:
    """``digits`` significant digits (at least whole seconds) in the unit they round into (999.6 µs prints as
    1 ms, never as 1e+03 µs)."""
    if abs(s) >= 99.95:
        return f"{s:.{max(0, digits - 3)}f} s"
    for scale, unit in ((1e6, "µs"), (1e3, "ms")):
        if abs(float(text := f"{s * scale:.{digits}g}")) < 1000:
            return f"{text} {unit}"
    return f"{s:.{digits}g} s"


def fmt_share(x: float, *, sign: bool = False) -> str:
    """A share as a percentage with the digits it needs: 1.5%, 0.0016%."""
    p = x * 100
    text = f"{p:+.2g}%" if sign else f"{p:.2g}%"
    if abs(p) >= 1:
        text = f"{p:+.1f}%" if sign else f"{p:.1f}%"
    return text


def fmt_band(b: BandOut, hourly: bool) -> str:
    span = "an hour" if hourly else "over the traffic"
    return f"{fmt_seconds(b.mid)} of kernel time {span} (band {fmt_seconds(b.low)} to {fmt_seconds(b.high)})"


def _candidate(p: Priced, active: Priced, per_hour: float | None) -> CandidateOut:
    c = p.candidate
    saving = None if p is active else p.saving
    note = None
    if p is not active and saving is None:
        reason, calls = p.delta_unknown.most_common(1)[0]
        note = f"unknown: {calls} moved calls have no price ({reason})"
    share = None
    base = active.seconds
    if saving is not None and base is not None and base.mid > 0 and not active.uncovered:
        share = BandOut.of(saving, 1.0 / base.mid)
    return CandidateOut(
        name=c.name, kind=c.kind, label=c.label, gate=c.gate, calls=p.calls, covered_calls=p.covered_calls,
        seconds=BandOut.of(p.seconds), seconds_per_hour=BandOut.of(p.seconds, per_hour),
        uncovered=[Unpriced(reason=r, calls=n) for r, n in p.uncovered.most_common()],
        moved_calls=p.moved_calls, saving=BandOut.of(saving), saving_per_hour=BandOut.of(saving, per_hour),
        saving_share=share, saving_note=note, tables=sorted(p.tables),
    )


def crossing(lm: LatencyModel, entries: Sequence, target: Target) -> int | None:
    """Where the split-K kernel stops being faster than the in-tree prefill for this model's commonest call shape:
    the smallest timed power of two of rows at which the prefill's estimate is no slower. None on targets whose gate
    moves AITER's threshold, or where the table cannot tell."""
    if target.gate_field or not entries:
        return None
    e = max(entries, key=lambda x: x.calls)
    shape = Shape(e.topk, e.layout, e.q_dtype, e.kv_dtype, e.kv_pool_bytes)
    for rows in (1 << i for i in range(15)):
        split, prefill = (lm.price(k, shape, rows, rows, rows) for k in (Kernel.INTREE_SPARSE_DECODE.value,
                                                                         Kernel.INTREE_RAGGED_PREFILL.value))
        if isinstance(split, Miss) or isinstance(prefill, Miss):
            continue
        if prefill.seconds[ESTIMATE] <= split.seconds[ESTIMATE]:
            return rows
    return None


def _best(outs: Sequence[CandidateOut], toward: int | None = None) -> tuple[CandidateOut | None, list[int]]:
    """The candidate saving the most, and every gate that saves as much (no calls fall between them).

    Among gates that save as much, the one nearest ``toward`` (where the two kernels cross for the model's
    calls: a call that later falls between those gates is then sent to the faster kernel), else the one
    nearest the active gate: the smallest change that gets it.
    """
    pool = [c for c in outs if c.kind in BEST_KINDS and c.saving is not None and c.saving.mid > 0]
    if not pool:
        return None, []
    top = max(c.saving.mid for c in pool)
    tied = [c for c in pool if abs(c.saving.mid - top) <= TIE * abs(top)]
    here = math.log(toward if toward else max(outs[0].gate or 1, 1))
    best = min(tied, key=lambda c: abs(math.log(max(c.gate or 1, 1)) - here) if c.kind == "gate" else -1.0)
    return best, sorted(c.gate for c in tied if c.kind == "gate" and c.gate is not None)


def _what(best: CandidateOut, active: CandidateOut, target: Target) -> str:
    if best.kind == "counterfactual":
        return f"the {best.name} policy ({best.label})"
    if target.gate_field:
        return f"moving the {target.gate_prefix} gate from {active.gate or 0} to {best.gate} rows"
    return f"sending prefill-entry calls under {best.gate} rows to the split-K kernel"


def _headline(model: str, outs: list[CandidateOut], best: CandidateOut | None, ties: list[int],
              dip: DecodeCostOut, target: Target, tables: str, noisy: Sequence[TableMeta] = ()) -> str:
    active = outs[0]
    hourly = active.seconds_per_hour is not None
    if tables.startswith("no table"):
        return f"{model}: no prediction, {tables.removeprefix('no table: ')}."
    if noisy:
        text = (f"{model}: no recommendation, the sweep table {noisy[0].name} is too noisy to place a gate on "
                f"({noisy[0].noise}; time it again with more --repeats, or on a GPU)")
    elif best is None:
        text = f"{model}: no scanned gate is predicted to save time against the active policy ({active.label})"
    else:
        saving = best.saving_per_hour if hourly else best.saving
        share = f"{fmt_share(best.saving_share.mid)} {SHARE_OF}, " if best.saving_share else ""
        text = f"{model}: {_what(best, active, target)} would have saved {share}{fmt_band(saving, hourly)}"
        if best.saving.low <= 0:  # the estimate saves, its band does not: say so before anyone moves a gate
            text = (f"{model}: no confident recommendation: the best estimate, {_what(best, active, target)}, "
                    f"saves {share}{fmt_band(saving, hourly)}, a band that reaches no saving (measure it: "
                    "`routescope bench ab`, or an experiment)")
        if len(ties) > 1:
            text += (f" (any gate from {ties[0]} to {ties[-1]} rows saves as much, to within {TIE:.1%}: few or no "
                     "calls fall between them)")
    if dip.calls:
        cost = dip.cost_per_hour if hourly else dip.cost
        text += ("; the decode rows that reached a prefill kernel cost "
                 + (fmt_band(cost, hourly) if cost else "an unknown amount (" + dip.note + ")"))
    return f"{text}. Predicted from {tables}."


def _decode_cost(by_name: dict[str, Priced], per_hour: float | None) -> DecodeCostOut:
    fix = by_name["fix_all"]
    if not fix.moved_calls:
        return DecodeCostOut(note="no decode rows reached a prefill kernel")
    out = DecodeCostOut(calls=fix.moved_calls, decode_rows=fix.moved_decode_rows,
                        cost=BandOut.of(fix.saving), cost_per_hour=BandOut.of(fix.saving, per_hour),
                        pure_decode=BandOut.of(by_name["fix_pure"].saving), mixed=BandOut.of(by_name["fix_mixed"].saving))
    if fix.saving is None:
        reason, calls = fix.delta_unknown.most_common(1)[0]
        out.note = f"{calls} of these calls have no price: {reason}"
    else:
        out.note = ("against the same rows with decode rows on the split-K decode kernel: pure decodes whole, "
                    "mixed batches as a prefill call and a decode call")
    return out


def _unpriced(active: CandidateOut) -> str:
    """"no table: ..." with why nothing was priced (the commonest reasons and their calls)."""
    if not active.uncovered:
        return "no table: there was no call to price"
    why = "; ".join(f"{u.calls} calls: {u.reason}" for u in active.uncovered[:2])
    more = f"; {len(active.uncovered) - 2} other reasons in --json" if len(active.uncovered) > 2 else ""
    return f"no table: none of the tables given prices these calls ({why}{more})"


def advise_model(model: str, traffic: Traffic, cands: list[Candidate], target: Target, lm: LatencyModel,
                 per_hour: float | None, recorded: bool) -> ModelAdviceOut:
    entries = [e for e in traffic.entries if e.model == model]
    priced = price_model(entries, cands, target, lm, recorded=recorded)
    active = priced[0]
    outs = [_candidate(p, active, per_hour) for p in priced]
    used = set().union(*(p.tables for p in priced))
    noisy = [m for m in lm.metas if m.name in used and m.noise]
    best, ties = (None, []) if noisy else _best(outs, crossing(lm, entries, target))
    dip = _decode_cost({p.candidate.name: p for p in priced}, per_hour)
    names = ", ".join(m.describe() for m in lm.metas if m.name in used)
    shapes = sorted({f"top-k {e.topk}, {e.layout}, q/kv {e.q_dtype}/{e.kv_dtype}"
                     + (f", kv pool {format_bytes(e.kv_pool_bytes)}+" if e.kv_pool_bytes else "") for e in entries})
    return ModelAdviceOut(
        model=model, calls=sum(e.calls for e in entries), rows=sum(e.rows for e in entries), shapes=shapes,
        candidates=outs, best=best.name if best else None,
        headline=_headline(model, outs, best, ties, dip, target, names or _unpriced(outs[0]), noisy),
        decode_in_prefill=dip,
    )


def pricing_notes(traffic: Traffic, cands: list[Candidate], target: Target, lm: LatencyModel, *,
                  recorded: bool) -> list[str]:
    """How the active policy's calls were priced, where a reader should know: which kv pools, which wide gaps."""
    notes: dict[str, None] = {}
    for model in traffic.models:
        entries = [e for e in traffic.entries if e.model == model]
        for p in price_model(entries, cands[:1], target, lm, recorded=recorded):
            notes.update(dict.fromkeys(p.notes))
    return list(notes)


def advise(traffic: Traffic, tables: Sequence[LatencyTable], *, gates: Iterable[int] = DEFAULT_GATES,
           source_kind: str = "routing", target_note: str = "") -> AdviceOut:
    """The advice for ``traffic`` priced with ``tables`` (all of one arch); no tables: say so, no figures."""
    source = SourceOut(kind=source_kind, where=traffic.source, span_s=traffic.span_s, span_note=traffic.span_note)
    notes = list(traffic.notes)
    if not tables:
        return AdviceOut(status="no_table", message=target_note or f"no latency table covers {traffic.platform_arch}",
                         source=source, notes=notes)
    lm = LatencyModel(tables)
    target = target_for(lm.arch)
    what_if = traffic.platform_arch != target.arch
    out_target = TargetOut(arch=target.arch, platform_arch=traffic.platform_arch, what_if=what_if, note=target_note)
    table_outs = [TableOut.of(t.meta) for t in tables]
    if not traffic.entries:
        return AdviceOut(status="no_traffic", message="no prefill-entry calls seen yet", target=out_target,
                         tables=table_outs, source=source, notes=notes)
    shapes = demo_shapes(traffic.demo, traffic.models)
    if shapes is not None and shapes.by_model:
        traffic = replace(traffic, entries=shapes.apply(traffic.entries))
        notes.append(shapes.note())
    cands = candidates(traffic, target, gates)
    if traffic.counterfactuals and not target.gate_field:
        names = ", ".join(p.name for p in traffic.counterfactuals)
        notes.append(f"counterfactuals {names} move gfx942/gfx950 gates, which do nothing on {target.arch}: left out")
    if not what_if:
        off = sum(e.calls for e in traffic.entries
                  if launches(e, cands[0], target, recorded=False)[0].kernel != e.kernel)
        if off:
            notes.append(f"{off} calls ran on another kernel than the active policy picks on a {target.arch} with "
                         "AITER enabled (AITER off or not importable there?); the other candidates assume it enabled")
    per_hour = 3600.0 / traffic.span_s if traffic.span_s else None
    models = [advise_model(m, traffic, cands, target, lm, per_hour, recorded=not what_if) for m in traffic.models]
    notes += pricing_notes(traffic, cands, target, lm, recorded=not what_if)
    return AdviceOut(status="ok", target=out_target, tables=table_outs, source=source, notes=notes, models=models)
