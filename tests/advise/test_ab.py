"""`routescope bench ab`: the demo's calls sampled over a cycle, routed per arm, timed, beside advise's prediction.

On this CPU it runs torch kernels at the demo's scaled shapes by the host clock: the plumbing,
not a figure (the H200 run is in docs/benchmarks.md).
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from advise.ab import Arm, route, sample_cycle, shapes_for
from advise.ab_cli import ab_cells
from advise.policies import SPLIT_K, target_for
from dispatcher.policy import Policy
from routescope.cli import build_app

from .fixtures import RAGGED


def test_the_sample_spreads_over_a_cycle_of_both_models():
    calls = sample_cycle(7, 60)
    assert len(calls) == 60 and all(c.entry == "prefill" for c in calls)
    assert {c.model for c in calls} == {"DeepSeek-V4.1-Flash", "GLM-5.3-Flash"}
    assert len({c.scenario for c in calls}) >= 6  # not just the first scenario's calls
    assert {c.kind for c in calls} >= {"prefill", "pure_decode", "mixed"}  # the GLM bug: decodes through prefill
    assert sample_cycle(7, 60) == calls


def test_arms_route_as_their_gate_says():
    shapes = shapes_for(torch.device("cpu"))
    target = target_for("cpu")
    split = Arm("split_below_64", Policy(), split_below=64)
    for c in sample_cycle(7, 80):
        assert route(c, shapes[c.model], Arm("active", Policy()), target) == RAGGED
        assert route(c, shapes[c.model], split, target) == (SPLIT_K if c.rows < 64 else RAGGED)


def _seconds(cell: str) -> float:
    value, unit = cell.split()
    return float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]


@pytest.mark.slow
def test_bench_ab_runs_on_the_cpu_without_a_gate_and_its_table_adds_up(tmp_path):
    """No --gate: the fresh CPU sweep predicts no gate saves, so the one predicted to lose least is replayed."""
    res = CliRunner().invoke(build_app(), ["bench", "ab", "--calls", "40", "--max-rows", "64", "--repeats", "1",
                                           "--device", "cpu", "--out", str(tmp_path / "ab.json")])
    assert res.exit_code == 0, res.output
    assert "plumbing" in res.output and "measured saving" in res.output and "GLM-5.3-Flash" in res.output
    out = json.loads((tmp_path / "ab.json").read_text())
    assert out["device"] == "cpu" and "host clock" in out["clock"] and "plumbing" in out["clock"]
    assert [t["name"] for t in out["tables"]] == ["fresh sweep"] and out["tables"][0]["provenance"] == "measured here"
    predicted = out["predicted_saving_s"]["fresh sweep"]
    assert predicted is not None and predicted["low"] <= predicted["mid"] <= predicted["high"]
    if predicted["mid"] > 0:
        assert out["gate_choice"] == "advise's best on table fresh sweep"
    else:
        assert out["gate_choice"].startswith("no scanned gate is predicted to save on table fresh sweep; "
                                             f"gate {out['gate']} is predicted to lose the least")
    assert f"gate {out['gate']} rows ({out['gate_choice']})" in " ".join(res.stdout.split())
    glm = out["models"]["GLM-5.3-Flash"]
    assert glm["moved_calls"] > 0 and glm["measured_a_s"] > 0 and glm["measured_b_s"] > 0
    assert out["measured_saving_s"] == pytest.approx(sum(m["measured_saving_s"] for m in out["models"].values()))
    rows = {r[0]: r for r in ab_cells(out)}
    models = [rows[m] for m in out["models"]]
    total = rows["all"]
    assert int(total[1]) == sum(int(r[1]) for r in models) == out["calls"]
    assert int(total[2]) == sum(int(r[2]) for r in models)
    for col in (3, 4, 5):  # arm A, arm B, measured saving: the models' printed figures sum to the total's (3 digits)
        assert _seconds(total[col]) == pytest.approx(sum(_seconds(r[col]) for r in models), rel=0.01, abs=2e-6)
    for r, m in zip(models, out["models"].values()):
        if m["moved_calls"] == 0:
            assert _seconds(r[5]) == 0  # no call moved, nothing saved or lost, whatever the arms' noise
    mid = _seconds(total[6].split(" (")[0])
    assert float(total[-1]) == pytest.approx(mid / _seconds(total[5]), rel=0.02)


def test_bench_ab_refuses_before_any_replay_when_no_table_prices_a_gate():
    """The H200 table has no top-k 32 (the CPU replay's scaled shapes), and no fresh sweep was asked for: known at
    once, refused in one line before any call is timed."""
    res = CliRunner().invoke(build_app(), ["bench", "ab", "--device", "cpu", "--table", "h200"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("routescope bench ab: no table prices a scanned gate on this replay")
    assert "not in the table" in lines[0] and lines[0].endswith("give one with --gate, or --table fresh")


def test_a_bad_table_is_refused_before_the_fresh_sweep():
    res = CliRunner().invoke(build_app(), ["bench", "ab", "--device", "cpu", "--table", "fresh", "--table",
                                           "/nonexistent/t.json"])
    assert res.exit_code == 2 and res.output.strip() == "routescope bench ab: --table: /nonexistent/t.json: (file): no such file"


def test_bench_ab_refuses_what_it_cannot_do():
    res = CliRunner().invoke(build_app(), ["bench", "ab", "--device", "tpu"])
    assert res.exit_code == 2 and "--device must be auto, cpu or cuda" in res.output
    res = CliRunner().invoke(build_app(), ["bench", "ab", "--device", "cpu", "--calls", "4", "--gate", "16",
                                           "--table", "/nonexistent/t.json"])
    assert res.exit_code == 2 and "--table: /nonexistent/t.json: (file): no such file" in res.output


def test_an_unknown_prediction_says_why_in_text_as_in_json():
    """The H200 table has no top-k 32 (the CPU replay's scaled shapes): the figure is unknown, and both say why."""
    args = ["bench", "ab", "--device", "cpu", "--table", "h200", "--calls", "40", "--max-rows", "256", "--repeats",
            "1", "--gate", "16"]
    res = CliRunner().invoke(build_app(), [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    name = out["tables"][0]["name"]
    assert out["predicted_saving_s"][name] is None
    for model, r in out["models"].items():
        why = r["predicted_unknown"][name]
        assert r["predicted_saving_s"][name] is None and "have no price" in why and "not in the table" in why
    assert out["predicted_unknown"][name] == f"the sum needs every model's; unknown for {', '.join(out['models'])}"
    text = " ".join(CliRunner().invoke(build_app(), args, env={"COLUMNS": "400"}).stdout.split())
    assert f"unknown: {next(iter(out['models'].values()))['predicted_unknown'][name].split(' (')[0]}" in text
    assert "n/a: no prediction" in text and f"unknown: {out['predicted_unknown'][name]}" in text
