"""advise.sources: /routing documents, a multiprocess directory (telemetry's readers), durations and URLs."""

from __future__ import annotations

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from advise.sources import (
    MIXED_ESTIMATE,
    SourceError,
    duration_seconds,
    from_multiproc,
    routing_url,
    traffic_from_routing,
)
from advise.traffic import TRAFFIC_LABELS, bucket_bounds
from dispatcher.types import GuardMode
from telemetry.multiproc.writer import MultiprocWriter
from telemetry.view import Totals

from .fixtures import RAGGED, demo_entries, entry, routing_doc

GLM = "GLM-5.3-Flash"


def test_a_routing_document_without_traffic_is_refused_saying_why():
    with pytest.raises(SourceError, match="has no `traffic`"):
        traffic_from_routing(routing_doc(None), "http://x/routing")


def test_traffic_declared_the_demos_is_priced_at_the_real_shapes_with_the_demos_note():
    """What --demo-shapes does for Prometheus and multiprocess files: they carry the CPU demo's scaled shapes
    (top-k 32), which no table times, and cannot say they are the demo's."""
    from advise.choose import choose_tables
    from advise.report import advise
    from advise.sources import as_demo

    plain = traffic_from_routing(routing_doc(demo_entries(steps=400), demo=False), "here")
    assert plain.demo is None and {e.topk for e in plain.entries} == {32}
    assert choose_tables([], plain)[0] == []  # a CPU: no table, no figure
    out = advise(plain, *choose_tables(["h200"], plain)[:1])
    assert all(c.covered_calls == 0 for m in out.models for c in m.candidates[:1])  # top-k 32: not in the table
    demo = as_demo(plain)
    tables, note = choose_tables([], demo)
    assert [t.meta.name for t in tables] == ["h200-sweep-cupti"] and note.startswith("demo on cpu: priced as if")
    out = advise(demo, tables, target_note=note)
    assert out.status == "ok" and all(m.candidates[0].covered_calls == m.calls for m in out.models)
    assert any("real models' shapes" in n for n in out.notes)
    assert as_demo(demo) is demo


def test_a_routing_document_gives_policy_counterfactuals_and_span():
    t = traffic_from_routing(routing_doc(demo_entries(steps=400), gfx942_min_rows=256), "here")
    assert t.platform_arch == "cpu" and t.active.gfx942_min_rows == 256 and t.active.name == "active"
    assert [(p.name, p.gfx942_min_rows) for p in t.counterfactuals] == [("gfx942_1024", 1024), ("no_row_gate", 0)]
    assert t.counterfactual_arch == "gfx942" and t.span_s == 600.0 and t.demo is not None
    assert {e.model for e in t.entries} == {"DeepSeek-V4.1-Flash", GLM}
    assert all(e.decode_rows == e.rows for e in t.entries if e.call_class == "pure_decode")


def test_entries_of_several_ranks_merge():
    rows = [entry(GLM, "2-3", "pure_decode", 3, 7, 7), entry(GLM, "2-3", "pure_decode", 2, 5, 5)]
    t = traffic_from_routing(routing_doc(rows), "here")
    (e,) = t.entries
    assert (e.calls, e.rows, e.decode_rows) == (5, 12, 12)


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("1h", 3600), ("7d", 604800), ("1h30m", 5400), ("500ms", 0.5)])
def test_durations(text, seconds):
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "h", "1x", "-1h", "1.5h"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="Prometheus duration"):
        duration_seconds(text)


def test_routing_url():
    assert routing_url("http://127.0.0.1:9475") == "http://127.0.0.1:9475/routing"
    assert routing_url("http://h:1/") == "http://h:1/routing"
    assert routing_url("https://h/x/routing") == "https://h/x/routing"
    with pytest.raises(ValueError):
        routing_url("127.0.0.1:9475")


def test_bucket_bounds():
    assert [bucket_bounds(b) for b in ("1", "2-3", "512-767", "16384+")] == [(1, 1), (2, 3), (512, 767), (16384, None)]


def _traffic_file(path, ident: str, rank: str, rows: list[dict]) -> None:
    """The traffic counters in a multiprocess file, labelled as telemetry exports them (a stand-in writer)."""
    f = MmapedDict(str(path / f"counter_routescope-{ident}.db"))
    labels = list(TRAFFIC_LABELS) + ["rank"]
    for r in rows:
        values = ["" if r.get(k) is None else str(r[k]) for k in TRAFFIC_LABELS] + [rank]
        for name, field in (("routescope_traffic_calls", "calls"), ("routescope_traffic_rows", "rows")):
            f.write_value(mmap_key(name, name + "_total", labels, values, "traffic"), float(r[field]), 0.0)
    f.close()


