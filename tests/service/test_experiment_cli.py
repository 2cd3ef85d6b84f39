"""`routescope experiment start|status|stop|ack|report` on a multiprocess directory with the real experiments core, and
every bad input's exit status and message (the --url side runs against a live service in tests/dashboards)."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from typer.testing import CliRunner

import experiments as core
from dispatcher import Dispatcher, detect
from dispatcher.policy import Policy
from routescope.cli import build_app
from tests.service.test_experiments_api import call

APP = build_app()


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(APP, ["experiment", *args], env={"COLUMNS": "200"})
    assert "Traceback" not in res.output, res.output
    return res.exit_code, res.output


@pytest.mark.slow
def test_a_directory_runs_the_experiment_in_every_process_and_the_cli_reads_them_merged(tmp_path):
    d = str(tmp_path)
    code, out = run("start", "aa", "--fraction", "0.1", "--seed", "5", "--multiproc-dir", d)
    assert code == 0 and "experiment aa started" in out, out
    assert (tmp_path / "experiments" / "aa.config.json").exists()
    # two processes of the directory (two registries, two dispatchers) pick the config up at their flush
    gen = torch.Generator().manual_seed(1)
    registries = []
    for _ in range(2):
        dispatcher = Dispatcher(platform=detect(), policy=Policy())
        registry = core.Registry(dispatcher.platform, dispatcher.policy, torch_mod=torch, directory=tmp_path)
        registry.attach(dispatcher)
        registry.flush()
        assert dispatcher.arms is not None  # the directory's experiment runs here
        for i in range(40):
            call(dispatcher, (16, 200)[i % 2], gen)
        registry.flush()
        registries.append(registry)
    code, out = run("status", "--json", "--multiproc-dir", d)
    assert code == 0, out
    (e,) = json.loads(out)["experiments"]
    assert e["id"] == "aa" and e["state"] == "running" and e["processes"] == 2
    assert sum(c["calls_a"] + c["calls_b"] for c in e["cells"]) == 80  # both processes' calls, merged
    code, out = run("status", "--multiproc-dir", d)
    assert code == 0 and "aa" in out and "running" in out
    code, out = run("report", "aa", "--multiproc-dir", d)
    assert code == 0 and "B time / A time, GLM-5.3-Flash" in out and "top-k 8" in out and "16-31" in out, out
    code, out = run("stop", "aa", "--multiproc-dir", d)
    assert code == 0 and "experiment aa stopped (user)" in out, out
    for r in registries:
        r.flush()  # each process honours the stop file
        assert r.dispatchers[0].arms is None
        r.close()
    code, out = run("stop", "aa", "--multiproc-dir", d)  # idempotent
    assert code == 0 and "stopped (user)" in out
    code, out = run("start", "aa", "--multiproc-dir", d)
    assert code == 1 and "exists already" in out, out  # refused by the target (ids are never reused): exit 1
    code, out = run("ack", "aa", "--multiproc-dir", d)
    assert code == 0 and "experiment aa stopped (user): stop acknowledged" in out, out
    code, out = run("status", "aa", "--json", "--multiproc-dir", d)
    assert json.loads(out)["experiments"][0]["acknowledged"]["by"] == "user"
    code, out = run("ack", "nope", "--multiproc-dir", d)
    assert code == 2 and "no experiment 'nope'" in out, out
    code, out = run("start", "aa", "--id", "aa2", "--multiproc-dir", d, "--json")
    assert code == 0 and json.loads(out)["id"] == "aa2"
    code, out = run("ack", "aa2", "--multiproc-dir", d)
    assert code == 1 and "'aa2' is running" in out, out  # nothing to acknowledge: refused by the target


def test_a_gate_that_moves_decode_rows_onto_a_prefill_kernel_is_refused_unless_named(tmp_path):
    code, out = run("start", "gfx942_0", "--multiproc-dir", str(tmp_path))
    assert code == 2 and "decode rows onto a prefill kernel" in out and "what-if gfx942" in out, out
    assert not (tmp_path / "experiments" / "gfx942_0.config.json").exists()
    code, out = run("start", "gfx942_0", "--allow-decode-on-prefill", "--multiproc-dir", str(tmp_path))
    assert code == 0, out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, code, words", [
    (["start", "bogus"], 2, "candidate 'bogus'"),
    (["start", "gfx942_abc"], 2, "must be an integer"),
    (["start", "split_below_4294967296"], 2, "must be between 0 and 2147483647"),
    (["start", "aa", "--fraction", "0.5"], 2, "fraction"),
    (["start", "aa", "--cell", "GLM:lots"], 2, "MODEL:ROWS_BUCKET"),
    (["start", "gfx942_512", "--cell", "512-1023"], 2, "cells name the cells of an aa experiment"),
    (["start", "aa", "--url", "http://127.0.0.1:1", "--multiproc-dir", "."], 2, "not both"),
    (["status", "--multiproc-dir", "/nonexistent/dir"], 2, "is not a directory"),
    (["stop", "nope", "--multiproc-dir", "{tmp}"], 2, "no experiment 'nope'"),
    (["report", "nope", "--multiproc-dir", "{tmp}"], 2, "no experiment 'nope' (known: none)"),
    (["status", "--url", "http://127.0.0.1:{port}"], 1, "cannot reach http://127.0.0.1:{port}"),
])
def test_bad_input_exits_2_and_an_unreachable_service_1_with_one_message(tmp_path, args, code, words):
    port = _closed_port()
    args = [a.format(tmp=tmp_path, port=port) for a in args]
    got, out = run(*args)
    assert got == code and words.format(port=port) in " ".join(out.split()), out


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["--experiment", "aa"], "add --demo"),
    (["--demo", "--experiment-fraction", "0.05"], "--experiment-fraction needs --experiment NAME"),
    (["--demo", "--experiment", "aa", "--experiment-fraction", "0.5"], "--experiment-fraction"),
    (["--demo", "--experiment", "bogus"], "--experiment bogus: experiment config refused: candidate: candidate 'bogus'"),
])
def test_serve_refuses_a_bad_experiment_before_serving(args, words):
    res = CliRunner().invoke(APP, ["serve", "--port", "0", *args])
    assert res.exit_code == 2 and words in " ".join(res.output.split()), res.output
    assert "listening on" not in res.output and "Traceback" not in res.output


def test_the_report_is_the_seeds_table_measured_beside_predicted():
    from rich.console import Console

    from service.experiment_report import grids, report
    from tests.service.experiment_fixture import SEED_RATIOS, experiments

    docs = experiments()
    (g,) = grids(docs[0])
    assert g["model"] == "GLM-5.3-Flash" and g["shape"] == "512+0 h16 bfloat16/bfloat16" and g["call_class"] == "prefill"
    assert g["rows"] == list(SEED_RATIOS) and g["topk"] == ["128", "512", "2048"]
    assert g["cells"][("512-1023", "128")]["measured"] == "0.64 [0.59, 0.69]"
    assert g["cells"][("512-1023", "128")]["predicted"] == "0.67 [0.60, 0.74]"  # advise's ratio with advise's band
    console = Console(width=200, record=True)
    report(docs, console)
    text = console.export_text()
    assert "B time / A time, GLM-5.3-Flash, 512+0 h16 bfloat16/bfloat16, prefill" in text
    assert "measured [95% band] | predicted [advise's band]" in text
    assert "0.43 [0.38, 0.48] | 0.45 [0.41, 0.50]" in text and "measured crossover: 512 rows" in text
    assert "aa: candidate aa at fraction 0.01, stopped (harm)" in text and "not yet measured" in text
    assert "never moved: candidate_unavailable 3, capture 12; numerics: 9 checked, 0 mismatched" in text
