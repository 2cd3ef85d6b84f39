"""The control API on both targets: an in-process registry and a multiprocess directory."""

from __future__ import annotations

import pytest

from experiments import ExperimentConfig, ExperimentError, NotStopped, Registry, acknowledge, experiments, start, stop

from .helpers import call_args, cpu_dispatcher

CONTRACT = {"id", "candidate", "fraction", "state", "stop_reason", "cells", "saving", "history"}
CELL = {"model", "rows_bucket", "kernel_a", "kernel_b", "calls_a", "calls_b", "timed_a", "timed_b", "ratio",
        "ratio_low", "ratio_high", "prediction"}


def _run(dispatcher, registry, calls=240):
    for i in range(calls):
        dispatcher(*call_args([2, 40, 100][i % 3], seed=i % 5), model="m")
    registry.flush()


def test_registry_start_run_stop_contract():
    d = cpu_dispatcher()
    reg = Registry(d.platform, d.policy)
    reg.attach(d)
    view = start(reg, ExperimentConfig(id="e1", candidate="split_below_64", fraction=0.1, harm_bound=1.0,
                                       budget=1.0))
    assert view["state"] == "running" and view["stop_reason"] is None
    assert view["saving"] == {"seconds": None, "low": None, "high": None}  # nothing timed yet: unknown, not zero
    _run(d, reg)
    (item,) = experiments(reg)
    assert CONTRACT <= set(item)
    assert {c["rows_bucket"] for c in item["cells"]} == {"2-3", "32-63"}  # 100 rows: both arms agree
    for cell in item["cells"]:
        assert CELL <= set(cell)
        assert cell["calls_a"] + cell["calls_b"] == 80
    assert set(item["saving"]) == {"seconds", "low", "high"} and item["saving"]["seconds"] is not None
    with pytest.raises(ExperimentError, match="is running"):
        start(reg, ExperimentConfig(id="e2", candidate="aa"))
    with pytest.raises(NotStopped, match="'e1' is running: only a stopped experiment's stop is acknowledged"):
        acknowledge(reg, "e1")
    stopped = stop(reg, "e1")
    assert stopped["state"] == "stopped" and stopped["stop_reason"] == "user" and stopped["acknowledged"] is None
    assert d.arms is None
    assert acknowledge(reg, "e1")["acknowledged"]["by"] == "user" and experiments(reg)[0]["state"] == "stopped"


def test_directory_target_merges_processes_and_stops_all(tmp_path):
    config = ExperimentConfig(id="dir1", candidate="split_below_64", fraction=0.1, harm_bound=1.0, budget=1.0)
    start(tmp_path, config)
    with pytest.raises(ExperimentError, match="exists already"):
        start(tmp_path, config)
    procs = []
    for _ in range(2):  # two "processes": two registries bound to one directory
        d = cpu_dispatcher()
        reg = Registry(d.platform, d.policy, directory=tmp_path)
        reg.attach(d)
        reg.flush()  # picks the config up
        assert d.arms is not None
        _run(d, reg)
        procs.append((d, reg))
    (item,) = experiments(tmp_path)
    assert item["processes"] == 2
    one = procs[0][1].views()[0]
    for merged in item["cells"]:
        mine = next(c for c in one["cells"] if c["rows_bucket"] == merged["rows_bucket"])
        assert merged["calls_a"] + merged["calls_b"] == 2 * (mine["calls_a"] + mine["calls_b"])
        assert merged["calls_b"] == 2 * mine["calls_b"]  # one config, one assignment: both processes alike
    stop(tmp_path, "dir1")
    for d, reg in procs:
        reg.flush()
        assert d.arms is None
    assert experiments(tmp_path)[0]["state"] == "stopped"
    # acknowledging the stop is recorded once, in the directory, for every reader; the experiment stays stopped
    assert experiments(tmp_path)[0]["acknowledged"] is None
    first = acknowledge(tmp_path, "dir1", by="oncall")["acknowledged"]
    assert first["by"] == "oncall" and first["at"] > 0
    assert acknowledge(tmp_path, "dir1", by="someone else")["acknowledged"] == first  # the first one stays
    assert experiments(tmp_path)[0]["acknowledged"] == first and experiments(tmp_path)[0]["state"] == "stopped"
    with pytest.raises(ExperimentError, match="no experiment 'nope'"):
        acknowledge(tmp_path, "nope")
