"""`routescope bench host|graphs|fidelity` on CPU: the parts that run here run and report numbers; the GPU-only
part says why it cannot run instead of inventing a figure (the H200 figures are in docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from routescope.cli import build_app

runner = CliRunner()
app = build_app()


def test_bench_host_times_what_exists_on_cpu():
    res = runner.invoke(app, ["bench", "host", "--rows", "2", "--batch", "2", "--batches", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    us = out["us_per_call"]
    assert set(us) >= {"torch_noop", "launch_prefill_2", "launch_decode_2", "dispatcher_2", "dispatcher_telemetry_2"}
    assert all(v > 0 for v in us.values())
    assert out["impls"] == {"prefill_2": "torch", "decode_2": "torch"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="what the CPU leaves out")
def test_bench_host_on_cpu_says_what_it_did_not_time():
    res = runner.invoke(app, ["bench", "host", "--rows", "2,1024", "--batch", "2", "--batches", "3"],
                        env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "not as asked: rows 1024: left out on the CPU" in text and "timed rows 2" in text
    assert "not as asked: triton_noop: not timed (no CUDA device" in text
    assert "launch_prefill_1024" not in text and "triton_noop │" not in text  # and indeed not in the table


@pytest.mark.parametrize(("rows", "said"), [
    ("two", "routescope bench: --rows takes comma-separated integers; 'two' is not one"),
    ("0", "routescope bench: --rows values must be between 1 and 1048576; got 0"),
    ("2,1048577", "routescope bench: --rows values must be between 1 and 1048576; got 1048577"),
])
def test_bench_host_rejects_bad_rows_in_one_line_as_sweep_does(rows, said):
    res = runner.invoke(app, ["bench", "host", "--rows", rows])
    assert res.exit_code == 2 and res.output.strip() == said
    sweep = runner.invoke(app, ["sweep", "--rows", rows, "--out", "/tmp/unused"])
    assert sweep.exit_code == 2 and sweep.output.strip() == said.replace("bench", "sweep")


def test_bench_graphs_times_the_host_side_accounting():
    res = runner.invoke(app, ["bench", "graphs", "--calls", "8", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["calls_per_graph"] == 8 and out["apply_us"]["one_slot"] > 0 and out["apply_us"]["8_slots"] > 0
    assert "no CUDA" in out["device"] or out.get("exact") is True


def test_bench_graphs_prints_a_table_without_json():
    res = runner.invoke(app, ["bench", "graphs", "--calls", "4"])
    assert res.exit_code == 0, res.output
    assert "ReplayRecord.apply, one slot" in res.stdout and "ReplayRecord.apply, 4 slots" in res.stdout
    assert not res.stdout.lstrip().startswith("{")


def test_bench_fidelity_needs_cuda():
    if torch.cuda.is_available():
        return
    res = runner.invoke(app, ["bench", "fidelity"])
    assert res.exit_code == 2 and "CUDA" in res.output


@pytest.mark.parametrize("layout, said", [("512x64", "NOPE+ROPE"), ("512+64,448+64", "one layout")])
def test_bench_fidelity_rejects_a_bad_layout_before_asking_for_a_gpu(layout, said):
    res = runner.invoke(app, ["bench", "fidelity", "--layout", layout])
    assert res.exit_code == 2 and said in res.output, res.output


def test_bench_host_items_take_turns_a_batch_each_round():
    from telemetry.bench.host import per_call_us_interleaved

    seen: list[str] = []
    syncs: list[int] = []
    fns = {name: (lambda n: lambda: seen.append(n))(name) for name in ("a", "b")}
    got = per_call_us_interleaved(fns, batch=4, batches=2, sync=lambda: syncs.append(len(seen)))
    assert set(got) == {"a", "b"} and all(v > 0 for v in got.values())
    warm = ["a"] * 3 + ["b"] * 3
    turn = lambda n: [n] * 7  # noqa: E731 - three untimed calls, then the batch of four
    assert seen == warm + turn("a") + turn("b") + turn("a") + turn("b")
    assert syncs == [6, 13, 20, 27, 34], "a sync after the warm-up and after every batch"


def test_bench_fidelity_renders_the_frame_in_use_and_the_frame_it_measured(capsys):
    from telemetry.bench.fidelity import render

    point = {"rows": 2, "regime": "idle", "samples": 40, "cupti_calls": 40, "clocks": ["device"],
             "telemetry_median_us": 8.6, "cupti_median_us": 8.5, "median_error_pct": 1.2, "telemetry_p90_us": 8.7,
             "cupti_p90_us": 8.6, "p90_error_pct": 1.1, "within_bound": True, "span_median_us": 7.4,
             "frame_gap_ns": 1100.0}
    render({"device": "GPU", "layout": "512+64", "topk": 2048, "dtype": "bf16", "guard": "reroute",
            "calls_per_point": 40, "bound_pct": 10.0, "frame_ns_in_use": 1184, "frame_ns_measured": 1100,
            "points": [point]})
    out = capsys.readouterr().out
    assert "1184 ns added to each stamped span" in out and "measured here 1100 ns" in out
    assert "+1.2%" in out and "yes" in out


@pytest.mark.parametrize("value", ["-2", "100001", "abc"])
def test_bench_fidelity_rejects_a_bad_frame_before_asking_for_a_gpu(value):
    res = runner.invoke(app, ["bench", "fidelity", "--frame-ns", value])
    assert res.exit_code == 2 and "--frame-ns" in res.output, res.output


def test_bench_multiproc_prints_routescope_beside_prometheus_client_for_classic_and_native_files():
    res = runner.invoke(app, ["bench", "multiproc", "--processes", "2", "--kills", "0", "--repeats", "0",
                              "--scrapes", "1", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("{"):])["scrape"]
    assert [(r["processes"], r["series"]) for r in rows] == [(2, "classic"), (2, "native")]
    for r in rows:  # the same series: the readers are compared on equal work
        assert r["files"] == 8 and r["samples"] > 0
        assert r["prometheus_client_text_s"] > 0 and r["routescope_text_s"] > 0 and r["routescope_protobuf_s"] > 0
    assert rows[1]["bytes_on_disk"] > rows[0]["bytes_on_disk"]  # the native buckets are in the files
    table = runner.invoke(app, ["bench", "multiproc", "--processes", "2", "--kills", "0", "--repeats", "0",
                                "--scrapes", "1"])
    assert table.exit_code == 0 and "prometheus_client text" in table.stdout and "native" in table.stdout


def test_bench_fidelity_graphs_asks_for_kernels_without_stamps_then_for_a_gpu():
    res = runner.invoke(app, ["bench", "fidelity", "--graphs"])
    assert res.exit_code == 2 and "--no-stamps" in res.output, res.output
    if not torch.cuda.is_available():
        res = runner.invoke(app, ["bench", "fidelity", "--graphs", "--no-stamps"])
        assert res.exit_code == 2 and "needs a CUDA device" in res.output, res.output


def test_bench_fidelity_graphs_renders_each_clock_and_the_costs(capsys):
    from telemetry.bench.graph_fidelity import render

    point = {"case": "split-K", "guard": "reroute", "rows": 2, "calls": 8, "clock": "bracket", "regime": "synced",
             "constant_ns": 768, "samples": 320, "cupti_calls": 320, "telemetry_median_us": 7.31,
             "cupti_median_us": 7.2, "median_error_pct": 1.5, "telemetry_p90_us": 7.6, "cupti_p90_us": 7.5,
             "p90_error_pct": 1.3, "within_bound": True}
    old = {**point, "clock": "graph", "constant_ns": None, "telemetry_median_us": 14.2, "median_error_pct": 97.6,
           "telemetry_p90_us": 17.0, "p90_error_pct": 127.4, "within_bound": False}
    cost = {"case": "split-K", "rows": 2, "calls": 8, "clock": "bracket", "gpu_us_per_timed_call": 1.62,
            "gpu_us_per_timed_call_range": [1.48, 1.71], "aa_gpu_us_per_call": -0.03,
            "host_us_added_per_replay": 4.1, "bare_host_us_per_replay": 6.0}
    dear = {**cost, "clock": "graph", "gpu_us_per_timed_call": 3.95, "gpu_us_per_timed_call_range": [3.9, 4.6]}
    render({"device": "GPU", "layout": "512+64", "topk": 2048, "dtype": "bf16", "replays_per_point": 40,
            "bound_pct": 10.0, "bracket_constant_ns": [736, 768, 800], "points": [point, old], "costs": [cost, dear]})
    out = capsys.readouterr().out
    assert "+1.5%" in out and "+97.6%" in out and "+1.62" in out
    assert "+1.48 to +1.71" in out and "-0.03" in out and "within 2 µs" in out
    assert out.count(" NO ") == 2, "the 10% bound missed by the old clock, the 2 µs aim by its pair"
    assert "736-800 ns over 3 calibrations, median 768 ns" in out


@pytest.mark.parametrize(("args", "said"), [
    (["multiproc", "--processes", "x"], "routescope bench: --processes takes comma-separated integers; 'x' is not one"),
    (["multiproc", "--processes", "0"], "routescope bench: --processes values must be between 1 and 4096; got 0"),
    (["quantiles", "--device", "tpu"], "routescope bench: --device must be cuda or cpu (or empty: cuda if present); got 'tpu'"),
])
def test_bad_bench_options_are_one_line_before_any_work(args, said):
    res = runner.invoke(app, ["bench", *args])
    assert res.exit_code == 2 and res.output.strip() == said
