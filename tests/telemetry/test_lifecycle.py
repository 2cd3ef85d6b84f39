"""The flush thread starts and stops cleanly; concurrent callers are counted exactly; the bench commands run."""

from __future__ import annotations

import json
import threading
import time

from typer.testing import CliRunner

from telemetry import TelemetryConfig
from telemetry.bench.cli import bench_app
from telemetry.bench.gpu_replay import _mix, main as gpu_main
from telemetry.bench.workload import make_calls

from .conftest import dispatcher


def test_flush_thread_start_close(make_tel):
    tel = make_tel()
    d = tel.instrument(dispatcher())
    assert tel.start(flush_interval_s=0.02) is tel
    assert tel.start() is tel  # idempotent
    for args, kw in make_calls(50):
        d(*args, **kw)
    deadline = time.time() + 10
    while tel.snapshot(flush=False)["health"]["flush_lag_s"] is None and time.time() < deadline:
        time.sleep(0.01)
    health = tel.snapshot()["health"]
    assert health["flush_thread"] and health["flush_lag_s"] is not None and health["last_flush_ts"]
    thread = tel._thread
    assert thread is not None and thread.name == "routescope-telemetry-flush" and thread in threading.enumerate()
    tel.close()
    tel.close()  # idempotent
    assert not thread.is_alive() and not tel.running  # (another test's telemetry may still run its own thread)
    assert sum(tel.totals.calls.values()) == 50


def test_concurrent_callers_counted_exactly(make_tel):
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4"), log_first_decode_in_prefill=False))
    d = tel.instrument(dispatcher())
    calls = make_calls(2_000)
    tel.start(flush_interval_s=0.01)

    def worker() -> None:
        for _ in range(5):
            for args, kw in calls:
                d(*args, **kw)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals = tel.flush()
    assert sum(totals.calls.values()) == 4 * 5 * 2_000
    assert sum(totals.rows.values()) == 4 * 5 * sum(a[0].shape[0] for a, _ in calls)


def test_bench_overhead_cli_json():
    res = CliRunner().invoke(bench_app, ["overhead", "--calls", "64", "--repeats", "3", "--json", "--multiprocess"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    for key in ("bare_ns_per_call", "instrumented_ns_per_call", "naive_prometheus_ns_per_call"):
        assert out[key] > 0
        assert out["real_kernels"][key] > 0
        assert out["multiprocess"][key] > 0
    assert "no-op" in out["kernel_note"]
    assert out["noop_kernel"]["telemetry_errors"] == 0
    assert out["multiprocess"]["multiprocess"] is True


def test_bench_overhead_repeats_the_noop_run_in_fresh_processes():
    res = CliRunner().invoke(bench_app, ["overhead", "--calls", "64", "--repeats", "3", "--no-real", "--processes",
                                         "2"])
    assert res.exit_code == 0, res.output
    assert "fresh process 1 of 2" in res.stderr and "fresh process 2 of 2" in res.stderr
    assert "no-op run in 2 fresh processes" in res.stdout
    res = CliRunner().invoke(bench_app, ["overhead", "--calls", "64", "--repeats", "3", "--no-real", "--processes",
                                         "2", "--json"])
    out = json.loads(res.stdout[res.stdout.index("{"):])
    p = out["processes"]
    assert p["processes"] == 2 and len(p["instrumented_minus_bare_ns"]) == 2 and len(p["bare_ns_per_call"]) == 2
    assert all(b > 0 for b in p["bare_ns_per_call"]) and p["telemetry_errors"] == 0
    lo, hi = sorted(p["instrumented_minus_bare_ns"])
    assert lo <= p["instrumented_minus_bare_median_ns"] <= hi
    assert CliRunner().invoke(bench_app, ["overhead", "--processes", "0"]).exit_code == 2


def test_routescope_bench_is_wired():
    from routescope.cli import build_app

    res = CliRunner().invoke(build_app(), ["bench", "overhead", "--help"])
    assert res.exit_code == 0 and "--multiprocess" in res.output


def test_gpu_replay_needs_a_device(tmp_path, capsys):
    assert gpu_main(["--out", str(tmp_path / "x.json")]) == 2
    mix = _mix([512, 1024], [2, 16], 3)
    assert len(mix) == 8 and mix[0][1]["num_decodes"] == 4 and mix[1][1]["num_prefills"] == 0


def test_gpu_replay_phases_run_on_cpu(monkeypatch, capsys):
    """The replay's throughput phases, on CPU tensors with CUDA calls stubbed: the script's logic runs."""
    import torch

    import telemetry.bench.gpu_replay as g
    from dispatcher import Policy, what_if

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda *a, **k: None)
    monkeypatch.setattr(g, "detect", lambda: what_if("cpu"))
    mix = g._mix([64], [2, 4], 2)
    calls = make_calls(len(mix), heads=2, nope=48, rope=16, topk=8, kv_rows=32, dtype=torch.float32, mix=mix)
    t = g.throughput(calls, policy=Policy(), blocks=2, iters=1)
    assert t["telemetry_counts"] == 3 * (2 + 1 + 2)  # warm-up 2 + 1, then 2 blocks of 1 pass and t["timing"] == "host"
    aa = g.throughput(calls, policy=Policy(), blocks=2, iters=1, aa=True)  # the A/A control: telemetry sees nothing
    assert aa["aa_control"] and aa["telemetry_counts"] == 0 and not t["aa_control"]
    g._print({"device": "cpu", "torch": torch.__version__, "mix_calls": len(calls), "throughput": t,
              "throughput_aa": aa})
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("throughput")]
    assert len(lines) == 2 and "A/A control" in lines[1] and "A/A" not in lines[0], lines
