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


@pytest.mark.slow
def test_bench_ab_runs_on_the_cpu(tmp_path):
    res = CliRunner().invoke(build_app(), ["bench", "ab", "--calls", "40", "--max-rows", "256", "--repeats", "1",
                                           "--gate", "16", "--device", "cpu", "--out", str(tmp_path / "ab.json")])
    assert res.exit_code == 0, res.output
    assert "plumbing" in res.output and "measured saving" in res.output and "GLM-5.3-Flash" in res.output
    out = json.loads((tmp_path / "ab.json").read_text())
    assert out["device"] == "cpu" and out["gate"] == 16 and "host clock" in out["clock"] and "plumbing" in out["clock"]
    assert [t["name"] for t in out["tables"]] == ["fresh sweep"] and out["tables"][0]["provenance"] == "measured here"
    glm = out["models"]["GLM-5.3-Flash"]
    assert glm["moved_calls"] > 0 and glm["measured_a_s"] > 0 and glm["measured_b_s"] > 0
    assert glm["predicted_saving_s"]["fresh sweep"]["low"] <= glm["predicted_saving_s"]["fresh sweep"]["high"]
    assert out["measured_saving_s"] == pytest.approx(sum(m["measured_saving_s"] for m in out["models"].values()))


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
