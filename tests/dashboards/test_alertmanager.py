"""dashboards/alertmanager.yml: amtool's checks, and its routing, grouping and inhibition on a real Alertmanager.

The alerts are posted to Alertmanager's API with the labels Prometheus gives them (alerts.yml),
so every case runs in seconds; tests/dashboards/test_alert_delivery_e2e.py sends real ones.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.amserver import WebhookReceiver, require, start_alertmanager
from tests.dashboards.alerting import AM_CONFIG, am_config

GLM, DSV = "GLM-5.3-Flash", "DeepSeek-V4.1-Flash"


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require("amtool"), *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config_passes():
    r = _amtool("check-config", str(AM_CONFIG))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    assert "2 inhibit rules" in r.stdout and "2 receivers" in r.stdout, r.stdout


def test_amtool_check_config_fails_on_a_route_to_no_receiver(tmp_path):
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(AM_CONFIG.read_text().replace("receiver: routescope-pager", "receiver: nobody"))
    r = _amtool("check-config", str(broken))
    assert r.returncode != 0 and "nobody" in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("labels, receiver", [
    ({"alertname": "DecodeInPrefill", "severity": "critical"}, "routescope-pager"),
    ({"alertname": "RoutescopeKernelErrors", "severity": "critical"}, "routescope-pager"),
    ({"alertname": "DecodeRowsInPrefill", "severity": "warning"}, "routescope-tickets"),
    ({"alertname": "SomethingElse"}, "routescope-tickets"),
])
def test_routes_on_severity(labels, receiver):
    r = _amtool("config", "routes", "test", f"--config.file={AM_CONFIG}", *(f"{k}={v}" for k, v in labels.items()))
    assert r.returncode == 0 and r.stdout.strip() == receiver, r.stdout + r.stderr


def test_an_experiment_kill_switch_has_its_own_route_one_group_per_experiment():
    r = _amtool("config", "routes", "test", f"--config.file={AM_CONFIG}", "--tree",
                "alertname=RoutescopeExperimentStopped", "severity=warning", "experiment=gate512")
    assert r.returncode == 0 and '{alertname="RoutescopeExperimentStopped"}  receiver: routescope-tickets' in r.stdout, \
        r.stdout + r.stderr
    (route,) = [x for x in yaml.safe_load(AM_CONFIG.read_text())["route"]["routes"]
                if x["matchers"] == ['alertname="RoutescopeExperimentStopped"']]
    assert "experiment" in route["group_by"] and route["group_wait"] == "0s"
    assert route["repeat_interval"] == "4h"  # reminded until acknowledged (the rule fires until the ack)


def test_every_receiver_sends_resolved_notifications():
    for receiver in yaml.safe_load(AM_CONFIG.read_text())["receivers"]:
        assert all(w["send_resolved"] for w in receiver["webhook_configs"]), receiver["name"]


def _alert(name: str, severity: str, instance: str, model: str | None = None) -> dict:
    labels = {"alertname": name, "severity": severity, "job": "routescope", "instance": instance}
    if model:
        labels |= {"model": model, "kernel": "intree.ragged_prefill"}
    return {"labels": labels, "annotations": {"summary": f"{name} on {instance}"}}


POSTED = [
    _alert("DecodeInPrefill", "critical", "a:9475", GLM),
    _alert("DecodeInPrefill", "critical", "f:9475", GLM),  # a second rank of GLM: same group
    _alert("DecodeInPrefill", "critical", "e:9475", DSV),  # another model: its own group
    _alert("DecodeRowsInPrefill", "warning", "a:9475", GLM),  # inhibited by a's DecodeInPrefill
    _alert("DecodeRowsInPrefill", "warning", "b:9475", GLM),  # another target: not inhibited
    _alert("RoutescopeTargetDown", "warning", "c:9475"),
    _alert("RoutescopeKernelErrors", "critical", "c:9475", DSV),  # inhibited: its target is down
    _alert("RoutescopeKernelErrors", "critical", "d:9475", DSV),
]
INHIBITED = {("DecodeRowsInPrefill", "a:9475"), ("RoutescopeKernelErrors", "c:9475")}
# path -> {(alertname, model): instances}: what the webhook must receive, and nothing else.
EXPECTED = {
    "/routescope/critical": {("DecodeInPrefill", GLM): {"a:9475", "f:9475"}, ("DecodeInPrefill", DSV): {"e:9475"},
                             ("RoutescopeKernelErrors", DSV): {"d:9475"}},
    "/routescope/warning": {("DecodeRowsInPrefill", GLM): {"b:9475"}, ("RoutescopeTargetDown", ""): {"c:9475"}},
}


def _notified(received: list) -> dict[str, dict[tuple[str, str], set[str]]]:
    out: dict[str, dict[tuple[str, str], set[str]]] = {}
    for path, payload in received:
        key = (payload["groupLabels"]["alertname"], payload["groupLabels"].get("model", ""))
        out.setdefault(path, {}).setdefault(key, set()).update(a["labels"]["instance"] for a in payload["alerts"])
    return out


def test_grouping_routing_and_inhibition_on_a_real_alertmanager(tmp_path):
    with WebhookReceiver() as hook, start_alertmanager(tmp_path, config=am_config(hook)) as am:
        am.post_alerts(POSTED)
        suppressed = am.wait_for(
            lambda: {(a["labels"]["alertname"], a["labels"]["instance"]): a["status"]
                     for a in am.alerts(inhibited="true", active="false")},
            timeout=20, what="the inhibited alerts")
        assert set(suppressed) == INHIBITED, suppressed
        assert all(s["state"] == "suppressed" and s["inhibitedBy"] for s in suppressed.values()), suppressed
        got = hook.wait_for(lambda r: _notified(r) if _notified(r) == EXPECTED else None, timeout=20,
                            what="one notification per alert name and model, routed on severity")
        assert got == EXPECTED
        for _, payload in hook.received():
            assert set(payload["groupLabels"]) <= {"alertname", "job", "model"}, payload["groupLabels"]
            assert payload["receiver"] == {"critical": "routescope-pager", "warning": "routescope-tickets"}[
                payload["commonLabels"]["severity"]], payload


def test_a_missing_binary_fails_under_ci_and_skips_elsewhere():
    with pytest.raises(pytest.fail.Exception, match="CI must install it"):
        require("routescope-no-such-binary", {"CI": "1"})
    for env in ({}, {"CI": "0"}, {"CI": "false"}):
        with pytest.raises(pytest.skip.Exception, match="apt-get install -y prometheus-alertmanager"):
            require("routescope-no-such-binary", env)
