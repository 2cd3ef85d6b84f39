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
value, before its classic samples, as telemetry.prom yields it for one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import NativeHistogram, Sample
from prometheus_client.utils import floatToGoString

from ..native import NativeCounts, native_histogram
from .mpfile import NATIVE_INDEX

LabelsKey = tuple  # sorted (label, value) pairs
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


class Plan:
    """Slots for every merged series of a set of file layouts, and the order the families yield them in."""

    def __init__(self, files: Sequence[tuple[str, Any]], labels: dict[tuple, dict[str, str]] | None = None) -> None:
        """``files``: (file name, Layout) in read order; ``series_of`` gives each entry's merged series once.

        ``labels``: the label dicts of earlier plans, by series; a series keeps its dict across plans, so an
        encoder that keeps each line's head by dict (telemetry.exposition.text) still finds it."""
        self._labels = labels if labels is not None else {}
        self._sum_slots: dict[tuple, int] = {}
        self._max_slots: dict[tuple, int] = {}
        self._families: dict[str, _Family] = {}
        entry_slots, is_max = [], []
        for name, layout in files:
            if layout.series is None:
                layout.series = series_of(name, layout.keys)
            slots = [self._slot(s) for s in layout.series]
            entry_slots.append(np.asarray([slot for _m, slot in slots], dtype=np.intp))
            is_max.append(np.asarray([m for m, _slot in slots], dtype=bool))
        slot_of = np.concatenate(entry_slots) if entry_slots else np.zeros(0, np.intp)
        maxed = np.concatenate(is_max) if is_max else np.zeros(0, bool)
        self.sum_pos = np.flatnonzero(~maxed)
        self.sum_slot = slot_of[self.sum_pos]
        self.max_pos = np.flatnonzero(maxed)
        self.max_slot = slot_of[self.max_pos]
        self.n_sum, self.n_max = len(self._sum_slots), len(self._max_slots)
        self._layout_out()

    def _slot(self, series: tuple) -> tuple[bool, int]:
        """(maxed, slot): the merged series an entry adds to (or, for a gauge, takes the maximum with)."""
        got = self._sum_slots.get(series)
        if got is not None:
            return False, got
        got = self._max_slots.get(series)
        if got is not None:
            return True, got
        what, typ, metric, help_text, key, part = series
        fam = self._families.get(metric)
        if fam is None:
            fam = self._families[metric] = _Family(metric, help_text, typ)
        if what == "n":
            slot = fam.native.setdefault(key, {}).setdefault(part, self._new(self._sum_slots, series))
            return False, slot
        if what == "b":
            return False, fam.buckets.setdefault(key, {}).setdefault(part, self._new(self._sum_slots, series))
        maxed = what == "g"
        new = (maxed, self._new(self._max_slots if maxed else self._sum_slots, series))
        return fam.groups.setdefault(key, {}).setdefault((part, key), new)

    @staticmethod
    def _new(slots: dict[tuple, int], key: tuple) -> int:
        slot = slots.get(key)
        if slot is None:
            slot = slots[key] = len(slots)
        return slot

    def _layout_out(self) -> None:
        """Per family, the samples' (name, labels) in yield order and where each value comes from in ``values``."""
        names_labels: list[tuple[str, dict]] = []
        src: list[int] = []  # index into concat(sums, maxes, cumulative buckets)
        cum_order: list[int] = []
        cum_starts: list[int] = []
        self.families: list[tuple[str, str, str, int, int, list[tuple[int, int]]]] = []
        self.natives: list[tuple[str, dict, list[Any], np.ndarray]] = []  # (metric, labels, parts, slots)
        n_sum, n_max = self.n_sum, self.n_max
        for fam in self._families.values():
            start = len(src)
            native_at: list[tuple[int, int]] = []  # (position in the family's samples, index into self.natives)
            if fam.typ == "histogram":
                series = list(dict.fromkeys([*fam.groups, *fam.buckets, *fam.native]))
            else:
                series = list(fam.groups)
            for key in series:
                labels = self._labels_of(key)
                nat = fam.native.get(key)
                if nat:
                    native_at.append((len(src) - start, len(self.natives)))
                    parts = list(nat)
                    self.natives.append((fam.name, labels, parts, np.asarray([nat[p] for p in parts], np.intp)))
                bounds = fam.buckets.get(key)
                if bounds:
                    cum_starts.append(len(cum_order))
                    for bound in sorted(bounds):
                        le = floatToGoString(bound)
                        names_labels.append((fam.name + "_bucket", self._labels_of(key, le)))
                        src.append(n_sum + n_max + len(cum_order))
                        cum_order.append(bounds[bound])
                    names_labels.append((fam.name + "_count", labels))
                    src.append(src[-1])
                for (sample, _key), (maxed, slot) in fam.groups.get(key, {}).items():
                    if bounds and sample == fam.name + "_count":
                        continue  # the last bucket is the count, as prometheus_client's collector makes it
                    names_labels.append((sample, labels))
                    src.append(n_sum + slot if maxed else slot)
            self.families.append((fam.name, fam.help, fam.typ, start, len(src), native_at))
        self.names_labels = names_labels
        self.src = np.asarray(src, dtype=np.intp)
        self.cum_order = np.asarray(cum_order, dtype=np.intp)
        self.cum_starts = np.asarray(cum_starts, dtype=np.intp)
        self._native_memo: list[tuple[tuple, NativeHistogram] | None] = [None] * len(self.natives)

    def _labels_of(self, key: LabelsKey, le: str | None = None) -> dict[str, str]:
        got = self._labels.get((key, le))
        if got is None:
            got = self._labels[(key, le)] = dict(key) if le is None else {**dict(key), "le": le}
        return got

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
        """One native sample per latency series with samples; a series whose counts did not move keeps its value."""
        out: list[Sample | None] = []
        for i, (metric, labels, parts, slots) in enumerate(self.natives):
            got = tuple(values[slots].tolist())
            memo = self._native_memo[i]
            if memo is None or memo[0] != got:
                counts = NativeCounts()
                for part, v in zip(parts, got):
                    if part == "count":
                        counts.count = int(v)
                    elif part == "zero":
                        counts.zero = int(v)
                    elif part == "sum_ns":
                        counts.sum_ns = int(v)
                    elif v:
                        counts.buckets[part] = int(v)
                memo = self._native_memo[i] = (got, native_histogram(counts))
            nh = memo[1]
            out.append(Sample(metric, labels, nh.count_value, None, None, nh) if nh.count_value else None)
        return out
