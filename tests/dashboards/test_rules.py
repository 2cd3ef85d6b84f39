"""Alert and recording rules: promtool checks, unit tests, and what every alert must carry."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dashboards.rules import render_alerts, runbook_urls, write_rules
from tests.dashboards.alerting import runbook_anchors

ROOT = Path(__file__).resolve().parents[2]
DASH = ROOT / "dashboards"
RULE_FILES = ("recording.yml", "alerts.yml")


def _alerts() -> list[dict]:
    return [r for g in yaml.safe_load((DASH / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def _run(cmd: list[str], cwd: Path = DASH) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_check_rules(promtool):
    r = _run([promtool, "check", "rules", *RULE_FILES])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == 2


def test_promtool_unit_tests(promtool):
    r = _run([promtool, "test", "rules", "tests.yml"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_can_fail(promtool, tmp_path):
    # The same tests against an alert that is off by one must fail.
    for f in RULE_FILES:
        text = (DASH / f).read_text()
        if f == "alerts.yml":
            text = text.replace("for: 30s", "for: 10m", 1)
        (tmp_path / f).write_text(text)
    (tmp_path / "tests.yml").write_text((DASH / "tests.yml").read_text())
    r = _run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path)
    assert r.returncode != 0 and "DecodeInPrefill" in r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load((DASH / "tests.yml").read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for alert in _alerts():
        assert cases.get(alert["alert"]) == {True, False}, alert["alert"]


def test_alerts_carry_severity_annotations_and_a_runbook_anchor():
    anchors = runbook_anchors((ROOT / "docs" / "runbook.md").read_text())
    for alert in _alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in {"critical", "warning"}, name
        ann = alert["annotations"]
        assert ann["summary"].strip() and ann["description"].strip(), name
        path, _, anchor = ann["runbook_url"].partition("#")
        assert path == "docs/runbook.md" and anchor in anchors, (name, ann["runbook_url"])


BASE = "https://git.example.com/routescope/blob/main/docs/runbook.md"


def test_rendered_runbook_links_resolve_to_the_base_and_an_anchor_of_the_runbook(promtool, tmp_path):
    anchors = runbook_anchors((ROOT / "docs" / "runbook.md").read_text())
    r = _run([sys.executable, "-m", "dashboards.rules", "--runbook-base", BASE, "--out", str(tmp_path)], cwd=ROOT)
    assert r.returncode == 0 and r.stdout.split() == [str(tmp_path / "alerts.yml"), str(tmp_path / "recording.yml")], r
    rendered = (tmp_path / "alerts.yml").read_text()
    rules = [r for g in yaml.safe_load(rendered)["groups"] for r in g["rules"]]
    assert [r["annotations"]["runbook_url"] for r in rules] == [f"{BASE}#{a['alert'].lower()}" for a in _alerts()]
    assert all(url.partition("#")[2] in anchors for url in (r["annotations"]["runbook_url"] for r in rules))
    assert (tmp_path / "recording.yml").read_text() == (DASH / "recording.yml").read_text()
    # Comments stay, the rules still load, and nothing but the links (and a first line saying so) changed.
    assert "# Event counters" in rendered
    check = _run([promtool, "check", "rules", "alerts.yml", "recording.yml"], cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    shipped = (DASH / "alerts.yml").read_text()
    assert rendered.splitlines()[1:] == [line.replace('"docs/runbook.md#', f'"{BASE}#') for line in shipped.splitlines()]


def test_every_runbook_url_is_rendered():
    shipped = (DASH / "alerts.yml").read_text()
    assert len(runbook_urls(shipped)) == len(_alerts()) == shipped.count("runbook_url:")
    assert {base for base, _ in runbook_urls(render_alerts(shipped, BASE))} == {BASE}
    printed = _run([sys.executable, "-m", "dashboards.rules", "--runbook-base", BASE], cwd=ROOT)
    assert printed.returncode == 0 and printed.stdout == render_alerts(shipped, BASE), printed.stderr


@pytest.mark.parametrize("base", ["", "https://x/runbook.md#top", 'https://x/"run"', "https://x/run book.md"])
def test_a_base_url_that_would_break_the_yaml_or_the_anchor_is_refused(base):
    with pytest.raises(ValueError, match="runbook base"):
        render_alerts((DASH / "alerts.yml").read_text(), base)
    r = _run([sys.executable, "-m", "dashboards.rules", "--runbook-base", base], cwd=ROOT)
    assert r.returncode == 2 and "runbook base" in r.stderr, r.stderr


def test_the_decode_in_prefill_alerts_say_what_the_misroute_costs():
    by_name = {a["alert"]: a for a in _alerts()}
    costs = {by_name[n]["annotations"]["cost"] for n in ("DecodeInPrefill", "DecodeRowsInPrefill")}
    assert len(costs) == 1, "one cost text for both"
    [cost] = costs
    for series in ("routescope_advice_decode_in_prefill_seconds_per_hour", "routescope_advice_saving_seconds_per_hour",
                   "routescope_advice_table_info"):
        assert series in cost, series
    assert "Prediction" in cost and "no latency table covers this platform" in cost
    # The seed's static figures stay in the runbook, as background; no description quotes them.
    assert not any(re.search(r"\b293\b|\b32 us\b", a["annotations"]["description"]) for a in _alerts())


def test_decode_in_prefill_severities():
    by_name = {a["alert"]: a for a in _alerts()}
    crit, warn = by_name["DecodeInPrefill"], by_name["DecodeRowsInPrefill"]
    assert crit["labels"]["severity"] == "critical" and 'call_class="pure_decode"' in crit["expr"]
    assert warn["labels"]["severity"] == "warning" and 'call_class="mixed"' in warn["expr"]
    # No kernel filter: every prefill kernel lacks split-K.
    assert "kernel=" not in crit["expr"] and "kernel=" not in warn["expr"]
    # Fires within about a minute of the first misrouted call at a short evaluation interval.
    assert crit["for"] in {"0s", "15s", "30s"}


def test_no_rule_group_pins_its_interval():
    for f in RULE_FILES:
        for group in yaml.safe_load((DASH / f).read_text())["groups"]:
            assert "interval" not in group, (f, group["name"])


def _doc_configs() -> list[str]:
    text = (ROOT / "docs" / "prometheus-grafana.md").read_text()
    return [b for b in re.findall(r"```ya?ml\n(.*?)```", text, re.S) if "scrape_configs:" in b]


def test_documented_scrape_configs_pass_promtool(promtool, tmp_path):
    configs = _doc_configs()
    assert len(configs) >= 3, "expected configs for one node, several nodes and TP ranks"
    # Configs that name dashboards/*.yml relative to the repository root load the real files;
    # rules/*.yml are those files rendered as the page renders them (python -m dashboards.rules).
    (tmp_path / "dashboards").mkdir()
    for f in RULE_FILES:
        (tmp_path / "dashboards" / f).write_text((DASH / f).read_text())
    write_rules(tmp_path / "rules", BASE)
    for i, text in enumerate(configs):
        cfg = tmp_path / f"prometheus-{i}.yml"
        cfg.write_text(text)
        r = _run([promtool, "check", "config", str(cfg)], cwd=tmp_path)
        assert r.returncode == 0, f"config #{i}:\n{text}\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("snippet", ["rule_files", "evaluation_interval"])
def test_docs_show_how_to_load_rules(snippet):
    assert any(snippet in c for c in _doc_configs())
