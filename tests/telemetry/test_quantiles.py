"""The quantiles people read follow the traffic: the page and /routing (snapshot) and the OpenTelemetry export are
within 5% of the exact quantiles of the samples behind them; the classic buckets of the same samples are not.

Real torch kernels through an instrumented dispatcher, every call timed and kept (the workload of
``routescope bench quantiles``, rows at random inside each rows bucket); the real Prometheus is
tests/dashboards/test_native_e2e.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from dispatcher import Dispatcher, Policy, detect
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.quantiles import MODELS, QUANTILES, compare, exact_quantile, workload
from telemetry.buckets import quantile as classic_quantile

BOUND = 0.05
MIN_SAMPLES = 100
KEY = ("kernel", "rows_bucket", "model", "clock")


@pytest.fixture(scope="module")
def timed():
    """(telemetry, in-memory OTel reader, samples by series): 110 calls per model and rows bucket, 1 ... 32-63."""
    reader = InMemoryMetricReader()
    platform, policy = detect(), Policy()
    cfg = TelemetryConfig(models=tuple(m for m, _ in MODELS), sample_first=1 << 30, sample_every=1,
                          keep_samples=True, decisions_maxlen=0, timing="host", otel=True)
    tel = Telemetry(cfg, platform=platform, policy=policy, otel_readers=[reader])
    d = tel.instrument(Dispatcher(platform=platform, policy=policy))
    for args, kw in workload(calls=110, max_rows=32, heads=2, topk=32, kv_len=256, scale_down=8,
                             dtype=torch.float32, device=torch.device("cpu"), seed=3):
        d(*args, **kw)
    raw = tel.drain_samples()
    samples: dict[tuple[str, ...], list[float]] = {}
    for s in raw:
        samples.setdefault(tuple(s[k] for k in KEY), []).append(s["seconds"])
    assert sum(len(v) >= MIN_SAMPLES for v in samples.values()) >= 8, {k: len(v) for k, v in samples.items()}
    yield tel, reader, samples, raw
    tel.close()


def _off(got: float, exact: float) -> float:
    return abs(got / exact - 1)


def test_page_quantiles_are_within_5_percent(timed):
    tel, _reader, samples, _raw = timed
    rows = {tuple(r[k] for k in KEY): r for r in tel.snapshot()["latency"]}
    checked = 0
    for key, values in samples.items():
        if len(values) < MIN_SAMPLES:
            continue
        row = rows[key]
        assert row["samples"] == len(values) and row["buckets"] == "native"
        for q in QUANTILES:
            got, exact = row[f"p{round(q * 100)}_s"], exact_quantile(values, q)
            assert _off(got, exact) <= BOUND, (key, q, got, exact)
            checked += 1
    assert checked >= 24


def test_classic_buckets_of_the_same_samples_miss(timed):
    """The companion: what the page showed before (the classic buckets) is off by more than 5% somewhere."""
    tel, _reader, samples, _raw = timed
    worst = 0.0
    for key, values in samples.items():
        if len(values) >= MIN_SAMPLES:
            counts, _sum = tel.totals.latency[key]
            worst = max(worst, *(_off(classic_quantile(counts, q), exact_quantile(values, q)) for q in QUANTILES))
    assert worst > BOUND


def _otel_quantile(point, q: float) -> float:
    """histogram_quantile's linear interpolation on an OTel exponential point (bucket i: (base^i, base^(i+1)])."""
    base = 2.0 ** (2.0 ** -point.scale)
    rank, acc = q * point.count, point.zero_count
    for i, n in enumerate(point.positive.bucket_counts):
        index = point.positive.offset + i
        if n and acc + n >= rank:
            lower, upper = base ** index, base ** (index + 1)
            return lower + (upper - lower) * (rank - acc) / n
        acc += n
    return base ** (point.positive.offset + len(point.positive.bucket_counts))


def test_opentelemetry_exponential_buckets_are_within_5_percent(timed):
    tel, reader, samples, _raw = timed
    tel.flush()
    points = [p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics if m.name == "routescope_call_duration_seconds" for p in m.data.data_points]
    by_key = {tuple(p.attributes[k] for k in KEY): p for p in points}
    checked = 0
    for key, values in samples.items():
        if len(values) < MIN_SAMPLES:
            continue
        point = by_key[key]
        assert point.count == len(values)
        for q in QUANTILES:
            got, exact = _otel_quantile(point, q), exact_quantile(values, q)
            assert _off(got, exact) <= BOUND, (key, q, got, exact)
            checked += 1
    assert checked >= 24


def test_bench_compare_reports_both(timed):
    tel, _reader, samples, raw = timed
    rows = compare(raw, tel.totals, min_samples=MIN_SAMPLES)
    assert len(rows) == sum(len(v) >= MIN_SAMPLES for v in samples.values())
    for r in rows:
        for q in QUANTILES:
            name = f"p{round(q * 100)}"
            assert math.isclose(r[f"exact_{name}_s"], exact_quantile(samples[tuple(r[k] for k in KEY)], q))
            assert abs(r[f"native_{name}_error_pct"]) <= 100 * BOUND
