"""telemetry.native: Prometheus' bucket indexing, spans and deltas both ways, merge, and the quantile bound."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from telemetry.native import (
    SCHEMA,
    ZERO_THRESHOLD_S,
    NativeCounts,
    bucket_bounds,
    bucket_index,
    counts_from_native,
    from_spans,
    native_histogram,
)


def test_indexing_is_prometheus_own():
    """Bucket i holds (2^((i-1)/16), 2^(i/16)]: a power of two is the upper edge of its bucket."""
    assert SCHEMA == 4
    assert bucket_index(1.0) == 0
    assert bucket_index(2.0) == 16
    assert bucket_index(0.5) == -16
    assert bucket_index(math.nextafter(1.0, 2.0)) == 1
    for index in (-400, -318, -1, 0, 1, 77, 200):
        lower, upper = bucket_bounds(index)
        assert bucket_index(upper) == index
        assert bucket_index(math.nextafter(lower, math.inf)) == index
        assert math.isclose(upper / lower, 2 ** (1 / 16))


@given(st.lists(st.integers(min_value=0, max_value=10**11), max_size=200))
def test_spans_and_deltas_round_trip(values):
    counts = NativeCounts()
    for v in values:
        counts.observe(v)
    spans, deltas = counts.spans()
    assert sum(length for _offset, length in spans) == len(deltas)
    assert dict(from_spans(spans, deltas)) == {i: n for i, n in counts.buckets.items() if n}
    back = counts_from_native(native_histogram(counts))
    assert back == counts


def test_native_histogram_sample_value():
    counts = NativeCounts()
    for v in (0, 1_000, 2_000, 2_050, 10**9):
        counts.observe(v)
    nh = native_histogram(counts)
    assert (nh.count_value, nh.zero_count, nh.schema) == (5, 1, SCHEMA)
    assert nh.zero_threshold == ZERO_THRESHOLD_S > 0
    assert math.isclose(nh.sum_value, (1_000 + 2_000 + 2_050 + 10**9) / 1e9)
    assert nh.pos_spans[0].offset == bucket_index(1e-6)


def test_merge_adds_bucket_by_bucket():
    a, b, both = NativeCounts(), NativeCounts(), NativeCounts()
    rng = random.Random(3)
    for i in range(2000):
        v = int(rng.lognormvariate(11, 1))
        (a if i % 2 else b).observe(v)
        both.observe(v)
    merged = a.copy()
    merged.merge(b)
    assert merged == both
    assert merged != a


def test_quantile_within_a_bucket_width_of_the_exact_one():
    rng = random.Random(7)
    for mu, sigma in ((10.6, 0.05), (12.0, 0.4), (15.0, 1.5)):
        samples = sorted(int(rng.lognormvariate(mu, sigma)) for _ in range(500))
        counts = NativeCounts()
        for v in samples:
            counts.observe(v)
        for q in (0.5, 0.9, 0.99):
            exact = samples[math.ceil(q * len(samples)) - 1] / 1e9
            assert abs(counts.quantile(q) / exact - 1) < 2 ** (1 / 16) - 1, (mu, sigma, q)
    assert NativeCounts().quantile(0.5) is None
