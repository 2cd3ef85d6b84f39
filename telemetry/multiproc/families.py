"""Every file's values merged into metric families, as prometheus_client's collector merges them, in a few array ops.

A ``Plan`` is built once per set of file layouts (``reader.Layout``: which series each value of a file is). It
gives every merged series a slot; a scrape then only sums (counters, histograms, native buckets) or takes the
maximum (``livemax`` gauges) of the files' value arrays into those slots (``numpy.bincount``), accumulates the
histogram buckets, and zips the values with the series' names and labels, which the plan built once. While no
process adds a series or starts or ends, every scrape reuses the plan.

The result is what ``MultiProcessCollector._accumulate_metrics`` gives for the same files: counters and
histogram ``_sum`` summed over files, ``_bucket`` summed per bound and made cumulative, ``_count`` the last
bucket, ``livemax`` gauges the maximum over processes without a ``pid`` label. Each latency series also gets
its native buckets (the ``*.ndb`` files, summed bucket by bucket) as one sample with a ``native_histogram``
value, before its classic samples, as telemetry.prom yields it for one process. A series whose native part does
not add up, or disagrees with its classic part (``native.contradiction``: part of it lost with a quarantined
file, a failed write, a full disk), gets no native sample: it is served classic-only, and ``Plan.classic_only``
says which and why, until the parts agree again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import NativeHistogram, Sample
from prometheus_client.utils import floatToGoString

from ..native import NativeCounts, contradiction, native_histogram
from .mpfile import NATIVE_INDEX

LabelsKey = tuple  # sorted (label, value) pairs
_LE: dict[float, str] = {}  # bucket bound -> its ``le`` label, as prometheus_client writes it


def _le_of(bound: float) -> str:
    """``floatToGoString(bound)``, once per bound: a plan asks it for every bucket of every series."""
    got = _LE.get(bound)
    if got is None:
        got = floatToGoString(bound)
        if bound and len(_LE) < 4096:  # 0.0 and -0.0 are one key but two labels: never kept
            _LE[bound] = got
    return got
_new_sample = tuple.__new__  # Sample(name, labels, value) without NamedTuple's keyword handling: 80k a scrape


def series_of(name: str, keys: list) -> list[tuple]:
    """Each entry's merged series, from its file's name and key: (what, family type, metric, help, labels, part).

    ``what``: ``n`` a native part (labels without ``index``; part ``count``, ``zero``, ``sum_ns`` or the bucket
    index), ``b`` a histogram bucket (labels without ``le``; part the bound), ``g`` a gauge sample (maximum over
    files; ``pid`` never added), ``s`` any other sample (summed; part the sample name)."""
    typ = name.split("_", 1)[0]
    out = []
    for metric, sample, labels, help_text in keys:
        if typ == "native":
            index = labels.get(NATIVE_INDEX)
            key = tuple(sorted(kv for kv in labels.items() if kv[0] != NATIVE_INDEX))
            part: Any = int(index) if index is not None else sample[len(metric) + len("_native_"):]
            out.append(("n", "histogram", metric, help_text, key, part))
        elif typ == "histogram" and "le" in labels:
            key = tuple(sorted(kv for kv in labels.items() if kv[0] != "le"))
            out.append(("b", typ, metric, help_text, key, float(labels["le"])))
        else:
            out.append(("g" if typ == "gauge" else "s", typ, metric, help_text, tuple(sorted(labels.items())),
                        sample))
    return out


class _Family:
    """One metric's series as the plan lays them out; slots are indices into the plan's sum or max arrays."""

    __slots__ = ("name", "help", "typ", "groups", "buckets", "native")

    def __init__(self, name: str, help_text: str, typ: str) -> None:
        self.name, self.help, self.typ = name, help_text, typ
        self.groups: dict[LabelsKey, dict[tuple[str, LabelsKey], tuple[bool, int]]] = {}  # -> (maxed, slot)
        self.buckets: dict[LabelsKey, dict[float, int]] = {}  # histogram labels without le -> bound -> slot
        self.native: dict[LabelsKey, dict[Any, int]] = {}  # labels -> "count"/"zero"/"sum"/bucket index -> slot


class Index:
    """Every merged series seen so far, each with its slot and labels dict, kept from plan to plan.

    A plan for a new set of layouts then looks up only the layouts it has not seen (a file a process extended,
    a new process); series no file holds any more keep their slots, unused, until ``stale`` says to start over.
    """

    def __init__(self) -> None:
        self.sum_slots: dict[tuple, int] = {}
        self.max_slots: dict[tuple, int] = {}
        self.families: dict[str, _Family] = {}
        self.labels: dict[tuple, dict[str, str]] = {}  # (labels, le) -> the dict every plan yields for it
        self.layouts: dict[int, tuple[Any, np.ndarray, np.ndarray]] = {}  # id(layout) -> (layout, slots, maxed)
        # (metric, labels) -> ((parts, counts, classic count and sum), value, why it is withheld or None)
        self.natives: dict[tuple[str, LabelsKey], tuple[tuple, NativeHistogram, str | None]] = {}

    def stale(self, present: int) -> bool:
        """Mostly slots of series gone (files quarantined, processes' series no longer written): start over."""
        return len(self.sum_slots) + len(self.max_slots) > 2 * present + 4096

    def slots_of(self, name: str, layout: Any) -> tuple[np.ndarray, np.ndarray]:
        """(slot, maxed) of each entry of a layout; computed once per layout."""
        got = self.layouts.get(id(layout))
        if got is not None and got[0] is layout:
            return got[1], got[2]
        if layout.series is None:
            layout.series = series_of(name, layout.keys)
        pairs = [self._slot(s) for s in layout.series]
        slots = np.asarray([slot for _m, slot in pairs], dtype=np.intp)
        maxed = np.asarray([m for m, _slot in pairs], dtype=bool)
        self.layouts[id(layout)] = (layout, slots, maxed)
        return slots, maxed

    def keep_only(self, layouts: Sequence[Any]) -> None:
        """Forget the slot arrays of layouts no longer read."""
        live = {id(layout) for layout in layouts}
        self.layouts = {k: v for k, v in self.layouts.items() if k in live}

    def _slot(self, series: tuple) -> tuple[bool, int]:
        """(maxed, slot): the merged series an entry adds to (or, for a gauge, takes the maximum with)."""
        got = self.sum_slots.get(series)
        if got is not None:
            return False, got
        got = self.max_slots.get(series)
        if got is not None:
            return True, got
        what, typ, metric, help_text, key, part = series
        fam = self.families.get(metric)
        if fam is None:
            fam = self.families[metric] = _Family(metric, help_text, typ)
        if what == "n":
            slot = fam.native.setdefault(key, {}).setdefault(part, self._new(self.sum_slots, series))
            return False, slot
        if what == "b":
            return False, fam.buckets.setdefault(key, {}).setdefault(part, self._new(self.sum_slots, series))
        maxed = what == "g"
        new = (maxed, self._new(self.max_slots if maxed else self.sum_slots, series))
        return fam.groups.setdefault(key, {}).setdefault((part, key), new)

    @staticmethod
    def _new(slots: dict[tuple, int], key: tuple) -> int:
        slot = slots.get(key)
        if slot is None:
            slot = slots[key] = len(slots)
        return slot

    def labels_of(self, key: LabelsKey, le: str | None = None) -> dict[str, str]:
        got = self.labels.get((key, le))
        if got is None:
            got = self.labels[(key, le)] = dict(key) if le is None else {**dict(key), "le": le}
        return got


class Plan:
    """Where each value of a set of file layouts goes, and the order the families yield the merged series in."""

    def __init__(self, files: Sequence[tuple[str, Any]], index: Index) -> None:
        """``files``: (file name, Layout) in read order; ``index``: the series of earlier plans (it learns these)."""
        self._index = index
        pairs = [index.slots_of(name, layout) for name, layout in files]
        index.keep_only([layout for _n, layout in files])
        slot_of = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros(0, np.intp)
        maxed = np.concatenate([p[1] for p in pairs]) if pairs else np.zeros(0, bool)
        self.sum_pos = np.flatnonzero(~maxed)
        self.sum_slot = slot_of[self.sum_pos]
        self.max_pos = np.flatnonzero(maxed)
        self.max_slot = slot_of[self.max_pos]
        self.n_sum, self.n_max = len(index.sum_slots), len(index.max_slots)
        sum_here = np.zeros(self.n_sum, dtype=bool)
        sum_here[self.sum_slot] = True
        max_here = np.zeros(self.n_max, dtype=bool)
        max_here[self.max_slot] = True
        self.present = int(sum_here.sum() + max_here.sum())
        self.classic_only: dict[tuple[str, LabelsKey], tuple[dict, str]] = {}  # the last scrape's: labels, why
        self._layout_out(sum_here.tolist(), max_here.tolist())

    def _layout_out(self, sum_here: list[bool], max_here: list[bool]) -> None:
        """Per family, the samples' (name, labels) in yield order and where each value comes from in ``values``;
        only the series some file of this plan holds."""
        index = self._index
        names_labels: list[tuple[str, dict]] = []
        src: list[int] = []  # index into concat(sums, maxes, cumulative buckets)
        cum_order: list[int] = []
        cum_starts: list[int] = []
        self.families: list[tuple[str, str, str, int, int, list[tuple[int, int]]]] = []
        # metric, key, labels, parts, their slots, where the classic count and sum are in ``values`` (-1: none)
        self.natives: list[tuple[str, LabelsKey, dict, list[Any], np.ndarray, int, int]] = []
        n_sum, n_max = self.n_sum, self.n_max
        for fam in index.families.values():
            start = len(src)
            native_at: list[tuple[int, int]] = []  # (position in the family's samples, index into self.natives)
            if fam.typ == "histogram":
                series = list(dict.fromkeys([*fam.groups, *fam.buckets, *fam.native]))
            else:
                series = list(fam.groups)
            for key in series:
                labels = index.labels_of(key)
                nat = {p: slot for p, slot in fam.native.get(key, {}).items() if sum_here[slot]}
                bounds = {b: slot for b, slot in fam.buckets.get(key, {}).items() if sum_here[slot]}
                if nat or (fam.native and bounds):  # a native family: a series without native parts lost them
                    native_at.append((len(src) - start, len(self.natives)))
                    parts = list(nat)
                    sum_slot = fam.groups.get(key, {}).get((fam.name + "_sum", key))
                    sum_at = sum_slot[1] if sum_slot is not None and not sum_slot[0] and sum_here[sum_slot[1]] else -1
                    count_at = n_sum + n_max + len(cum_order) + len(bounds) - 1 if bounds else -1
                    self.natives.append((fam.name, key, labels, parts, np.asarray([nat[p] for p in parts], np.intp),
                                         count_at, sum_at))
                if bounds:
                    cum_starts.append(len(cum_order))
                    for bound in sorted(bounds):
                        le = _le_of(bound)
                        names_labels.append((fam.name + "_bucket", index.labels_of(key, le)))
                        src.append(n_sum + n_max + len(cum_order))
                        cum_order.append(bounds[bound])
                    names_labels.append((fam.name + "_count", labels))
                    src.append(src[-1])
                for (sample, _key), (maxed, slot) in fam.groups.get(key, {}).items():
                    if not (max_here if maxed else sum_here)[slot]:
                        continue  # no file of this plan holds it
                    if bounds and sample == fam.name + "_count":
                        continue  # the last bucket is the count, as prometheus_client's collector makes it
                    names_labels.append((sample, labels))
                    src.append(n_sum + slot if maxed else slot)
            if len(src) > start or native_at:
                self.families.append((fam.name, fam.help, fam.typ, start, len(src), native_at))
        self.names_labels = names_labels
        self.src = np.asarray(src, dtype=np.intp)
        self.cum_order = np.asarray(cum_order, dtype=np.intp)
        self.cum_starts = np.asarray(cum_starts, dtype=np.intp)

    def values(self, values: np.ndarray) -> np.ndarray:
        """Sums, maxima and cumulative buckets from the files' values, concatenated in read order."""
        sums = np.bincount(self.sum_slot, weights=values[self.sum_pos], minlength=self.n_sum)
        maxes = np.full(self.n_max, -np.inf)
        if self.n_max:
            np.maximum.at(maxes, self.max_slot, values[self.max_pos])
        cum = np.cumsum(sums[self.cum_order])
        if len(self.cum_starts) > 1:  # each series' buckets accumulate from its own first bound
            bases = np.zeros(len(self.cum_starts))
            bases[1:] = cum[self.cum_starts[1:] - 1]
            cum -= np.repeat(bases, np.diff(np.append(self.cum_starts, len(cum))))
        return np.concatenate((sums, maxes, cum))

    def families_from(self, values: np.ndarray) -> list[Metric]:
        """The merged families: every sample's value from ``values`` (as ``values`` returns them)."""
        out_values = values[self.src].tolist()
        natives = self._native_samples(values)
        samples = [_new_sample(Sample, (n, lab, v, None, None, None))
                   for (n, lab), v in zip(self.names_labels, out_values)]
        out = []
        for name, help_text, typ, start, end, native_at in self.families:
            metric = Metric(name, help_text, typ)
            if native_at:
                pieces: list[Sample] = []
                prev = start
                for at, i in native_at:
                    pieces.extend(samples[prev:start + at])
                    if natives[i] is not None:
                        pieces.append(natives[i])  # type: ignore[arg-type]
                    prev = start + at
                pieces.extend(samples[prev:end])
                metric.samples = pieces
            else:
                metric.samples = samples[start:end]
            if typ == "gauge":
                metric._multiprocess_mode = "livemax"  # type: ignore[attr-defined]
            out.append(metric)
        return out

    def _native_samples(self, values: np.ndarray) -> list[Sample | None]:
        """One native sample per latency series with samples, unless its parts contradict each other or the classic
        ones (then None, and the series is in ``classic_only``); a series whose counts did not move keeps its value."""
        out: list[Sample | None] = []
        memos = self._index.natives
        withheld: dict[tuple[str, LabelsKey], tuple[dict, str]] = {}
        for metric, key, labels, parts, slots, count_at, sum_at in self.natives:
            classic = (float(values[count_at]) if count_at >= 0 else None, float(values[sum_at]) if sum_at >= 0 else None)
            got = (tuple(parts), tuple(values[slots].tolist()), classic)
            memo = memos.get((metric, key))
            if memo is None or memo[0] != got:
                counts = NativeCounts()
                for part, v in zip(parts, got[1]):
                    if part == "count":
                        counts.count = int(v)
                    elif part == "zero":
                        counts.zero = int(v)
                    elif part == "sum_ns":
                        counts.sum_ns = int(v)
                    elif v:
                        counts.buckets[part] = int(v)
                why = contradiction(counts, *classic) if counts.count or classic[0] else None
                memo = memos[(metric, key)] = (got, native_histogram(counts), why)
            nh, why = memo[1], memo[2]
            if why is not None:
                withheld[(metric, key)] = (labels, why)
                out.append(None)
                continue
            out.append(Sample(metric, labels, nh.count_value, None, None, nh) if nh.count_value else None)
        self.classic_only = withheld
        return out
