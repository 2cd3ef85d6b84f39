"""The shipped Alertmanager config and alert rules, rendered for tests that cannot wait minutes.

What changes is said here and only here: the webhooks point at the test's receiver (same
paths), Alertmanager's group timers are a second, and the decode-in-prefill rules look back
`window` instead of 5m with shorter `for:`. Routes, grouping, inhibition, expressions and
annotations stay as shipped.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import yaml

from dashboards.rules import ALERTS, RECORDING, render_alerts
from tests.amserver import WebhookReceiver

ROOT = Path(__file__).resolve().parents[2]
AM_CONFIG = ROOT / "dashboards" / "alertmanager.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
SHIPPED_WINDOW = "5m"


def runbook_anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to dashes."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def am_config(hook: WebhookReceiver, *, group_wait: str = "1s", group_interval: str = "1s") -> str:
    """dashboards/alertmanager.yml with its webhooks sent to ``hook`` and short group timers."""
    cfg = yaml.safe_load(AM_CONFIG.read_text())
    cfg["route"].update(group_wait=group_wait, group_interval=group_interval)
    for receiver in cfg["receivers"]:
        for webhook in receiver["webhook_configs"]:
            webhook["url"] = hook.base + urllib.parse.urlsplit(webhook["url"]).path
    return yaml.safe_dump(cfg, sort_keys=False)


def fast_rules(out_dir: Path, runbook_base: str, *, window: str, fors: dict[str, str]) -> list[Path]:
    """recording.yml and alerts.yml rendered with ``runbook_base``; the alerts named in ``fors`` look
    back ``window`` (not 5m) and wait their given ``for:``."""
    alerts = yaml.safe_load(render_alerts(ALERTS.read_text(), runbook_base))
    changed = set()
    for group in alerts["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert")
            if name in fors:
                expr = rule["expr"]
                assert f"[{SHIPPED_WINDOW}]" in expr and f"offset {SHIPPED_WINDOW}" in expr, (name, expr)
                rule["expr"] = expr.replace(f"[{SHIPPED_WINDOW}]", f"[{window}]").replace(
                    f"offset {SHIPPED_WINDOW}", f"offset {window}")
                rule["for"] = fors[name]
                changed.add(name)
    assert changed == set(fors), f"no such alerts: {set(fors) - changed}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "alerts.yml").write_text(yaml.safe_dump(alerts, sort_keys=False, width=1000))
    (out_dir / "recording.yml").write_text(RECORDING.read_text())
    return [out_dir / "recording.yml", out_dir / "alerts.yml"]
