"""Native (exponential) histogram counts for call latency: the buckets Prometheus and OpenTelemetry merge by adding.

A schema-``s`` histogram has base ``2 ** 2 ** -s``; bucket ``i`` holds values in ``(base**(i-1), base**i]`` seconds,
so at ``SCHEMA`` 4 a bucket is 4.4% wide and any quantile read from it is within that of the samples behind it.
Bucket indices follow Prometheus' own (``frexp``-based, exact at every power of two). Values of 0 go to the zero
bucket. Counts are sparse (index -> count) and kept per series; the hot path never sees them: samples reach them at
flush. ``NativeCounts`` is the one representation the exporters (text, OpenMetrics 2.0, protobuf, OpenTelemetry) and
the multiprocess files read.

Every collector hands a series' native buckets to the exposition layer the same way: beside the classic
``_bucket``/``_count``/``_sum`` samples of a histogram family, one sample named after the family whose
``native_histogram`` is ``native_histogram(counts)`` (prometheus_client's ``NativeHistogram``);
``counts_from_native(nh)`` reads one back; ``contradiction`` says when a native part may not be served beside its
classic part (the multiprocess reader then serves that series classic-only). ``ZERO_THRESHOLD_S`` is positive so that Prometheus 2.4x reads even an
empty histogram as native (it takes a histogram with no native buckets and a zero threshold of 0 for a classic one).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from prometheus_client.samples import BucketSpan, NativeHistogram

SCHEMA = 4
ZERO_THRESHOLD_S = 2.0 ** -128  # client_golang's default: below any latency, and > 0 (see the module docstring)
_PER_OCTAVE = 1 << SCHEMA
# Upper bounds of the buckets of one octave, as frexp fractions in [0.5, 1): bound j is 2 ** (j / 2**s - 1).
_OCTAVE_BOUNDS = tuple(2.0 ** (j / _PER_OCTAVE - 1.0) for j in range(_PER_OCTAVE))


def bucket_index(seconds: float) -> int:
    """The schema-``SCHEMA`` bucket holding a positive value (Prometheus' indexing)."""
    frac, exp = math.frexp(seconds)
    return bisect_left(_OCTAVE_BOUNDS, frac) + (exp - 1) * _PER_OCTAVE


def bucket_bounds(index: int) -> tuple[float, float]:
    """(lower, upper] of bucket ``index`` in seconds."""
    return 2.0 ** ((index - 1) / _PER_OCTAVE), 2.0 ** (index / _PER_OCTAVE)


class NativeCounts:
    """One series' native histogram: zero-bucket count, sparse bucket counts, count and sum (ns, exact)."""

    __slots__ = ("zero", "count", "sum_ns", "buckets")

    def __init__(self) -> None:
        self.zero = 0
        self.count = 0
        self.sum_ns = 0
        self.buckets: dict[int, int] = {}

    def observe(self, dt_ns: int) -> None:
        self.count += 1
        if dt_ns <= 0:
            self.zero += 1
            return
        self.sum_ns += dt_ns
        index = bucket_index(dt_ns / 1e9)
        buckets = self.buckets
        buckets[index] = buckets.get(index, 0) + 1

    def merge(self, other: NativeCounts) -> None:
        """Add another series' counts (processes, ranks): sparse buckets of one schema add index by index."""
        self.zero += other.zero
        self.count += other.count
        self.sum_ns += other.sum_ns
        buckets = self.buckets
        for index, n in other.buckets.items():
            buckets[index] = buckets.get(index, 0) + n

    def copy(self) -> NativeCounts:
        out = NativeCounts()
        out.merge(self)
        return out

    def spans(self) -> tuple[list[tuple[int, int]], list[int]]:
        """Positive spans ``(offset, length)`` and delta-encoded counts, as the exposition formats carry them.

        A gap of one or two empty buckets is cheaper as zero-count buckets than as a new span; longer gaps start one.
        """
        spans: list[tuple[int, int]] = []
        deltas: list[int] = []
        previous_index: int | None = None
        previous_count = 0
        for index in sorted(i for i, n in self.buckets.items() if n):
            if previous_index is None:
                spans.append((index, 1))
            else:
                gap = index - previous_index - 1
                if gap <= 2:
                    for _ in range(gap):
                        deltas.append(-previous_count)
                        previous_count = 0
                    offset, length = spans[-1]
                    spans[-1] = (offset, length + gap + 1)
                else:
                    spans.append((gap, 1))
            count = self.buckets[index]
            deltas.append(count - previous_count)
            previous_count = count
            previous_index = index
        return spans, deltas

    def quantile(self, q: float) -> float | None:
        """``histogram_quantile`` on this histogram (seconds), interpolating linearly inside a bucket as Prometheus
        2.x does; None without samples."""
        if self.count == 0:
            return None
        rank = q * self.count
        if rank <= self.zero:
            return 0.0
        acc = self.zero
        last_upper = 0.0
        for index in sorted(self.buckets):
            n = self.buckets[index]
            lower, upper = bucket_bounds(index)
            if n and acc + n >= rank:
                return lower + (upper - lower) * ((rank - acc) / n)
            acc += n
            last_upper = upper
        return last_upper

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NativeCounts):
            return NotImplemented
        mine = {i: n for i, n in self.buckets.items() if n}
        theirs = {i: n for i, n in other.buckets.items() if n}
        return (self.zero, self.count, self.sum_ns, mine) == (other.zero, other.count, other.sum_ns, theirs)

    def __repr__(self) -> str:
        return f"NativeCounts(count={self.count}, zero={self.zero}, sum_ns={self.sum_ns}, buckets={len(self.buckets)})"


