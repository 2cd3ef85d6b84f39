"""Totals rebuilt from exported metric families: every process's series, for snapshot() in multiprocess mode.

A multiprocess directory holds each process's totals as prometheus_client files
(``writer.MultiprocWriter``); its collector merges them into families. This turns those
families back into a ``Totals`` summed over processes and ranks, so ``snapshot()`` (and the
service's ``/routing``) can show what every rank routed, not only the serving process.
Pure: families in, ``Totals`` out.

What the files do not hold stays out: ``would_dip`` (in the snapshot only, never exported),
and per-process state such as recent decisions, first decode-in-prefill occurrences and health.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..native import counts_from_native
from ..prom import LE
from ..spec import ALL
from ..view import Key, Totals

_BY_FAMILY = {s.base: s for s in ALL}  # family names: counters without "_total", the others as named


def totals_from_families(families: Iterable[Any]) -> Totals:
    """Sum every routescope family's samples over ``rank`` (and processes) into Totals keyed as ``view`` keys them."""
    t = Totals()
    cum: dict[Key, dict[str, float]] = {}
    sums: dict[Key, float] = {}
    for fam in families:
        spec = _BY_FAMILY.get(fam.name)
        if spec is None:
            continue
        keep = tuple(lab for lab in spec.labels if lab != "rank")
        out = getattr(t, spec.field)
        for s in fam.samples:
            key = tuple(s.labels.get(lab, "") for lab in keep)
            if spec.kind == "counter":
                if s.name == spec.name:  # not a _created sample
                    out[key] = out.get(key, 0) + int(round(s.value))
            elif spec.kind == "histogram":
                if s.native_histogram is not None:
                    native = counts_from_native(s.native_histogram)
                    have = t.latency_native.get(key)
                    if have is None:
                        t.latency_native[key] = native
                    else:
                        have.merge(native)
                elif s.name == spec.name + "_bucket":
                    le = s.labels.get("le", "")
                    per = cum.setdefault(key, {})
                    per[le] = per.get(le, 0.0) + s.value
                elif s.name == spec.name + "_sum":
                    sums[key] = sums.get(key, 0.0) + s.value
            elif s.name == spec.name:
                out[key] = max(out.get(key, s.value), s.value)
    for key, per in cum.items():
        counts, prev = [], 0
        for le in LE:  # cumulative bucket counts back to per-bucket counts, in the exporter's bucket order
            c = int(round(per.get(le, prev)))
            counts.append(max(0, c - prev))
            prev = max(prev, c)
        t.latency[key] = (counts, sums.get(key, 0.0))
    return t
