"""The routescope_experiment_* families from contract documents: names, labels, values, and promtool's lint."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.experiment_metrics import ExperimentCollector, families
from tests.service.experiment_fixture import SEED_RATIOS, experiments

PROMTOOL = shutil.which("promtool")


def exposition(source) -> str:
    registry = CollectorRegistry()
    registry.register(ExperimentCollector(source))
    return generate_latest(registry).decode()


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_every_series_of_the_contract_with_its_values():
    text = exposition(experiments)
    states = {s.labels["experiment"]: s.labels for s in samples(text, "routescope_experiment_state")}
    assert states["gate512"] == {"experiment": "gate512", "candidate": "gfx942_512", "state": "running", "stop_reason": ""}
    assert states["aa"]["state"] == "stopped" and states["aa"]["stop_reason"] == "harm"
    assert {s.labels["experiment"]: s.value for s in samples(text, "routescope_experiment_fraction")} == {
        "gate512": 0.05, "aa": 0.01}
    mid = {(s.labels["rows_bucket"], s.labels["shape"]): s.value for s in samples(text, "routescope_experiment_time_ratio")
           if s.labels["experiment"] == "gate512" and s.labels["estimate"] == "mid"}
    assert mid == {(rows, f"512+0 h16 topk{k} bfloat16/bfloat16"): r for rows, by_k in SEED_RATIOS.items()
                   for k, r in by_k.items()}
    low = {s.labels["shape"]: s.value for s in samples(text, "routescope_experiment_time_ratio")
           if s.labels["rows_bucket"] == "512-1023" and s.labels["estimate"] == "low"}
    assert low["512+0 h16 topk128 bfloat16/bfloat16"] == pytest.approx(0.59)
    # an untimed cell has counts and no ratio sample
    aa = [s for s in samples(text, "routescope_experiment_time_ratio") if s.labels["experiment"] == "aa"]
    assert {s.labels["rows_bucket"] for s in aa} == {"16384+"}
    calls = samples(text, "routescope_experiment_calls_total")
    assert {(s.labels["arm"], s.labels["kernel"]) for s in calls if s.labels["experiment"] == "gate512"} == {
        ("a", "intree.ragged_prefill"), ("b", "aiter.pa_prefill_sparse")}
    assert sum(s.value for s in calls if s.labels["arm"] == "b" and s.labels["experiment"] == "gate512") == 9 * 40
    assert sum(s.value for s in samples(text, "routescope_experiment_timed_calls_total")
               if s.labels["experiment"] == "gate512") == 9 * 80
    saving = {s.labels["estimate"]: s.value for s in samples(text, "routescope_experiment_saving_seconds")}
    assert saving == {"mid": 0.42, "low": 0.30, "high": 0.55}  # the aa one is null: no sample
    assert {(s.labels["reason"], s.value) for s in samples(text, "routescope_experiment_never_moved_calls_total")} == {
        ("capture", 12.0), ("candidate_unavailable", 3.0)}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")
@pytest.mark.parametrize("docs", [experiments, list], ids=["two experiments", "none"])
def test_the_exposition_passes_promtool(docs):
    out = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition(docs).encode(), capture_output=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()


def test_a_failing_or_malformed_source_costs_its_series_never_the_scrape():
    def broken():
        raise RuntimeError("core down")

    assert samples(exposition(broken), "routescope_experiment_state") == []
    assert samples(exposition(lambda: [{"candidate": "aa"}]), "routescope_experiment_state") == []  # no id
    docs = experiments()
    docs[0]["cells"].append(dict(docs[0]["cells"][0]))  # a repeated cell: exported once
    text = exposition(lambda: docs)
    assert len([s for s in samples(text, "routescope_experiment_calls_total") if s.labels["experiment"] == "gate512"]) == 18


def test_the_families_exist_with_no_experiment():
    assert {f.name for f in families([])} == {
        "routescope_experiment_state", "routescope_experiment_fraction", "routescope_experiment_calls",
        "routescope_experiment_timed_calls", "routescope_experiment_time_ratio", "routescope_experiment_saving_seconds",
        "routescope_experiment_never_moved_calls", "routescope_experiment_acknowledged_timestamp_seconds"}
