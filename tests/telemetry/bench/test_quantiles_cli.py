"""`routescope bench quantiles` on CPU: every series it reports has exact, classic and native figures, and the
scrape table has each format with the protobuf one storing a single series per latency histogram."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from routescope.cli import build_app


def test_bench_quantiles_reports_series_and_scrape_sizes():
    res = CliRunner().invoke(build_app(), ["bench", "quantiles", "--calls", "12", "--max-rows", "4", "--min-samples",
                                           "10", "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["device"] == "cpu" and out["calls"] == 12 * 3 * 2 and out["samples"] == out["calls"]
    assert len(out["series"]) == 6  # 3 rows buckets x 2 models, one kernel, the host clock
    for row in out["series"]:
        assert row["samples"] == 12 and row["clock"] == "host"
        for name in ("p50", "p90", "p99"):
            assert row[f"exact_{name}_s"] > 0 and row[f"classic_{name}_s"] > 0 and row[f"native_{name}_s"] > 0
    sizes = {s["format"]: s for s in out["scrape"]}
    assert set(sizes) == {"text 0.0.4", "OpenMetrics 1.0", "OpenMetrics 2.0", "protobuf"}
    histograms = out["histogram_series"]
    assert sizes["text 0.0.4"]["latency_series"] == 28 * histograms
    assert sizes["protobuf"]["latency_series"] == histograms
    assert sizes["OpenMetrics 2.0"]["latency_series"] == 29 * histograms
    assert all(s["bytes"] > s["gzip_bytes"] > 0 for s in sizes.values())
    # the printed parts add up: the header's calls and timed samples are the table's rows, the scrape table's
    # series are the remote-write lines', and the bound line is what the table's errors say
    assert sum(r["samples"] for r in out["series"]) == out["samples"] and len(out["series"]) == histograms
    assert sizes["text 0.0.4"]["series"] == sizes["OpenMetrics 1.0"]["series"] == sizes["protobuf"][
        "remote_write_classic_series"]
    assert sizes["protobuf"]["series"] == sizes["protobuf"]["remote_write_native_series"]
    assert sizes["OpenMetrics 2.0"]["series"] - sizes["text 0.0.4"]["series"] == histograms  # + a native line each
    for kind in ("classic", "native"):
        errors = [abs(r[f"{kind}_{q}_error_pct"]) for r in out["series"] for q in ("p50", "p90", "p99")]
        assert out["within_bound"][kind] == all(e <= 5.0 for e in errors)


def test_no_series_compared_claims_nothing():
    from telemetry.bench.quantiles import within_bound

    assert within_bound([]) == {"classic": None, "native": None}
    res = CliRunner().invoke(build_app(), ["bench", "quantiles", "--calls", "10", "--device", "cpu"])
    assert res.exit_code == 2 and res.output.strip() == (
        "routescope bench: --calls 10 gives each series at most 10 samples, fewer than --min-samples 100: nothing "
        "would be compared")
