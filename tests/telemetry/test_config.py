"""TelemetryConfig: environment read only when asked, counterfactual specs, validation."""

from __future__ import annotations

import pytest

from dispatcher import GuardMode, Policy
from telemetry import TelemetryConfig, counterfactual_policy


def test_from_env_reads_prefixed_vars_and_multiproc_dir(tmp_path):
    env = {
        "ROUTESCOPE_TELEMETRY_MODELS": "glm, dsv4",
        "ROUTESCOPE_TELEMETRY_RANK": "3",
        "ROUTESCOPE_TELEMETRY_SAMPLE_EVERY": "64",
        "ROUTESCOPE_TELEMETRY_COUNTERFACTUALS": "gfx942_1024",
        "ROUTESCOPE_TELEMETRY_DEVICE_FRAME_NS": "900",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    cfg = TelemetryConfig.from_env(env)
    assert cfg.models == ("glm", "dsv4") and cfg.rank == "3" and cfg.sample_every == 64
    assert cfg.device_frame_ns == 900 and TelemetryConfig().device_frame_ns == -1
    assert cfg.multiproc_dir == str(tmp_path) and cfg.counterfactuals == ("gfx942_1024",)
    assert not cfg.otlp
    assert TelemetryConfig.from_env(env, rank="5").rank == "5"


def test_otel_endpoint_turns_on_otlp():
    cfg = TelemetryConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert cfg.otlp and cfg.otel


def test_defaults_do_not_read_the_environment(monkeypatch):
    monkeypatch.setenv("ROUTESCOPE_TELEMETRY_RANK", "9")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent")
    cfg = TelemetryConfig()
    assert cfg.rank == "0" and cfg.multiproc_dir is None


@pytest.mark.parametrize("bad", [dict(timing="sometimes"), dict(sample_every=0), dict(models=("other",)),
                                 dict(max_slots=0), dict(device_frame_ns=-2), dict(device_frame_ns=10**6)])
def test_validation(bad):
    with pytest.raises(ValueError):
        TelemetryConfig(**bad)


def test_counterfactual_specs():
    active = Policy(gfx942_min_rows=512, gfx950_min_rows=1024, guard=GuardMode.REROUTE, spec_tokens=2)
    p = counterfactual_policy("gfx942_1024", active)
    assert (p.name, p.gfx942_min_rows, p.gfx950_min_rows, p.guard, p.spec_tokens) == (
        "gfx942_1024", 1024, 1024, GuardMode.REROUTE, 2)
    assert counterfactual_policy("no_row_gate", active).gfx942_min_rows == 0
    assert counterfactual_policy("gfx950_2048", active).gfx950_min_rows == 2048
    c = counterfactual_policy("wide:gfx942=768,gfx950=4096", active)
    assert (c.name, c.gfx942_min_rows, c.gfx950_min_rows) == ("wide", 768, 4096)
    mine = Policy(gfx942_min_rows=5, name="mine")
    assert counterfactual_policy(mine, active) is mine
    with pytest.raises(ValueError):
        counterfactual_policy("sometimes", active)
    with pytest.raises(ValueError):
        counterfactual_policy("x:gfx999=1", active)


def test_counterfactual_arch_from_env_and_validation():
    assert TelemetryConfig().counterfactual_arch is None  # the real platform
    env = {"ROUTESCOPE_TELEMETRY_COUNTERFACTUAL_ARCH": " GFX942 "}
    assert TelemetryConfig.from_env(env).counterfactual_arch == "gfx942"
    assert TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_COUNTERFACTUAL_ARCH": ""}).counterfactual_arch is None
    with pytest.raises(ValueError, match="counterfactual_arch must be one of gfx942, gfx950.*got 'gfx9999'"):
        TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_COUNTERFACTUAL_ARCH": "gfx9999"})
    with pytest.raises(ValueError, match="counterfactual_arch"):
        TelemetryConfig(counterfactual_arch="")


def test_from_env_defaults_yield_to_the_environment_and_overrides():
    defaults = {"counterfactual_arch": "gfx942", "counterfactuals": ("gfx942_512",)}
    cfg = TelemetryConfig.from_env({}, defaults=defaults)
    assert cfg.counterfactual_arch == "gfx942" and cfg.counterfactuals == ("gfx942_512",)
    env = {"ROUTESCOPE_TELEMETRY_COUNTERFACTUAL_ARCH": "gfx950", "ROUTESCOPE_TELEMETRY_COUNTERFACTUALS": "no_row_gate"}
    cfg = TelemetryConfig.from_env(env, defaults=defaults)
    assert cfg.counterfactual_arch == "gfx950" and cfg.counterfactuals == ("no_row_gate",)
    real = TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_COUNTERFACTUAL_ARCH": "none"}, defaults=defaults)
    assert real.counterfactual_arch is None  # "none" asks for the real platform over a caller's default
    assert TelemetryConfig.from_env(env, defaults=defaults, counterfactual_arch="sm90").counterfactual_arch == "sm90"
    mp = TelemetryConfig.from_env({"PROMETHEUS_MULTIPROC_DIR": "/d"}, defaults={"multiproc_dir": "/x"})
    assert mp.multiproc_dir == "/d"  # the environment's fallback beats a caller's default too


def test_absent_gates_are_validated_and_hide_the_active_threshold(make_tel):
    import pytest

    from dispatcher import Policy

    with pytest.raises(ValueError, match="absent_gates"):
        TelemetryConfig(absent_gates=("gfx999_min_rows",))
    tel = make_tel(TelemetryConfig(absent_gates=("gfx942_min_rows",)), policy=Policy(name="vllm"))
    gates = set(tel.flush().thresholds)
    assert ("gfx942_min_rows", "vllm") not in gates and ("gfx950_min_rows", "vllm") in gates
    assert ("gfx942_min_rows", "gfx942_1024") in gates, "a counterfactual what-if keeps its own"
    assert TelemetryConfig.from_env({"ROUTESCOPE_TELEMETRY_ABSENT_GATES": "gfx950_min_rows"}).absent_gates == (
        "gfx950_min_rows",)
