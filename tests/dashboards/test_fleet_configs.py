"""The shipped fleet configs (dashboards/prometheus-agent.yml, prometheus-central.yml) and their render step.

promtool checks the files as shipped and as rendered; the agent and the central receiver run them for real in
tests/dashboards/test_fleet_e2e.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from dashboards.fleet import (
    AGENT,
    AGENT_PLACEHOLDERS,
    CENTRAL,
    CENTRAL_PLACEHOLDERS,
    main,
    render_agent,
    render_central,
)

from .conftest import ROOT

AGENT_ARGS = dict(central_url="https://central.example.com:9090/api/v1/write", cluster="mi325x-east",
                  node="gpu-node-1", targets=["localhost:9475", "localhost:9476"])


def _check(promtool: str, path) -> None:
    res = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_promtool_accepts_the_shipped_configs(promtool):
    for path in (AGENT, CENTRAL):
        _check(promtool, path)


def test_promtool_accepts_the_rendered_configs(promtool, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "recording.yml").write_text((ROOT / "dashboards" / "recording.yml").read_text())
    agent = tmp_path / "agent.yml"
    agent.write_text(render_agent(AGENT.read_text(), **AGENT_ARGS, scrape_interval="30s"))
    central = tmp_path / "central.yml"
    central.write_text(render_central(CENTRAL.read_text(), alertmanager="alertmanager:9093", rules_dir=rules))
    for path in (agent, central):
        _check(promtool, path)
    got = yaml.safe_load(agent.read_text())
    assert got["global"]["external_labels"] == {"cluster": "mi325x-east", "node": "gpu-node-1"}
    assert got["global"]["scrape_interval"] == got["global"]["scrape_timeout"] == "30s"
    assert got["scrape_configs"][0]["static_configs"][0]["targets"] == AGENT_ARGS["targets"]
    [rw] = got["remote_write"]
    assert rw["url"] == AGENT_ARGS["central_url"] and rw["send_native_histograms"] is True
    cen = yaml.safe_load(central.read_text())
    assert cen["rule_files"] == [f"{rules}/*.yml"]
    assert cen["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert "scrape_configs" not in cen  # the fleet's series arrive by remote write
    # comments survive, placeholders do not
    assert "# A node's Prometheus agent" in agent.read_text()
    for text, names in ((agent.read_text(), AGENT_PLACEHOLDERS), (central.read_text(), CENTRAL_PLACEHOLDERS)):
        body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        assert not [p for p in names if p in body.split()], body


@pytest.mark.parametrize(("change", "message"), [
    ({"central_url": "central:9090"}, "remote-write endpoint"),
    ({"central_url": "ftp://central/api/v1/write"}, "remote-write endpoint"),
    ({"cluster": ""}, "cluster"),
    ({"node": 'gpu"1'}, "node"),
    ({"targets": []}, "at least one --target"),
    ({"targets": ["localhost"]}, "host:port"),
    ({"targets": ["localhost:99999"]}, "host:port"),
    ({"targets": ["localhost:9475", "localhost:9475"]}, "repeat"),
])
def test_render_refuses_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        render_agent(AGENT.read_text(), **{**AGENT_ARGS, **change})


def test_render_refuses_bad_central_values():
    with pytest.raises(ValueError, match="alertmanager"):
        render_central(CENTRAL.read_text(), alertmanager="alertmanager", rules_dir="/etc/rules")
    with pytest.raises(ValueError, match="duration"):
        render_central(CENTRAL.read_text(), alertmanager="am:9093", rules_dir="/r", evaluation_interval="fast")


def test_render_needs_the_placeholder_lines():
    with pytest.raises(ValueError, match="no line matching"):
        render_agent("global: {}\n", **AGENT_ARGS)


def test_the_command_writes_and_explains(tmp_path, capsys):
    out = tmp_path / "agent.yml"
    assert main(["agent", "--central-url", AGENT_ARGS["central_url"], "--cluster", "c", "--node", "n",
                 "--target", "localhost:9475", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["global"]["external_labels"] == {"cluster": "c", "node": "n"}
    with pytest.raises(SystemExit) as exc:
        main(["agent", "--central-url", "nope", "--cluster", "c", "--node", "n", "--target", "localhost:9475"])
    assert exc.value.code == 2 and "remote-write endpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["central", "--alertmanager", "am:9093", "--rules-dir", "/r", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "is a folder" in capsys.readouterr().err
    nested = tmp_path / "new" / "central.yml"  # a missing folder is made, as every writing command does
    assert main(["central", "--alertmanager", "am:9093", "--rules-dir", "/r", "--out", str(nested)]) == 0
    assert nested.read_text().startswith("# Rendered by")
    res = subprocess.run([sys.executable, "-m", "dashboards.fleet", "central", "--alertmanager", "am:9093",
                          "--rules-dir", "/etc/prometheus/rules/routescope"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert res.returncode == 0 and '"/etc/prometheus/rules/routescope/*.yml"' in res.stdout, res
