"""`routescope sweep` on CPU: the pure pieces (grid parsing, ratios, crossover, gate) and the command end to end."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from dispatcher.kernels.registry import default_registry
from dispatcher.sweep.analysis import (
    Result, crossover, crossovers, event_floor_us, next_pow2, pool_note, ratio_rows, ratio_table, recommend_gate,
    rows_between, timer_note,
)
from dispatcher.sweep.grid import (
    KernelSpec, Layout, SweepArgError, default_kv_len, parse_int_list, parse_kernels, parse_layouts,
)
from dispatcher.sweep.inputs import make_sets, topk_indices
from dispatcher.sweep.report import document, markdown, print_tables, write_heatmap
from dispatcher.sweep.runner import KernelFailed, SweepPlan, run_sweep
from dispatcher.sweep.timing import summarize
from dispatcher.types import Kernel

KNOWN = {k: [i.impl for i in default_registry().impls(k)] for k in Kernel}
A, B = "intree.ragged_prefill:triton", "intree.sparse_decode:triton"


def result(label: str, rows: int, topk: int, us: float, layout: str = "512+64") -> Result:
    kernel, impl = label.split(":")
    return Result(kernel, impl, layout, rows, topk, 16, 576, 512, 64, "bfloat16", 8192, us, us, us, us, 5, "test")


# ---- grid parsing ---------------------------------------------------------------------------------------------


def test_int_lists_are_sorted_and_deduplicated():
    assert parse_int_list("16, 2,2,1", "rows") == (1, 2, 16)


@pytest.mark.parametrize("text", ["", " , ", "1,a", "0", "-4", "3.5", "2000000"])
def test_bad_int_lists_are_refused_with_the_option_named(text):
    with pytest.raises(SweepArgError, match="--rows"):
        parse_int_list(text, "rows")


def test_layouts_and_aliases():
    assert parse_layouts("512+64,glm,dsv4,512+64") == (Layout(512, 64), Layout(512, 0), Layout(448, 64))
    assert parse_layouts("256") == (Layout(256, 0),)
    assert Layout(448, 64).head_dim == 512 and str(Layout(512, 0)) == "512+0"


@pytest.mark.parametrize("text", ["", "x+y", "0+64", "8+4", "512+-1", "5000+0"])
def test_bad_layouts_are_refused(text):
    with pytest.raises(SweepArgError, match="--layout"):
        parse_layouts(text)


def test_kernel_specs_keep_order_and_implementation():
    specs = parse_kernels("intree.ragged_prefill:torch, intree.sparse_decode", KNOWN)
    assert specs == (KernelSpec(Kernel.INTREE_RAGGED_PREFILL, "torch"), KernelSpec(Kernel.INTREE_SPARSE_DECODE, None))
    assert str(specs[0]) == "intree.ragged_prefill:torch"


@pytest.mark.parametrize(("text", "match"), [
    ("intree.ragged_prefill", "two or more"),
    ("nope.kernel,intree.sparse_decode", "unknown kernel"),
    ("intree.ragged_prefill:cuda,intree.sparse_decode", "no implementation 'cuda'"),
    ("intree.sparse_decode:torch,intree.sparse_decode:torch", "listed twice"),
])
def test_bad_kernel_specs_are_refused(text, match):
    with pytest.raises(SweepArgError, match=match):
        parse_kernels(text, KNOWN)


def test_kv_pool_holds_the_prompt_and_four_fanouts():
    assert default_kv_len(2, 2048) == 8192
    assert default_kv_len(16384, 2048) == 16384


# ---- ratios, crossover, gate ------------------------------------------------------------------------------------


def test_ratio_table_pairs_a_with_b_per_point_and_layout():
    res = [result(A, 1, 128, 30.0), result(B, 1, 128, 10.0), result(A, 512, 128, 50.0), result(B, 512, 128, 100.0),
           result(A, 1, 128, 7.0, layout="512+0"), result(B, 1, 128, 7.0, layout="512+0"), result(A, 2, 128, 5.0)]
    assert ratio_table(res, A, B, "512+64") == {(1, 128): 3.0, (512, 128): 0.5}  # (2, 128) has no B: left out
    assert ratio_table(res, A, B, "512+0") == {(1, 128): 1.0}


def test_crossover_interpolates_in_log_rows_and_log_ratio():
    c = crossover({1: 4.0, 16: 2.0, 256: 0.5, 4096: 0.4}, topk=2048)
    assert c.rows == 256 and not c.a_always
    # log-log line through (16, 2) and (256, 0.5) crosses 1 halfway: sqrt(16 * 256) = 64
    assert c.estimate == pytest.approx(64.0)


def test_crossover_needs_a_to_stay_ahead():
    assert crossover({1: 2.0, 16: 0.9, 256: 1.2, 4096: 0.8}).rows == 4096  # the dip at 16 does not count
    assert crossover({1: 0.5, 2: 0.7}).a_always
    never = crossover({1: 3.0, 2: 1.01})
    assert never.rows is None and never.estimate is None
    assert crossover({}).rows is None


def test_gate_is_the_latest_crossover_rounded_to_a_bucket_edge():
    table = {(1, 128): 1.5, (300, 128): 0.9, (1, 2048): 8.0, (300, 2048): 1.1, (1000, 2048): 0.8}
    found = crossovers(table, "512+64")
    assert [(c.topk, c.rows) for c in found] == [(128, 300), (2048, 1000)]
    advice = recommend_gate(found)
    assert advice.gate == 1024 and advice.never == ()
    assert "top-k 2048" in advice.reason


def test_gate_notes_fanouts_where_a_never_wins_and_declines_when_none_do():
    found = crossovers({(1, 128): 2.0, (512, 128): 0.5, (1, 2048): 3.0, (512, 2048): 1.5}, "512+0")
    advice = recommend_gate(found)
    assert advice.gate == 512 and advice.never == (2048,)
    assert "never caught up at top-k 2048" in advice.reason
    none = recommend_gate(crossovers({(1, 128): 2.0}, "x"))
    assert none.gate is None and "keep every call on B" in none.reason


def test_gate_from_a_coarse_grid_says_which_rows_to_add():
    """A sweep over rows 2, 16 and 16384 alone: A loses at 16 and wins at 16384, so the gate can only say 16384
    though the interpolated crossing is near 3,000; the advice names the rows that would place it closer."""
    found = crossovers({(2, 2048): 4.1, (16, 2048): 1.9, (16384, 2048): 0.7}, "512+64")
    assert found[0].below == 16 and found[0].rows == 16384
    advice = recommend_gate(found)
    assert advice.gate == 16384
    assert "no row count between 16 and 16384" in advice.reason and "64,256,1024,4096" in advice.reason
    # the default grid's steps (16 -> 256 at the widest below 1024) need no hint
    fine = recommend_gate(crossovers({(16, 2048): 1.9, (256, 2048): 0.8, (512, 2048): 0.7}, "512+64"))
    assert fine.gate == 256 and "no row count between" not in fine.reason
    assert rows_between(16, 16384) == [64, 256, 1024, 4096]
    assert rows_between(3, 100) == [16, 64] and rows_between(16, 64) == []


def test_tolerance_keeps_a_flat_tail_from_moving_the_gate():
    """A flat tail as H200 sweeps show it: past 256 rows A/B hovers at 0.93-1.02, and a 2% wobble must not push
    the gate up."""
    table = {(16, 2048): 5.2, (256, 2048): 0.98, (512, 2048): 1.01, (1024, 2048): 1.02, (16384, 2048): 1.01}
    strict = crossovers(table, "512+0")
    assert strict[0].rows is None  # with no tolerance A "never" catches up
    loose = crossovers(table, "512+0", threshold=1.05)
    assert loose[0].rows == 256
    advice = recommend_gate(loose, 0.05)
    assert advice.gate == 256 and "within 5%" in advice.reason
    assert crossovers({(1, 128): 1.2, (512, 128): 1.06}, "x", threshold=1.05)[0].rows is None  # 6% is still slower


def test_next_pow2_and_the_seed_table_layout():
    assert [next_pow2(x) for x in (0, 1, 2, 3, 300, 512, 513)] == [1, 1, 2, 4, 512, 512, 1024]
    header, lines = ratio_rows({(256, 128): 1.04, (256, 512): 0.88, (512, 128): 0.64})
    assert header == ["Rows", "Fanout 128", "Fanout 512"]
    assert lines == [["256", "1.04", "0.88"], ["512", "0.64", "-"]]


def test_timing_summary_is_median_and_spread():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "host")
    assert (t.median_us, t.min_us, t.repeats) == (3.0, 1.0, 5)
    assert t.p20_us <= t.median_us <= t.p80_us
    assert summarize([7.0], "host").p80_us == 7.0
    with pytest.raises(ValueError):
        summarize([], "host")


# ---- inputs and the runner --------------------------------------------------------------------------------------


def test_indices_are_distinct_in_range_and_padded_past_the_pool():
    g = torch.Generator().manual_seed(0)
    idx = topk_indices(5, 16, 40, torch.device("cpu"), g)
    assert idx.dtype == torch.int32 and idx.shape == (5, 16)
    for row in idx:
        assert len(set(row.tolist())) == 16 and int(row.min()) >= 0 and int(row.max()) < 40
    short = topk_indices(2, 16, 10, torch.device("cpu"), g)
    assert (short[:, 10:] == -1).all() and (short[:, :10] >= 0).all()


def test_input_sets_have_the_call_shapes():
    sets = make_sets(3, 8, 4, Layout(32, 16), 20, dtype=torch.float32, device=torch.device("cpu"))
    a = sets[0]
    assert a.q.shape == (3, 4, 48) and a.kv.shape == (20, 1, 48) and a.output.shape == (3, 4, 32)
    assert a.index.indices.shape == (3, 8) and math.isclose(a.scale, 48 ** -0.5)


def test_input_sets_with_an_fp8_pool():
    f8 = torch.float8_e4m3fn
    a = make_sets(3, 8, 4, Layout(32, 16), 20, dtype=torch.bfloat16, device=torch.device("cpu"), kv_dtype=f8)[0]
    assert a.kv.dtype == f8 and a.q.dtype == a.output.dtype == torch.bfloat16
    assert a.kv.float().abs().max() > 0.5  # unit normal values, rounded to e4m3: not a tiny or zero pool
    from dispatcher.sweep.inputs import call_bytes

    lay = Layout(512, 64)
    assert call_bytes(1, 2048, 16, lay, 8192, 2) - call_bytes(1, 2048, 16, lay, 8192, 2, 1) == 2048 * 576  # kv: 1 B


def test_runner_times_every_kernel_at_every_point():
    reg = default_registry()
    plan = SweepPlan(kernels=parse_kernels("intree.ragged_prefill:torch,intree.sparse_decode:torch", KNOWN),
                     rows=(1, 3), topk=(8,), layouts=(Layout(32, 16), Layout(32, 0)), device=torch.device("cpu"),
                     dtype=torch.float32, heads=4, repeats=2, warmup=1, registry=reg)
    steps = []
    res = run_sweep(plan, on_step=steps.append)
    assert len(res) == len(steps) == 2 * 2 * 2
    assert {r.label for r in res} == {"intree.ragged_prefill:torch", "intree.sparse_decode:torch"}
    assert all(r.median_us > 0 and r.repeats == 2 and r.timer == "host" for r in res)
    assert {r.kv_len for r in res} == {32}


def test_a_kernel_that_cannot_run_is_reported_not_timed():
    plan = SweepPlan(kernels=parse_kernels("intree.ragged_prefill:torch,aiter.pa_prefill_sparse", KNOWN),
                     rows=(1,), topk=(8,), layouts=(Layout(32, 0),), device=torch.device("cpu"),
                     dtype=torch.float32, heads=2, repeats=1, warmup=0)
    with pytest.raises(KernelFailed, match="aiter.pa_prefill_sparse"):
        run_sweep(plan)


def test_document_and_heatmap(tmp_path):
    res = [result(A, 1, 128, 30.0), result(B, 1, 128, 10.0), result(A, 512, 128, 5.0), result(B, 512, 128, 10.0)]
    doc = document(res, a=A, b=B, layouts=["512+64"], device="cpu (test)", command="routescope sweep")
    assert doc["device"] == "cpu (test)" and doc["results"][0]["heads"] == 16 and doc["results"][0]["median_us"] == 30.0
    assert doc["recommendation"]["gate"] == 512
    png = tmp_path / "h.png"
    write_heatmap(png, doc)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_kv_pool_is_placed_against_the_l2():
    small = result(A, 16, 2048, 10.0)._replace(kv_len=8192)  # 8,192 rows x 576 lanes x 2 bytes: 9.0 MiB
    big = result(A, 16, 2048, 10.0)._replace(kv_len=1 << 20)  # 1,152 MiB
    l2 = 50 << 20
    inside = pool_note([small], l2)
    assert inside.startswith("kv pool 9.0 MiB, inside this GPU's 50 MiB L2") and "--kv-len 1048576" in inside
    assert pool_note([big], l2).startswith("kv pool 1152 MiB, past this GPU's 50 MiB L2 at every point")
    assert pool_note([small, big], l2) == "kv pool 9.0-1152 MiB against this GPU's 50 MiB L2: inside it at some " \
                                          "points, past it at others."
    assert pool_note([small._replace(dtype="float32")], 12 << 20).startswith("kv pool 18 MiB, past")  # 4-byte rows
    assert pool_note([small._replace(kv_dtype="float8_e4m3fn")], l2).startswith("kv pool 4.5 MiB")  # 1-byte rows
    assert pool_note([small], None) is None and pool_note([], l2) is None  # on the host, or nothing timed


def test_the_document_and_the_tables_say_where_the_pool_sat(tmp_path):
    from rich.console import Console

    res = [result(A, 1, 128, 30.0), result(B, 1, 128, 10.0), result(A, 512, 128, 5.0), result(B, 512, 128, 10.0)]
    doc = document(res, a=A, b=B, layouts=["512+64"], device="gpu (test)", command="routescope sweep", l2=50 << 20)
    assert doc["l2_bytes"] == 50 << 20 and doc["kv_pool"].startswith("kv pool 9.0 MiB, inside")
    console = Console(record=True, width=200)
    print_tables(console, res, doc)
    assert "kv pool 9.0 MiB, inside this GPU's 50 MiB L2" in console.export_text()
    host = document(res, a=A, b=B, layouts=["512+64"], device="cpu (test)", command="routescope sweep")
    assert host["l2_bytes"] is None and host["kv_pool"] is None


def test_event_pair_readings_too_short_for_the_bound_are_named():
    assert 40.0 < event_floor_us() < 41.0  # 3.7 µs of pair over a 37 µs kernel is 10%
    events = lambda rows, us: result(A, rows, 2048, us)._replace(timer="cuda-events")  # noqa: E731
    note = timer_note([events(2, 12.4), events(16, 17.5), events(256, 80.0), result(B, 2, 2048, 9.0)])
    assert note.startswith("2 of 3 event-pair readings are under 41 µs (rows 2, 16)") and "--timer cupti" in note
    assert timer_note([events(2, 12.4)._replace(timer="cuda-graph")]).startswith("1 of 1")  # replayed pairs too
    assert timer_note([events(256, 80.0)]) is None  # every reading long enough
    assert timer_note([result(A, 2, 2048, 9.0)._replace(timer="cupti")]) is None  # kernel time needs no note
    many = [events(n, 10.0) for n in range(1, 11)]
    assert "(rows 1, 2, 3, 4, 5, 6, 7, 8, ...)" in timer_note(many)


def test_the_document_the_tables_and_markdown_carry_the_timer_note():
    from rich.console import Console

    res = [result(A, 2, 128, 30.0)._replace(timer="cuda-events"), result(B, 2, 128, 10.0)._replace(timer="cuda-events")]
    doc = document(res, a=A, b=B, layouts=["512+64"], device="gpu (test)", command="routescope sweep")
    assert doc["timer_note"].startswith("2 of 2 event-pair readings")
    console = Console(record=True, width=400)
    print_tables(console, res, doc)
    assert "2 of 2 event-pair readings" in console.export_text()
    assert doc["timer_note"] in markdown(res, doc)
    quiet = document([r._replace(median_us=100.0) for r in res], a=A, b=B, layouts=["512+64"], device="gpu",
                     command="routescope sweep")
    assert quiet["timer_note"] is None and "event-pair readings" not in markdown(res, quiet)


def test_markdown_has_the_seed_table_the_medians_and_the_gate_per_layout():
    res = [result(A, n, k, a_us, lay) for lay in ("448+64", "512+0") for n, k, a_us in
           ((1, 128, 30.0), (512, 128, 5.0), (1, 2048, 40.0), (512, 2048, 8.0))]
    res += [result(B, n, k, 10.0, lay) for lay in ("448+64", "512+0") for n in (1, 512) for k in (128, 2048)]
    doc = document(res, a=A, b=B, layouts=["448+64", "512+0"], device="gpu (test)",
                   command="routescope sweep --rows 1,512", l2=50 << 20)
    md = markdown(res, doc)
    lines = md.splitlines()
    assert lines[0] == "# routescope sweep on gpu (test)" and "```" in lines and "routescope sweep --rows 1,512" in lines
    assert f"A = `{A}`, B = `{B}`" in md and "Timer: test." in md
    for lay in ("448+64", "512+0"):  # each layout: the A/B table in the seed's layout, then the medians
        at = lines.index(f"## Layout {lay}")
        assert lines[at + 4:at + 8] == ["| Rows | Fanout 128 | Fanout 2048 |", "| ---: | ---: | ---: |",
                                        "| 1 | 3.00 | 4.00 |", "| 512 | 0.50 | 0.80 |"]
        assert f"| {A} | 128 | 30.0 ±0% | 5.0 ±0% |" in lines[at:]
    assert "| kernel | top-k | 1 | 512 |" in lines and "| --- | ---: | ---: | ---: |" in lines
    assert "- crossover, layout 512+0, top-k 2048: A no slower (within 5%) from 512 rows" in md
    assert "**Recommended gate:** rows >= 512" in md
    assert lines[-1].startswith("kv pool 9.0 MiB, inside this GPU's 50 MiB L2")
    assert "kv pool" not in markdown(res, {**doc, "kv_pool": None})  # on the host: no pool line


# ---- the command ------------------------------------------------------------------------------------------------


def _cli(*args: str):
    import typer

    from dispatcher.sweep.cli import sweep_command

    app = typer.Typer()
    app.command()(sweep_command)
    return CliRunner().invoke(app, list(args))


def test_sweep_end_to_end_on_a_tiny_cpu_grid(tmp_path):
    out = tmp_path / "sw"
    r = _cli("--rows", "1,4", "--topk", "8,16", "--layout", "32+16", "--heads", "4", "--repeats", "2",
             "--warmup", "1", "--dtype", "float32", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "Fanout 8" in r.output and "no recommended gate: none: 8 of 8 timed points" in " ".join(r.output.split())
    assert (out / "sweep.png").stat().st_size > 1000
    md = (out / "sweep.md").read_text()
    assert "## Layout 32+16" in md and "| Rows | Fanout 8 | Fanout 16 |" in md and "**No recommended gate:**" in md
    assert "Timer: host clock (time.perf_counter" in md  # the clock that ran, as the command says
    assert f"wrote {out / 'sweep.csv'}" in " ".join(r.output.split()) and "sweep.md" in r.output
    with (out / "sweep.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * 2 and {row["impl"] for row in rows} == {"torch"}
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["a"] == "intree.ragged_prefill:torch" and doc["b"] == "intree.sparse_decode:torch"
    assert {"device", "results", "ratios", "crossover", "recommendation", "command"} <= set(doc)
    assert doc["command"].startswith("routescope sweep --kernels intree.ragged_prefill:torch,intree.sparse_decode:torch")
    assert "--tolerance 0.05" in doc["command"] and doc["tolerance"] == 0.05
    assert "--timer" not in doc["command"] and {x["timer"] for x in doc["results"]} == {"host"}  # the CPU has one
    assert doc["recommendation"]["gate"] is None and len(doc["noisy"]) == 8  # 2 timed calls: no spread measured
    assert len(doc["ratios"]) == 4


def test_an_fp8_pool_is_swept_recorded_and_replayable(tmp_path):
    out = tmp_path / "f8"
    r = _cli("--rows", "1,4", "--topk", "8", "--layout", "32+16", "--heads", "2", "--repeats", "1", "--warmup", "0",
             "--kv-dtype", "float8_e5m2", "--out", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "sweep.json").read_text())
    assert {(x["dtype"], x["kv_dtype"]) for x in doc["results"]} == {("bfloat16", "float8_e5m2")}
    assert doc["command"].endswith("--kv-dtype float8_e5m2")
    assert "Dtypes: q bfloat16, kv float8_e5m2." in (out / "sweep.md").read_text()
    with (out / "sweep.csv").open() as fh:
        assert {row["kv_dtype"] for row in csv.DictReader(fh)} == {"float8_e5m2"}
    same = _cli("--rows", "1", "--topk", "8", "--layout", "glm", "--heads", "2", "--repeats", "1", "--warmup", "0",
                "--kv-dtype", "bfloat16", "--json", "--out", str(tmp_path / "same"))
    same_doc = json.loads(same.stdout[same.stdout.index("{"):])
    assert "--kv-dtype" not in same_doc["command"] and same_doc["results"][0]["kv_dtype"] == "bfloat16"


def test_sweep_json_flag_prints_the_document(tmp_path):
    from dispatcher.sweep.provenance import git_commit, run_date

    r = _cli("--rows", "2", "--topk", "8", "--layout", "glm", "--heads", "2", "--repeats", "1", "--warmup", "0",
             "--dtype", "float32", "--json", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["results"][0]["layout"] == "512+0" and doc["results"][0]["rows"] == 2
    assert doc["date"] == run_date() and doc["commit"] == git_commit()  # what a latency table from it shows


def test_the_date_is_the_utc_day_and_the_commit_none_outside_a_checkout(tmp_path):
    from datetime import datetime, timedelta, timezone

    from dispatcher.sweep.provenance import CHECKOUT, git_commit, run_date

    late = datetime(2026, 12, 1, 23, 30, tzinfo=timezone(timedelta(hours=-5)))  # 04:30 UTC the next day
    assert run_date(late) == "2026-12-02"
    assert git_commit(tmp_path) is None
    if (CHECKOUT / ".git").exists():
        commit = git_commit()
        assert commit is not None and len(commit.removesuffix("-dirty")) == 7


def test_the_default_layouts_are_the_issues_two_dsv4_and_glm(tmp_path):
    """The grid's "both head layouts" are the production ones of docs/kernels.md, 448+64 and 512+0."""
    r = _cli("--rows", "1", "--topk", "8", "--heads", "2", "--repeats", "1", "--warmup", "0",
             "--dtype", "float32", "--json", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert {(x["layout"], x["head_dim"]) for x in doc["results"]} == {("448+64", 512), ("512+0", 512)}
    assert "--layout 448+64,512+0" in doc["command"]


@pytest.mark.parametrize(("args", "match"), [
    (["--rows", "1,x"], "--rows"),
    (["--topk", "0"], "--topk"),
    (["--layout", "a+b"], "--layout"),
    (["--kernels", "intree.ragged_prefill"], "two or more"),
    (["--repeats", "0"], "--repeats"),
    (["--dtype", "int8"], "--dtype"),
    (["--kv-dtype", "float16"], "--kv-dtype (--dtype's or an fp8 one) must be one of bfloat16, float8_e4m3fn"),
    (["--device", "tpu"], "--device"),
    (["--heads", "0"], "--heads"),
    (["--tolerance", "1.5"], "--tolerance"),
    (["--tolerance", "-0.1"], "--tolerance"),
    (["--timer", "wallclock"], "--timer must be one of events, cupti"),
])
def test_bad_arguments_exit_2_with_a_message(args, match, tmp_path):
    r = _cli(*args, "--out", str(tmp_path))
    assert r.exit_code == 2
    assert match in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_asking_for_cuda_without_one_exits_2(tmp_path):
    r = _cli("--device", "cuda", "--out", str(tmp_path))
    assert r.exit_code == 2 and "no CUDA" in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_kernel_time_needs_cuda(tmp_path):
    r = _cli("--timer", "cupti", "--out", str(tmp_path))
    assert r.exit_code == 2 and "--timer cupti needs a CUDA device" in r.output


def test_routescope_lists_sweep():
    from routescope.cli import build_app

    r = CliRunner().invoke(build_app(), ["sweep", "--help"])
    assert r.exit_code == 0 and "--kernels" in r.output
