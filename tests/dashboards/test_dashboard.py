"""The generated dashboard: fresh, complete, and written against the metric contract."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dashboards import build
from dashboards.queries import annotation_queries, panel_queries, substitute, variable_queries

ROOT = Path(__file__).resolve().parents[2]
DASH = ROOT / "dashboards"
# job and instance come from the scrape; cluster and node from a fleet's agent (dashboards/prometheus-agent.yml)
SCRAPE_LABELS = {"job", "instance", "cluster", "node"}
BUILTIN_SERIES = {"up": SCRAPE_LABELS, "ALERTS": {"alertname", "alertstate", "severity"} | SCRAPE_LABELS}


def contract() -> dict[str, set[str]]:
    """Series name -> labels, from the table in docs/metrics.md (histograms expanded)."""
    out: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = re.match(r"\|\s*`(routescope_\w+)`\s*\|\s*([\w ()]+?)\s*\|\s*([^|]*)\|", line)
        if not m:
            continue
        name, kind, labels = m.groups()
        labels_set = {x.strip() for x in labels.split(",") if x.strip() and x.strip() != "—"} | SCRAPE_LABELS
        if kind.startswith("histogram"):
            out[name] = labels_set  # stored as one native histogram series where Prometheus ingests those
            out[name + "_bucket"] = labels_set | {"le"}
            out[name + "_count"] = labels_set
            out[name + "_sum"] = labels_set
        else:
            out[name] = labels_set
    assert len(out) >= 18, "could not parse the series table of docs/metrics.md"
    return out


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)


def _metrics_in(expr: str) -> set[str]:
    expr = _strip_strings(expr)
    names = set(re.findall(r"\b[a-zA-Z_]\w*(?::\w+)+|\broutescope_\w+", expr))
    names |= {n for n in ("up", "ALERTS") if re.search(rf"\b{n}\b(?!\s*\()", expr)}
    return names


def _grouping_labels(expr: str) -> set[str]:
    found = re.findall(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)", _strip_strings(expr))
    return {lbl.strip() for group in found for lbl in group.split(",") if lbl.strip()}


def _set_operands(expr: str) -> list[str]:
    """The operands of `and`/`unless` checked one by one, each carrying the operator's `on (...)` labels."""
    parts = re.split(r"\s(?:unless|and)\s", expr)
    out = []
    for left, right in zip(parts, parts[1:] + [""]):
        on = re.match(r"\s*(?:on|ignoring)\s*\([^)]*\)", right)
        out.append(left + (f" {on.group(0).strip()}" if on else ""))
    return out


