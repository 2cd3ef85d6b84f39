"""Delivery end to end: rules -> a real Prometheus -> a real Alertmanager -> the webhook a person reads.

Two `routescope serve --demo` processes (the second with --demo-glm-bug), a Prometheus that
scrapes them and evaluates the rules every second and sends its alerts to an Alertmanager
running dashboards/alertmanager.yml, whose webhooks post to a receiver in this test.

Shortened here so that the module takes about a minute (tests/dashboards/alerting.py does it):
the decode-in-prefill rules look back 45 s instead of 5m (the demo's GLM
pure decodes come in bursts up to ~20 s apart on a busy machine: a shorter window would let
the alert resolve by itself before the fix); DecodeInPrefill waits 5 s (shipped:
30 s) and DecodeRowsInPrefill 10 s (shipped: 5m; longer than the critical alert's wait, as
shipped); Alertmanager's group timers are 1 s. Runbook links are rendered with this checkout's
docs/runbook.md as their base (a file: URL), so the test can open what a notification links.
The fix is the operator's: the GLM instance restarts without the bug on the same port.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from datetime import datetime
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.amserver import WebhookReceiver, start_alertmanager
from tests.dashboards.alerting import RUNBOOK, am_config, fast_rules, runbook_anchors
from tests.dashboards.e2e import wait_decode_in_prefill
from tests.promserver import config_text, start_prometheus
from tests.service.live import Served

pytestmark = pytest.mark.slow

GLM = "GLM-5.3-Flash"
RUNBOOK_BASE = RUNBOOK.as_uri()
WINDOW = "45s"
FORS = {"DecodeInPrefill": "5s", "DecodeRowsInPrefill": "10s"}
READY_TIMEOUT = 90.0  # torch import and demo start on a busy 2-core machine
FIRING_TIMEOUT = 60.0  # first scrapes, 5 s pending, group_wait
RESOLVE_TIMEOUT = 75.0  # the 45 s window empties, then a group interval
FLUSH_S = 3.0  # Alertmanager's group_wait + group_interval (1 s each) and a second to spare


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("delivery")
    served: list[Served] = []
    with contextlib.ExitStack() as stop:
        stop.callback(lambda: [s.stop() for s in served])
        hook = stop.enter_context(WebhookReceiver())
        served += [Served("--demo", "--rank", "0", log=workdir / "good.log"),
                   Served("--demo", "--demo-glm-bug", "--rank", "1", log=workdir / "glm-bug.log")]
        good, glm = (s.wait_ready(READY_TIMEOUT) for s in served)
        am = stop.enter_context(start_alertmanager(workdir / "am", config=am_config(hook)))
        rules = fast_rules(workdir / "rules", RUNBOOK_BASE, window=WINDOW, fors=FORS)
        prom_cfg = config_text(targets={"routescope": [_instance(good), _instance(glm)]}, rule_files=rules,
                               alertmanagers=[f"127.0.0.1:{am.port}"])
        prom = stop.enter_context(start_prometheus(workdir / "prom", config=prom_cfg))
        stack = SimpleNamespace(hook=hook, am=am, prom=prom, good=_instance(good), glm=_instance(glm),
                                served=served, workdir=workdir)
        yield stack
        # What arrived, for docs/prometheus-grafana.md's example payload.
        (workdir / "notifications.json").write_text(json.dumps(hook.received(), indent=2))


def _instance(s: Served) -> str:
    return f"127.0.0.1:{s.port}"


def _notifications(received: list, alertname: str, status: str) -> list[tuple[str, dict]]:
    return [(path, p) for path, p in received if p["groupLabels"].get("alertname") == alertname
            and any(a["status"] == status for a in p["alerts"])]


def _firing(stack) -> tuple[str, dict]:
    got = stack.hook.wait_for(lambda r: _notifications(r, "DecodeInPrefill", "firing"), timeout=FIRING_TIMEOUT,
                              what="a firing DecodeInPrefill notification")
    return got[0]


def test_the_glm_notification_arrives_with_its_cost_and_runbook(stack):
    path, payload = _firing(stack)
    assert path == "/routescope/critical" and payload["receiver"] == "routescope-pager", (path, payload)
    assert payload["groupLabels"] == {"alertname": "DecodeInPrefill", "job": "routescope", "model": GLM}
    [alert] = payload["alerts"]
    labels = alert["labels"]
    assert {k: labels[k] for k in ("alertname", "severity", "job", "instance", "model")} == {
        "alertname": "DecodeInPrefill", "severity": "critical", "job": "routescope", "instance": stack.glm,
        "model": GLM}, labels
    assert labels["kernel"].endswith("prefill"), labels

    url = alert["annotations"]["runbook_url"]
    assert url == f"{RUNBOOK_BASE}#decodeinprefill", url
    page = urllib.parse.urlsplit(url)
    assert page.fragment in runbook_anchors(Path(urllib.parse.unquote(page.path)).read_text()), url

    # The cost names the table the instance prices with, as Prometheus has it, and gives a figure.
    tables = stack.prom.query(f'routescope_advice_table_info{{instance="{stack.glm}"}}')["result"]
    assert tables, "the demo prices with the H200 table on this CPU"
    cost = alert["annotations"]["cost"]
    assert cost.startswith("Prediction from latency table") and "not a measurement" in cost, cost
    assert all(t["metric"]["table"] in cost for t in tables), (cost, tables)
    figure = re.search(rf"the decode rows {GLM} sends to prefill kernels cost (-?[\d.]+)(ms|us|s) \(", cost)
    assert figure and float(figure[1]) > 0, cost
    assert "split-K would save" in cost and cost.endswith("per hour."), cost


def test_the_warning_is_inhibited_while_the_critical_fires(stack):
    _firing(stack)

    def warning_firing() -> bool:
        return any(a["labels"].get("alertname") == "DecodeRowsInPrefill" and a["labels"].get("instance") == stack.glm
                   and a["state"] == "firing" for a in stack.prom.alerts())

    stack.prom.wait_for(warning_firing, timeout=FIRING_TIMEOUT, what="DecodeRowsInPrefill firing in Prometheus")
    inhibited = stack.am.wait_for(
        lambda: [a for a in stack.am.alerts() if a["labels"]["alertname"] == "DecodeRowsInPrefill"
                 and a["labels"]["instance"] == stack.glm and a["status"]["inhibitedBy"]],
        timeout=20, what="DecodeRowsInPrefill inhibited in Alertmanager")
    assert inhibited[0]["status"]["state"] == "suppressed", inhibited
    time.sleep(FLUSH_S)  # a group flush after the warning arrived: it would have been sent by now
    assert not _notifications(stack.hook.received(), "DecodeRowsInPrefill", "firing"), stack.hook.received()


def test_the_fix_sends_a_resolved_notification(stack):
    _firing(stack)
    wait_decode_in_prefill(stack.prom, stack.glm, states=("firing",), timeout=FIRING_TIMEOUT)
    fixed_at = time.time()
    glm = next(s for s in stack.served if _instance(s) == stack.glm)
    glm.stop()
    fixed = Served("--demo", "--rank", "1", "--port", str(glm.port), log=stack.workdir / "fixed.log")
    stack.served.append(fixed)
    fixed.wait_ready(READY_TIMEOUT)
    assert _instance(fixed) == stack.glm

    resolved = stack.hook.wait_for(lambda r: _notifications(r, "DecodeInPrefill", "resolved"),
                                   timeout=RESOLVE_TIMEOUT, what="a resolved DecodeInPrefill notification")
    path, payload = resolved[0]
    assert path == "/routescope/critical" and payload["status"] == "resolved", payload
    [alert] = payload["alerts"]
    assert alert["labels"]["instance"] == stack.glm, alert
    assert datetime.fromisoformat(alert["endsAt"]).timestamp() > fixed_at, (fixed_at, alert)

    everything = stack.hook.received()
    instances = {a["labels"].get("instance") for _, p in everything for a in p["alerts"]}
    assert instances == {stack.glm}, "the healthy instance sends no notification"
    assert {p["groupLabels"].get("model") for _, p in everything} == {GLM}, "one group per model: GLM's"
