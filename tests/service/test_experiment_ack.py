"""Acknowledging a stopped experiment's stop over HTTP, on the real experiments core: the loopback checks, the
refusals, the exported ack series, and the shipped alert rule evaluated by promtool on the series the service
really exported before and after (RoutescopeExperimentStopped fires until the ack, then resolves)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.service.test_experiments_api import LOOPBACK, client, stack  # noqa: F401 - the fixture

ALERTS = Path(__file__).resolve().parents[2] / "dashboards" / "alerts.yml"
SERIES = ("routescope_experiment_state", "routescope_experiment_acknowledged_timestamp_seconds")
TARGET = {"job": "routescope", "instance": "127.0.0.1:9475"}


def _exported(c) -> dict[tuple, float]:
    """The samples of the two series the alert reads, as Prometheus would store them (with job and instance)."""
    out = {}
    for family in text_string_to_metric_families(c.get("/metrics").text):
        if family.name in SERIES:
            for s in family.samples:
                out[(s.name, tuple(sorted({**s.labels, **TARGET}.items())))] = s.value
    return out


def _rule_expr() -> str:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return next(r["expr"] for g in groups for r in g["rules"] if r.get("alert") == "RoutescopeExperimentStopped")


def test_an_ack_is_loopback_only_refused_when_there_is_no_stop_and_resolves_the_alert(stack, tmp_path):  # noqa: F811
    app, _, registry = stack
    c = client(app)
    assert c.post("/experiments", json={"id": "g", "candidate": "aa", "fraction": 0.1}).status_code == 201
    r = c.post("/experiments/g/ack")
    assert r.status_code == 409 and "'g' is running" in r.json()["message"]  # nothing to acknowledge yet
    assert c.post("/experiments/nope/ack").status_code == 404
    registry.all["g"].stop("harm")  # the kill switch, as the flush stops on harm
    registry.flush()
    before = _exported(c)
    assert not [k for k in before if k[0] == SERIES[1]]  # no acknowledgement yet: no sample
    for peer, base, headers in ((("10.0.0.7", 4000), "http://127.0.0.1", {}),
                                (LOOPBACK, "http://metrics.example.com", {}),
                                (LOOPBACK, "http://127.0.0.1", {"origin": "http://evil.example"})):
        r = client(app, peer, base).post("/experiments/g/ack", headers=headers)
        assert r.status_code == 403, r.text
    assert c.get("/experiments").json()["experiments"][0]["acknowledged"] is None
    r = c.post("/experiments/g/ack")
    assert r.status_code == 200, r.text
    acked = r.json()
    assert (acked["state"], acked["stop_reason"]) == ("stopped", "harm") and acked["acknowledged"]["by"] == "user"
    assert c.post("/experiments/g/ack").json()["acknowledged"] == acked["acknowledged"]  # idempotent
    after = _exported(c)
    (ack,) = [v for k, v in after.items() if k[0] == SERIES[1]]
    assert ack == pytest.approx(acked["acknowledged"]["at"])
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    # the shipped rule on exactly these series: exported as before for 10 minutes, then as after
    series = []
    for key in sorted(set(before) | set(after)):
        name, labels = key
        values = [before.get(key)] * 10 + [after.get(key)] * 10
        text = ",".join(f'{k}="{v}"' for k, v in labels)
        series.append({"series": f"{name}{{{text}}}",
                       "values": " ".join("_" if v is None else repr(v) for v in values)})
    fired = {"labels": '{candidate="aa",experiment="g",instance="127.0.0.1:9475",job="routescope",stop_reason="harm"}',
             "value": 1}
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": series,
           "promql_expr_test": [{"expr": _rule_expr(), "eval_time": "5m", "exp_samples": [fired]},
                                {"expr": _rule_expr(), "eval_time": "15m", "exp_samples": []}]}]}
    path = tmp_path / "ack-test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