def from_spans(spans: Iterable[tuple[int, int]], deltas: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(index, count) pairs back from spans and delta-encoded counts (the inverse of ``NativeCounts.spans``)."""
    counts = iter(deltas)
    index = 0
    count = 0
    first = True
    for offset, length in spans:
        index = offset if first else index + offset + 1
        first = False
        for j in range(length):
            if j:
                index += 1
            count += next(counts)
            if count:
                yield index, count


def native_histogram(counts: NativeCounts) -> NativeHistogram:
    """The ``native_histogram`` value of a histogram family's native sample (what every exposition encodes)."""
    spans, deltas = counts.spans()
    return NativeHistogram(
        count_value=counts.count, sum_value=counts.sum_ns / 1e9, schema=SCHEMA, zero_threshold=ZERO_THRESHOLD_S,
        zero_count=counts.zero, pos_spans=[BucketSpan(offset, length) for offset, length in spans],
        pos_deltas=deltas,
    )


def contradiction(counts: NativeCounts, classic_count: float | None = None,
                  classic_sum_s: float | None = None) -> str | None:
    """Why a series' native part may not be served (None: it may): its count must be its zero bucket plus its buckets,
    and equal its classic part's count and sum, or the protobuf and OpenMetrics 2.0 expositions would disagree."""
    in_buckets = counts.zero + sum(counts.buckets.values())
    if counts.zero < 0 or any(n < 0 for n in counts.buckets.values()):
        return "a native bucket count is negative"
    if counts.count != in_buckets:
        return f"native count {counts.count} is not its zero bucket plus buckets ({in_buckets})"
    if classic_count is not None and counts.count != classic_count:
        return f"native count {counts.count} against classic count {classic_count:.0f}"
    if classic_sum_s is not None and not math.isclose(counts.sum_ns / 1e9, classic_sum_s, rel_tol=1e-9, abs_tol=1e-9):
        return f"native sum {counts.sum_ns / 1e9:.9g} s against classic sum {classic_sum_s:.9g} s"
    return None


def counts_from_native(value: NativeHistogram) -> NativeCounts:
    """``NativeCounts`` back from a ``NativeHistogram`` of schema ``SCHEMA`` (sum rounded to whole ns)."""
    if value.schema != SCHEMA:
        raise ValueError(f"schema {value.schema}, expected {SCHEMA}")
    out = NativeCounts()
    out.count = int(value.count_value)
    out.zero = int(value.zero_count)
    out.sum_ns = round(value.sum_value * 1e9)
    out.buckets = dict(from_spans(value.pos_spans or (), value.pos_deltas or ()))
    return out
