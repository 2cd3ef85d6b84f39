"""Rows bucket edges around every threshold (including custom ones like 768) and latency bucket bounds."""

from __future__ import annotations

import pytest

from dispatcher import Policy
from telemetry import TelemetryConfig
from telemetry.buckets import LATENCY_BOUNDS_S, RowsBuckets, quantile

from .conftest import args_for, dispatcher, scrape, series


def test_power_of_two_labels():
    b = RowsBuckets(())
    assert b.labels == ("0", "1", "2-3", "4-7", "8-15", "16-31", "32-63", "64-127", "128-255", "256-511",
                        "512-1023", "1024-2047", "2048-4095", "4096-8191", "8192-16383", "16384+")
    assert [b.label(r) for r in (0, 1, 2, 3, 4, 16383, 16384, 1 << 20)] == [
        "0", "1", "2-3", "2-3", "4-7", "8192-16383", "16384+", "16384+"]


@pytest.mark.parametrize("thresholds, rows, label", [
    ((512, 1024), 511, "256-511"), ((512, 1024), 512, "512-1023"), ((512, 1024), 1023, "512-1023"),
    ((512, 1024), 1024, "1024-2047"),
    ((768, 1024), 767, "512-767"), ((768, 1024), 768, "768-1023"), ((768, 1024), 1023, "768-1023"),
    ((768, 1024), 512, "512-767"),
    ((3, 1024), 2, "2"), ((3, 1024), 3, "3"),
    ((20000, 1024), 19999, "16384-19999"), ((20000, 1024), 20000, "20000+"), ((20000, 1024), 16384, "16384-19999"),
    ((0, 1024), 1, "1"),
])
def test_threshold_is_an_edge(thresholds, rows, label):
    assert RowsBuckets(thresholds).label(rows) == label


def test_counterfactual_thresholds_split_fine_buckets_only():
    b = RowsBuckets((512, 1024), (600,))
    assert "512-599" not in b.labels and "512-1023" in b.labels
    assert b.fine(599) != b.fine(600)
    assert b.label(599) == b.label(600) == "512-1023"


@pytest.mark.parametrize("gfx942", [512, 768, 1000])
def test_exported_buckets_around_active_threshold(make_tel, gfx942):
    policy = Policy(gfx942_min_rows=gfx942)
    tel = make_tel(TelemetryConfig(models=("glm",)), policy=policy)
    d = tel.instrument(dispatcher(policy=policy))
    for rows in (gfx942 - 1, gfx942, gfx942 + 1):
        d(*args_for(rows), model="glm")
    s = scrape(tel.registry)
    got = {(dict(k)["rows_bucket"], dict(k)["kernel"]): v for k, v in series(s, "routescope_calls_total").items()}
    below = RowsBuckets(policy.thresholds).label(gfx942 - 1)
    at = RowsBuckets(policy.thresholds).label(gfx942)
    assert below != at  # the gate is an edge: one side of it per bucket
    assert got == {(below, "intree.ragged_prefill"): 1, (at, "aiter.pa_prefill_sparse"): 2}
    assert at.startswith(f"{gfx942}-")


def test_latency_bounds():
    assert LATENCY_BOUNDS_S[0] == 1e-6 and LATENCY_BOUNDS_S[-1] == 100.0
    assert LATENCY_BOUNDS_S[:4] == (1e-6, 2.5e-6, 5e-6, 1e-5)
    assert list(LATENCY_BOUNDS_S) == sorted(LATENCY_BOUNDS_S) and len(LATENCY_BOUNDS_S) == 25


def test_quantile_interpolates_like_histogram_quantile():
    counts = [0] * (len(LATENCY_BOUNDS_S) + 1)
    counts[3] = 10  # all in (5e-6, 1e-5]
    assert quantile(counts, 0.5) == pytest.approx(7.5e-6)
    assert quantile([0] * len(counts), 0.5) is None
