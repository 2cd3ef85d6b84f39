"""Rules and dashboard queries on a real Prometheus (Debian's 2.42), on loopback.

Two stand-in exporters speaking docs/metrics.md play two ranks, one misrouting decodes
like the seed's GLM backend; test_e2e_demo.py does the same with `routescope serve --demo`.
"""

from __future__ import annotations

import time

import pytest
import yaml

from dashboards.queries import annotation_queries, panel_queries, variable_queries
from tests.dashboards.contract_exporter import ContractExporter
from tests.dashboards.e2e import (
    RULE_FILES,
    decode_in_prefill,
    wait_decode_in_prefill,
    wait_panels_have_data,
)
from tests.promserver import free_port, start_prometheus


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    good = ContractExporter(model="deepseek-v4.1-flash", rank="0")
    bad = ContractExporter(model="glm-5.3-flash", rank="1", glm_bug=True)
    started = []
    try:
        for exp in (good, bad):
            exp.start(free_port())
            started.append(exp)
        targets = {"routescope": [f"127.0.0.1:{good.port}", f"127.0.0.1:{bad.port}"]}
        with start_prometheus(tmp_path_factory.mktemp("prom"), targets=targets, rule_files=RULE_FILES,
                              scrape_interval="1s", evaluation_interval="1s") as prom:
            yield prom, f"127.0.0.1:{good.port}", f"127.0.0.1:{bad.port}"
    finally:
        for exp in started:
            exp.stop()


def test_all_rule_groups_load_and_evaluate(stack):
    prom, _, _ = stack
    expected = {g["name"]: len(g["rules"]) for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"]}

    def evaluated():
        groups = {g["name"]: g for g in prom.rule_groups()}
        return groups if set(groups) == set(expected) and all(
            r.get("health") == "ok" for g in groups.values() for r in g["rules"]) else None

    groups = prom.wait_for(evaluated, timeout=20, what="every rule evaluated with health ok")
    assert {n: len(g["rules"]) for n, g in groups.items()} == expected
    assert all(g["interval"] == 1 for g in groups.values())  # taken from the server config


def test_every_panel_query_is_accepted(stack):
    prom, _, bad = stack
    now = time.time()
    for values in ({}, {"instance": bad, "model": "glm-5.3-flash", "rank": ["0", "1"],
                        "kernel": ["intree.ragged_prefill", "aiter.pa_prefill_sparse"]}):
        for q in panel_queries(values):
            prom.query(q.expr)  # raises PrometheusError unless status is success
            if not q.instant:
                prom.query_range(q.expr, now - 60, now, step="5s")
        for name, sel, label in variable_queries(values):
            prom.label_values(label, sel)
        for expr in annotation_queries(values):
            prom.query(expr)


def test_a_bad_query_is_rejected(stack):
    from tests.promserver import PrometheusError

    with pytest.raises(PrometheusError, match="bad_data"):
        stack[0].query("sum by (kernel) (rate(routescope_calls_total[$__rate_interval]))")


def test_every_panel_returns_data(stack):
    prom, good, bad = stack
    wait_panels_have_data(prom, timeout=30)
    assert set(prom.label_values("instance", "routescope_calls_total")) == {good, bad}
    # A concrete instance narrows the decode panels to the misrouting one. The wait above can end on
    # the good instance's zero-rate series alone (its decode counters exist at 0) before Prometheus
    # holds the two samples of the bad one that rate() needs, so wait for those too.
    for q in panel_queries({"instance": bad}):
        if q.panel.startswith("Decode-in-prefill calls"):
            series = prom.wait_for(lambda q=q: prom.query(q.core)["result"], timeout=20,
                                   what=f"{q.panel} for {bad}")
            assert {s["metric"]["call_class"] for s in series} == {"mixed", "pure_decode"}
            assert all(float(s["value"][1]) > 0 for s in series)


def test_decode_in_prefill_for_the_misrouting_instance_only(stack):
    prom, good, bad = stack
    alert = wait_decode_in_prefill(prom, bad, states=("pending", "firing"), timeout=20)
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["model"] == "glm-5.3-flash"
    assert alert["labels"]["kernel"] == "intree.ragged_prefill"
    assert decode_in_prefill(prom, good) == []