def _matcher_labels(expr: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, body in re.findall(r"([a-zA-Z_][\w:]*)\{([^}]*)\}", _strip_strings(expr)):
        out.setdefault(name, set()).update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", body))
    return out


def recorded() -> dict[str, set[str]]:
    """Recording rule name -> labels it keeps (its `by (...)`, or its input's minus le)."""
    known = contract()
    out: dict[str, set[str]] = {}
    for group in yaml.safe_load((DASH / "recording.yml").read_text())["groups"]:
        for rule in group["rules"]:
            by = re.search(r"\bby\s*\(([^)]*)\)", rule["expr"])
            if by:
                out[rule["record"]] = {x.strip() for x in by.group(1).split(",")}
            else:
                inputs = _metrics_in(rule["expr"])
                labels = set.union(*({**known, **out}[n] for n in inputs))
                out[rule["record"]] = labels - {"le"}
    return out


def all_series() -> dict[str, set[str]]:
    return {**contract(), **recorded(), **BUILTIN_SERIES}


def rule_exprs() -> list[tuple[str, str]]:
    out = []
    for f in ("recording.yml", "alerts.yml"):
        for group in yaml.safe_load((DASH / f).read_text())["groups"]:
            out += [(r.get("record") or r["alert"], r["expr"]) for r in group["rules"]]
    return out


def test_checked_in_json_is_fresh():
    on_disk = (DASH / "routescope.json").read_text(encoding="utf-8")
    assert json.loads(on_disk) == build.build_dashboard(), "stale: run python -m dashboards.build"
    assert on_disk == build.render(), "formatting differs: run python -m dashboards.build"


def test_build_cli_check_detects_stale_file(tmp_path):
    stale = tmp_path / "routescope.json"
    stale.write_text(build.render().replace("Launches per second", "Launches per minute"))
    cmd = [sys.executable, "-m", "dashboards.build", "--check", "--output"]
    bad = subprocess.run(cmd + [str(stale)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "stale" in bad.stderr
    missing = subprocess.run(cmd + [str(tmp_path / "none.json")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.strip() == (
        f"{tmp_path / 'none.json'} does not exist: run python -m dashboards.build --output {tmp_path / 'none.json'}")
    good = subprocess.run(cmd + [str(DASH / "routescope.json")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert good.returncode == 0, good.stderr


def test_panels_cover_the_issue():
    exprs = " ".join(q.template for q in panel_queries())
    for needed in (
        "routescope:calls:rate5m",  # launches per second by kernel
        "routescope:rows:rate5m",  # rows share
        "histogram_quantile(0.5,", "histogram_quantile(0.99,",  # p50 / p99
        "routescope_decode_in_prefill_calls_total", "routescope_decode_in_prefill_rows_total",
        "routescope_decisions_total", "routescope_would_route_calls_total",
        "routescope_kernel_errors_total", "routescope_telemetry_errors_total",
        "routescope_telemetry_dropped_total", "time() - max by (node, instance, rank) (routescope_telemetry_last_flush",
    ):
        assert needed in exprs, needed
    d = build.build_dashboard()
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "cluster", "node", "model", "instance", "rank", "kernel"]
    for v in d["templating"]["list"][1:]:
        assert v["query"].startswith("label_values(") and v["includeAll"] and v["allValue"] == ".*"


def test_panel_structure():
    d = build.build_dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert isinstance(p["options"], dict), p["title"]  # Grafana expects an object, not null
        assert p["targets"] and p.get("description"), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


def _panel(title: str) -> dict:
    return next(p for p in build.build_dashboard()["panels"] if p.get("title") == title)


def _alert(name: str) -> dict:
    rules = yaml.safe_load((DASH / "alerts.yml").read_text())["groups"][0]["rules"]
    return next(r for r in rules if r.get("alert") == name)


@pytest.mark.parametrize(
    "title, alerts, threshold",
    [
        ("Decode-in-prefill calls/s by model", ["DecodeInPrefill"], build.DECODE_IN_PREFILL_THRESHOLD),
        ("Decode rows in prefill kernels, rows/s by model", ["DecodeRowsInPrefill"], build.DECODE_IN_PREFILL_THRESHOLD),
        ("Telemetry flush lag", ["RoutescopeTelemetryFlushStalled"], build.FLUSH_LAG_THRESHOLD_SECONDS),
    ],
)
def test_alert_thresholds_are_drawn(title, alerts, threshold):
    defaults = _panel(title)["fieldConfig"]["defaults"]
    assert threshold in [s["value"] for s in defaults["thresholds"]["steps"]]
    assert defaults["custom"]["thresholdsStyle"]["mode"] != "off"
    for name in alerts:
        assert re.search(rf">\s*{threshold}\s*$", _alert(name)["expr"].strip()), name


def test_every_query_uses_contract_series_and_labels():
    series = all_series()
    exprs = [(f"panel {q.panel}", q.template) for q in panel_queries()]
    exprs += [("annotation", a) for a in annotation_queries()]
    exprs += [(f"variable {n}", f"{sel}") for n, sel, _ in variable_queries()]
    exprs += [(f"rule {n}", e) for n, e in rule_exprs()]
    problems = []
    # each side of an `or` is checked on its own (the native and the classic form of a latency query)
    exprs = [(where, part) for where, expr in exprs for part in re.split(r"\)\s+or\s+(?=\w)", expr)]
    # a set operator's sides too: in `a unless on (l) b`, a is grouped by its own labels and l must be on both sides
    exprs = [(where, part) for where, expr in exprs for part in _set_operands(expr)]
    for where, expr in exprs:
        names = _metrics_in(expr)
        unknown = names - series.keys()
        if unknown:
            problems.append(f"{where}: unknown series {sorted(unknown)}")
            continue
        for name, labels in _matcher_labels(expr).items():
            if name in series and not labels <= series[name]:
                problems.append(f"{where}: {name} has no label(s) {sorted(labels - series[name])}")
        common = set.intersection(*(series[n] for n in names)) if names else set()
        if not _grouping_labels(expr) <= common:
            problems.append(f"{where}: grouping by {sorted(_grouping_labels(expr) - common)} not on {sorted(names)}")
    assert not problems, "\n".join(problems)


def test_contract_check_catches_a_wrong_label():
    # The checker above must be able to fail.
    expr = 'sum by (kernel) (rate(routescope_telemetry_errors_total{model="x"}[5m]))'
    assert not _matcher_labels(expr)["routescope_telemetry_errors_total"] <= all_series()["routescope_telemetry_errors_total"]
    assert not _grouping_labels(expr) <= all_series()["routescope_telemetry_errors_total"]
    # a set operator's `on (...)` is checked on both sides, and each side's `by (...)` on its own series
    unless = ('max by (experiment, stop_reason) (routescope_experiment_state) unless on (experiment, kernel) '
              'routescope_experiment_acknowledged_timestamp_seconds')
    left, right = _set_operands(unless)
    assert "kernel" in _grouping_labels(left) and "kernel" in _grouping_labels(right)
    assert "stop_reason" not in _grouping_labels(right)


def test_substitution_matches_grafana():
    t = 'x{instance=~"$instance", model=~"${model}", kernel=~"$kernel"}[$__rate_interval]'
    assert substitute(t) == 'x{instance=~".*", model=~".*", kernel=~".*"}[1m]'
    got = substitute(t, {"instance": "127.0.0.1:9400", "kernel": ["intree.ragged_prefill", "aiter.pa_prefill_sparse"]})
    assert got == (
        r'x{instance=~"127\\.0\\.0\\.1:9400", model=~".*", '
        r'kernel=~"(intree\\.ragged_prefill|aiter\\.pa_prefill_sparse)"}[1m]'
    )
    with pytest.raises(KeyError):
        substitute('x{model=~"$modle"}')
    assert all("$" not in q.expr for q in panel_queries())
    assert sum(q.has_fallback for q in panel_queries()) >= 5
