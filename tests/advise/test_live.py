"""advise.live: live ratios set beside a table's, both crossovers, and the command on the CPU (plumbing only)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from advise.latency import LatencyModel
from advise.live import LivePoint, compare, crossover, predicted_ratio
from advise.tables import load_table
from routescope.cli import build_app

L2, HBM = 8 << 20, 256 << 20
ROWS = (2, 4, 8, 16, 32, 64, 128, 256, 512)


def _as_table(pool: int, scale: float = 1.0) -> list[LivePoint]:
    """Live points whose ratio is the table's own (times ``scale``): prefill 40 µs, split-K to match."""
    model = LatencyModel([load_table("h200")])
    out = []
    for rows in ROWS:
        p = LivePoint("448+64", pool, rows, 2048, 40.0, 1.0, 80, "cupti")
        ratio, _ = predicted_ratio(model, p)
        out.append(p._replace(split_us=40.0 * ratio * scale))
    return out


def test_points_at_the_tables_ratio_agree_and_cross_where_it_does():
    got = compare(_as_table(L2) + _as_table(HBM), load_table("h200"))
    assert got["within_bound"] and got["worst_error"] == pytest.approx(0.0, abs=1e-9)
    assert [(c["kv_pool"], c["live"], c["predicted"], c["equal"]) for c in got["crossovers"]] == [
        ("8 MiB", 64, 64, True), ("256 MiB", 64, 64, True)]


def test_a_point_off_by_more_than_the_bound_fails_it_and_names_the_error():
    points = _as_table(L2)
    points[0] = points[0]._replace(split_us=points[0].split_us * 1.10)  # live split-K 10% slower at 2 rows
    got = compare(points, load_table("h200"))
    assert not got["within_bound"]
    assert got["points"][0]["error"] == pytest.approx(1 / 1.10 - 1)


def test_the_crossover_needs_the_prefill_no_slower_at_every_larger_row_count():
    assert crossover({32: 0.67, 64: 1.10, 128: 1.44, 256: 1.36}) == 64
    assert crossover({32: 0.72, 64: 1.09, 128: 1.11, 256: 0.97, 512: 0.97}) == 64  # 0.97: within the 5%
    assert crossover({32: 0.72, 64: 1.09, 128: 1.11, 256: 0.90}) is None  # split-K clearly faster at the top
    assert crossover({2: 1.2, 4: 1.3}) == 2


def test_bench_live_on_the_cpu_writes_points_and_the_comparison(tmp_path):
    out = tmp_path / "live.json"
    r = CliRunner().invoke(build_app(), ["bench", "live", "--device", "cpu", "--rows", "2,4", "--layout", "448+64",
                                         "--kv-pool", "1MiB", "--calls", "2", "--rounds", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert [(p["rows"], p["kv_pool_bytes"], p["clock"]) for p in doc["points"]] == [(2, 1 << 20, "host"),
                                                                                  (4, 1 << 20, "host")]
    assert all(p["prefill_us"] > 0 and p["split_us"] > 0 for p in doc["points"])
    assert doc["comparison"]["table"].startswith("h200-sweep-cupti") and len(doc["comparison"]["points"]) == 2
    bad = CliRunner().invoke(build_app(), ["bench", "live", "--kv-pool", "lots", "--device", "cpu"])
    assert bad.exit_code == 2 and "lots" in bad.output
    assert doc["device"] == "cpu" and doc["clock"] == "host" and "plumbing, not any GPU figure" in doc["note"]
    for p in doc["comparison"]["points"]:  # the printed figures agree: error is predicted over live, less one
        assert p["live"] == pytest.approx(next(q["split_us"] / q["prefill_us"] for q in doc["points"]
                                               if q["rows"] == p["rows"]))
        if p["predicted"] is not None:
            assert p["error"] == pytest.approx(p["predicted"] / p["live"] - 1)
    errors = [abs(p["error"]) for p in doc["comparison"]["points"] if p["error"] is not None]
    assert doc["comparison"]["worst_error"] == (max(errors) if errors else None)


@pytest.mark.parametrize(("args", "said"), [
    (["--layout", "512x64"], "--layout takes NOPE+ROPE pairs like 512+64; '512x64' is not one"),
    (["--topk", "0"], "--calls, --rounds and --topk must each be at least 1"),
    (["--device", "tpu"], "--device must be auto, cpu or cuda; got 'tpu'"),
    (["--kv-pool", ","], "--kv-pool needs at least one size"),
    (["--table", "/nonexistent/t.json"], "--table: /nonexistent/t.json: (file): no such file"),
    (["--out", "/proc/routescope-nope/l.json"], "--out /proc/routescope-nope/l.json: cannot create folder "
                                                "/proc/routescope-nope: No such file or directory"),
])
def test_bench_live_refuses_bad_input_in_one_line_before_any_work(args, said):
    res = CliRunner().invoke(build_app(), ["bench", "live", *args])
    assert res.exit_code == 2 and res.output.strip() == f"routescope bench live: {said}", res.output
