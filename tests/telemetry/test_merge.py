"""telemetry.multiproc.merge: exported families back into Totals, summed over ranks (pure; the multiprocess path is in
test_multiprocess.py)."""

from __future__ import annotations

from telemetry.multiproc.merge import totals_from_families
from telemetry.native import NativeCounts
from telemetry.prom import LE, family
from telemetry.spec import ALL
from telemetry.view import Totals


def _totals(k: int) -> Totals:
    t = Totals()
    t.calls = {("intree.ragged_prefill", "torch", "2-3", "glm", "pure_decode", "cpu"): 3 * k,
               ("intree.sparse_decode", "triton", "16-31", "dsv4", "pure_decode", "cpu"): k}
    t.rows = {("intree.ragged_prefill", "2-3", "glm", "pure_decode"): 6 * k}
    t.dip_calls = {("intree.ragged_prefill", "glm", "pure_decode"): 3 * k}
    t.dip_rows = {("intree.ragged_prefill", "glm", "pure_decode"): 6 * k}
    t.would_route = {("gfx942_512", "intree.ragged_prefill", "2-3", "glm"): 3 * k}
    t.decode_path_calls = {("dsv4",): k}
    counts = [0] * len(LE)
    counts[3], counts[7] = k, 2 * k
    t.latency = {("intree.ragged_prefill", "2-3", "glm", "device"): (counts, 0.5 * k)}
    native = NativeCounts()
    for ns in [40_000] * k + [45_500] * (2 * k) + [0] * k:
        native.observe(ns)
    t.latency_native = {("intree.ragged_prefill", "2-3", "glm", "device"): native}
    t.traffic_calls = {("intree.ragged_prefill", "2-3", "glm", "pure_decode", "2048", "512+0", "bfloat16",
                        "bfloat16", "8388608"): 3 * k,
                       ("intree.ragged_prefill", "2-3", "glm", "pure_decode", "2048", "512+0", "bfloat16",
                        "bfloat16", ""): k}  # a pool the shape did not know
    t.replayed = {("intree.ragged_prefill", "glm"): 2 * k}
    t.thresholds = {("gfx942_min_rows", "active"): 512.0}
    return t


def test_families_of_two_ranks_merge_to_the_sum():
    fams = [family(spec, _totals(1), "0") for spec in ALL] + [family(spec, _totals(2), "1") for spec in ALL]
    got = totals_from_families(fams)
    want = _totals(3)
    for field in ("calls", "rows", "dip_calls", "dip_rows", "would_route", "decode_path_calls", "traffic_calls",
                  "replayed"):
        assert getattr(got, field) == getattr(want, field), field
    (counts, total), = got.latency.values()
    assert counts == want.latency[("intree.ragged_prefill", "2-3", "glm", "device")][0] and total == 1.5
    assert got.latency_native == want.latency_native  # native buckets add bucket by bucket, zero bucket too
    assert got.latency_native[("intree.ragged_prefill", "2-3", "glm", "device")].count == 12
    assert got.thresholds == {("gfx942_min_rows", "active"): 512.0}  # a gauge: the largest, not the sum
    assert got.would_dip == {}  # never exported


def test_other_families_are_ignored():
    from prometheus_client.core import CounterMetricFamily

    other = CounterMetricFamily("vllm_requests", "not ours", labels=["model"])
    other.add_metric(["glm"], 7)
    assert totals_from_families([other]) == Totals()
