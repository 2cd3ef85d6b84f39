"""The exposition: exactly docs/metrics.md's names and labels, clean under the real promtool, fresh per Telemetry."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from dispatcher import GuardMode, Policy
from dispatcher.types import Kernel
from telemetry import TelemetryConfig
from telemetry.bench.workload import make_calls
from telemetry.exposition import classic_only
from telemetry.spec import ALL

from .conftest import args_for, dispatcher, noop_registry, scrape, total

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def contract() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{name: (type, labels)} from the series table of docs/metrics.md (not the service's own, listed after it)."""
    out = {}
    for line in DOC.read_text().partition("## Series the service exports")[0].splitlines():
        m = re.match(r"^\|\s*`(routescope_[a-z_]+)`\s*\|\s*([a-z]+)[^|]*\|\s*([^|]*)\|", line)
        if m:
            labels = tuple(x.strip() for x in m.group(3).split(",") if x.strip())
            out[m.group(1)] = (m.group(2), labels)
    return out


def busy_registry(make_tel):
    """A telemetry that has seen every kind of event: launches, decodes, guard, errors, decode path."""
    tel = make_tel(TelemetryConfig(models=("glm", "dsv4")), policy=Policy(guard=GuardMode.REROUTE))
    d = tel.instrument(dispatcher(policy=Policy(guard=GuardMode.REROUTE)))
    for args, kw in make_calls(400):
        d(*args, **kw)
    bad = tel.instrument(dispatcher(policy=Policy(guard=GuardMode.REROUTE),
                                    registry=noop_registry({Kernel.INTREE_RAGGED_PREFILL: KeyError("x")})))
    with pytest.raises(KeyError):
        bad(*args_for(8), model="glm")
    tel.record_decode_path(2, "glm")
    return tel


def test_names_types_and_labels_match_the_contract(make_tel):
    doc = contract()
    assert len(doc) == 25
    assert {s.name: (s.kind, s.labels) for s in ALL} == doc
    tel = busy_registry(make_tel)
    text = generate_latest(classic_only(tel.registry)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (kind, labels) in doc.items():
        base = name[: -len("_total")] if kind == "counter" else name
        fam = fams[base]
        assert fam.type == kind, name
        for s in fam.samples:
            got = set(s.labels) - ({"le"} if kind == "histogram" else set())
            assert got == set(labels), (name, s.labels)
    s = scrape(tel.registry)
    assert total(s, "routescope_guard_rerouted_calls_total") > 0
    assert total(s, "routescope_kernel_errors_total") == 1
    assert total(s, "routescope_build_info") == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_metrics_is_clean(make_tel):
    tel = busy_registry(make_tel)
    text = generate_latest(classic_only(tel.registry))
    res = subprocess.run([shutil.which("promtool"), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    assert res.stdout.decode().strip() == "" and res.stderr.decode().strip() == ""


def test_openmetrics_exposition_parses(make_tel):
    tel = busy_registry(make_tel)
    text = generate_openmetrics(tel.registry).decode()
    assert text.rstrip().endswith("# EOF")
    assert "routescope_calls_total{" in text


def test_scrape_flushes_first_and_registries_are_fresh(make_tel):
    a, b = make_tel(), make_tel()
    d = a.instrument(dispatcher())
    for _ in range(5):
        d(*args_for(8), model="glm")
    assert total(scrape(a.registry), "routescope_calls_total") == 5  # no explicit flush
    assert total(scrape(b.registry), "routescope_calls_total") == 0
    assert a.registry is not b.registry
    assert "routescope_calls" not in {m.name for m in REGISTRY.collect()}
    assert a.collect_registry() is a.registry  # single process