def test_a_multiprocess_directory_through_telemetry_readers(tmp_path):
    rows = [entry(GLM, "2-3", "pure_decode", 10, 25), entry(GLM, "2048-4095", "mixed", 4, 8200),
            entry(GLM, "4096-8191", "mixed", 12, 60000)]
    for rank in ("0", "1"):
        t = Totals(thresholds={("gfx942_min_rows", "active"): 256.0, ("gfx950_min_rows", "active"): 1024.0,
                               ("gfx942_min_rows", "gfx942_1024"): 1024.0, ("gfx950_min_rows", "gfx942_1024"): 1024.0},
                   cf_info={("gfx942_1024", "gfx942"): 1.0},
                   build_info={("0.1.0", "sm90", "cuda", "false", "gpu"): 1.0},
                   dip_rows={(RAGGED, GLM, "mixed"): 64.0, (RAGGED, GLM, "pure_decode"): 25.0},
                   calls={(RAGGED, "torch", "2-3", GLM, "pure_decode", "sm90"): 10}, ts=1.0)
        w = MultiprocWriter(str(tmp_path), f"id.rank{rank}")
        w.write(t, rank)
        w.close()
        _traffic_file(tmp_path, f"id.traffic{rank}", rank, rows)
    traffic = from_multiproc(str(tmp_path), span_s=7200.0)
    assert traffic.platform_arch == "sm90" and traffic.span_s == 7200.0
    assert traffic.active.gfx942_min_rows == 256 and traffic.active.guard is GuardMode.OBSERVE
    assert [(p.name, p.gfx942_min_rows) for p in traffic.counterfactuals] == [("gfx942_1024", 1024)]
    got = {(e.rows_bucket, e.call_class): (e.calls, e.rows, e.decode_rows) for e in traffic.entries}
    # Two ranks summed; mixed decode rows (128 over both ranks) shared by calls: 8 of 32 calls, then 24 of 32.
    assert got == {("2-3", "pure_decode"): (20, 50, 50), ("2048-4095", "mixed"): (8, 16400, 32),
                   ("4096-8191", "mixed"): (24, 120000, 96)}
    assert MIXED_ESTIMATE in traffic.notes


def test_a_directory_without_traffic_series_says_so(tmp_path):
    w = MultiprocWriter(str(tmp_path), "id.only")
    w.write(Totals(calls={(RAGGED, "torch", "2-3", GLM, "pure_decode", "cpu"): 3}, ts=1.0), "0")
    w.close()
    with pytest.raises(SourceError, match="no traffic series"):
        from_multiproc(str(tmp_path))
    with pytest.raises(SourceError, match="does not exist"):
        from_multiproc(str(tmp_path / "nope"))


def test_fractional_counts_keep_the_mean_rows():
    from advise.sources import traffic_rows

    labels = {"model": GLM, "kernel": RAGGED, "rows_bucket": "16384+", "call_class": "prefill", "topk": "2048",
              "layout": "512+0", "q_dtype": "bfloat16", "kv_dtype": "bfloat16", "rank": "0"}
    (row,) = traffic_rows([("routescope_traffic_calls_total", labels, 2.4),
                           ("routescope_traffic_rows_total", labels, 2.4 * 16384)])
    assert row["calls"] == 2 and row["rows"] == 2 * 16384  # not 39322 rows in 2 calls: past the table's 16384


def test_merged_routing_without_decode_rows_per_entry_estimates_them():
    rows = [entry(GLM, "2048-4095", "mixed", 3, 6200), entry(GLM, "4096-8191", "mixed", 1, 5000),
            entry(GLM, "2-3", "pure_decode", 4, 10)]
    for r in rows:
        r["decode_rows"] = None  # telemetry merged from several processes: per kernel x model only
    doc = routing_doc(rows)
    doc["decode_in_prefill"] = {"counts": [{"kernel": RAGGED, "model": GLM, "call_class": "mixed", "calls": 4, "rows": 40},
                                           {"kernel": RAGGED, "model": GLM, "call_class": "pure_decode", "calls": 4,
                                            "rows": 10}]}
    t = traffic_from_routing(doc, "here")
    got = {e.rows_bucket: e.decode_rows for e in t.entries}
    assert got == {"2048-4095": 30, "4096-8191": 10, "2-3": 10} and MIXED_ESTIMATE in t.notes


@pytest.mark.parametrize(("body", "said"), [
    (b'{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\": parse error"}',
     'invalid parameter "query": parse error'),  # Prometheus' own words
    (b'{"detail":"Not Found"}', "Not Found"),  # FastAPI's
    (b"<!DOCTYPE HTML>\n<html>\n<body>404</body></html>", "an HTML page, not the JSON this API answers"),
    (b"upstream\n  timed out", "upstream timed out"),
])
def test_an_error_reply_is_one_line_in_the_apis_own_words(body, said):
    from advise.sources import _error_text

    text = _error_text(body)
    assert "\n" not in text and text.startswith(said)
