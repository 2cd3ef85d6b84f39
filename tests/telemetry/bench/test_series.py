"""`routescope bench series`: series per rank in each histogram mode at the production-like traffic."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from routescope.cli import build_app
from telemetry.bench.series import production_mix


def test_every_kernel_and_the_forms_of_each_mode():
    res = CliRunner().invoke(build_app(), ["bench", "series", "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.output)
    assert result["rows_buckets"] == 15
    assert result["kernels"] == ["aiter.pa_prefill_sparse", "aiter.pa_sparse_prefill_opus", "intree.ragged_prefill",
                                 "intree.sparse_decode"]
    n = result["latency_histograms"]
    rows = {(r["mode"], r["scraper"]): r for r in result["rows"]}
    classic = rows[("classic", "protobuf")]["latency_series"]
    buckets_per_histogram = classic / n
    assert buckets_per_histogram == 28  # 26 buckets (+Inf included) + _count + _sum: the latency bounds'
    assert rows[("native", "protobuf")]["latency_series"] == n  # one native series per histogram
    assert rows[("both", "protobuf")]["latency_series"] == n  # 2.42 stores native only when both come
    assert rows[("native", "text")]["latency_series"] == 3 * n  # +Inf, _count, _sum
    assert rows[("both", "text")]["latency_series"] == rows[("classic", "text")]["latency_series"] == classic
    others = {r["other_series"] for r in result["rows"]}
    assert len(others) == 1 and others.pop() > 0  # the mode touches the latency family only
    for r in result["rows"]:
        assert r["bound_series"] >= r["series"] and r["bound_latency_histograms"] == 2 * 4 * result["rows_buckets"]


def test_the_mix_covers_every_rows_bucket_for_both_models():
    mix = production_mix(16384)
    rows = sorted({r for r, meta, _m in mix if meta["num_prefills"]})
    assert rows[0] == 1 and rows[-1] == 16384 and len(rows) == 15
    assert {m for _r, _meta, m in mix} == {"DeepSeek-V4.1-Flash", "GLM-5.3-Flash"}

