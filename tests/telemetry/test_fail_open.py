"""Fail open: a fault injected in every telemetry path is counted by stage and never reaches the caller."""

from __future__ import annotations

import shutil

import pytest
import torch
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import generate_latest

import telemetry.core
import telemetry.probe
import telemetry.prom
from dispatcher import Policy, what_if
from dispatcher.kernels import default_registry
from dispatcher.kernels.common import KernelArgs, SparseIndex
from dispatcher.kernels.torch_ref import ragged_prefill
from dispatcher.types import Kernel
from telemetry import Telemetry, TelemetryConfig
from telemetry.aggregates import KernelErrors
from telemetry.exposition import classic_only
from telemetry.index import SlotIndex
from telemetry.clocks.timing import LatencySink
from telemetry.multiproc.writer import MultiprocWriter
from telemetry.otel import OtelExporter

from .conftest import args_for, dispatcher, noop_registry, scrape, series


class Injected(RuntimeError):
    pass


def boom(*args, **kwargs):
    raise Injected("injected fault")


def real_call_checked(d) -> None:
    """A real torch call through the instrumented dispatcher; its output must equal the reference."""
    g = torch.Generator().manual_seed(1)
    q, kv = torch.randn(3, 2, 64, generator=g), torch.randn(20, 1, 64, generator=g)
    idx = torch.randint(-1, 20, (3, 8), generator=g, dtype=torch.int32)
    out, ref = torch.zeros(3, 2, 48), torch.zeros(3, 2, 48)
    ragged_prefill(KernelArgs(q, kv, SparseIndex(idx, None), 0.3, None, ref))
    dec = d(q, kv, idx, None, 0.3, 64, 48, 16, None, out, model="glm", query_lens=[1, 2])
    assert dec.kernel is Kernel.INTREE_RAGGED_PREFILL
    torch.testing.assert_close(out, ref)


def errors(tel: Telemetry) -> dict[str, float]:
    return {dict(k)["stage"]: v for k, v in series(scrape(tel.registry), "routescope_telemetry_errors_total").items()}


def real_dispatcher(tel: Telemetry):
    return tel.instrument(dispatcher(platform=what_if("cpu"), registry=default_registry(triton=False)))


def cpu_tel(make_tel, cfg: TelemetryConfig | None = None, **kw) -> Telemetry:
    return make_tel(cfg or TelemetryConfig(models=("glm",)), platform=what_if("cpu"), **kw)


def test_record_path_fault(make_tel, monkeypatch):
    monkeypatch.setattr(SlotIndex, "new_slot", boom)
    tel = cpu_tel(make_tel)
    d = real_dispatcher(tel)
    real_call_checked(d)
    assert errors(tel)["record"] == 1
    assert d.probe_failures == 0  # telemetry caught it itself


def test_timing_fault(make_tel, monkeypatch):
    tel = cpu_tel(make_tel)
    d = real_dispatcher(tel)
    monkeypatch.setattr(LatencySink, "observe", boom)
    real_call_checked(d)
    assert errors(tel)["timing"] == 1
    assert sum(series(scrape(tel.registry), "routescope_calls_total").values()) == 1


def test_error_path_fault_keeps_the_kernel_exception(make_tel, monkeypatch):
    monkeypatch.setattr(KernelErrors, "add", boom)
    tel = cpu_tel(make_tel)
    exc = ZeroDivisionError("kernel")
    d = tel.instrument(dispatcher(platform=what_if("cpu"), registry=noop_registry({Kernel.INTREE_RAGGED_PREFILL: exc})))
    with pytest.raises(ZeroDivisionError) as info:
        d(*args_for(4), model="glm")
    assert info.value is exc
    assert errors(tel)["probe"] == 1


def test_flush_fault_scrape_still_answers(make_tel, monkeypatch):
    tel = cpu_tel(make_tel)
    d = real_dispatcher(tel)
    real_call_checked(d)
    tel.flush()
    monkeypatch.setattr(telemetry.core, "build_totals", boom)
    real_call_checked(d)
    assert errors(tel)["flush"] >= 1
    assert tel.snapshot()["health"]["telemetry_errors"]["flush"] >= 1


def test_prometheus_family_fault(make_tel, monkeypatch):
    tel = cpu_tel(make_tel)
    d = real_dispatcher(tel)
    real_call_checked(d)
    real_family = telemetry.prom.family

    def flaky(spec, totals, rank):
        if spec.name == "routescope_calls_total":
            raise Injected("family")
        return real_family(spec, totals, rank)

    monkeypatch.setattr(telemetry.prom, "family", flaky)
    text = generate_latest(classic_only(tel.registry)).decode()
    assert "routescope_rows_total" in text and "routescope_calls_total{" not in text
    assert errors(tel)["export"] >= 1
    real_call_checked(d)


def test_collector_source_fault(make_tel, monkeypatch):
    tel = cpu_tel(make_tel)
    d = real_dispatcher(tel)
    monkeypatch.setattr(tel._collector, "_source", boom)
    generate_latest(tel.registry)  # answers, empty
    real_call_checked(d)
    monkeypatch.undo()
    assert errors(tel)["export"] >= 1


def test_multiprocess_write_and_compact_faults(make_tel, monkeypatch, tmp_path):
    tel = cpu_tel(make_tel, TelemetryConfig(models=("glm",), multiproc_dir=str(tmp_path), compact_interval_s=0))
    d = real_dispatcher(tel)
    monkeypatch.setattr(MultiprocWriter, "write", boom)
    monkeypatch.setattr(telemetry.core, "compact", boom)
    real_call_checked(d)
    tel.flush()
    generate_latest(tel.collect_registry())
    assert errors(tel)["write"] >= 1 and errors(tel)["compact"] >= 1


def test_multiprocess_directory_gone(make_tel, tmp_path):
    mp = tmp_path / "mp"
    mp.mkdir()
    tel = cpu_tel(make_tel, TelemetryConfig(models=("glm",), multiproc_dir=str(mp)))
    d = real_dispatcher(tel)
    shutil.rmtree(mp)
    real_call_checked(d)
    generate_latest(tel.collect_registry())
    assert errors(tel)["write"] >= 1 and errors(tel)["read"] >= 1
    assert [p["problem"] for p in tel.health_problems() if p.get("blocking")] == ["missing"] * 5  # 4 files, the dir


def test_unusable_multiprocess_directory_at_start(make_tel, tmp_path):
    tel = cpu_tel(make_tel, TelemetryConfig(models=("glm",), multiproc_dir=str(tmp_path / "missing")))
    real_call_checked(real_dispatcher(tel))
    assert errors(tel)["write"] >= 3 and errors(tel)["compact"] == 1  # each file at start and at the flush
    assert tel.collect_registry() is tel.registry  # this process's series, the directory's problem reported


def test_otel_feed_and_callback_faults(make_tel, monkeypatch):
    reader = InMemoryMetricReader()
    tel = cpu_tel(make_tel, TelemetryConfig(models=("glm",), otel=True), otel_readers=[reader])
    d = real_dispatcher(tel)
    monkeypatch.setattr(OtelExporter, "feed", boom)
    real_call_checked(d)
    tel.flush()
    monkeypatch.setattr(tel._otel, "_totals", boom)
    reader.get_metrics_data()  # callbacks fail inside: the SDK gets no exception
    monkeypatch.undo()
    assert errors(tel)["otel"] >= 2


def test_snapshot_fault_returns_every_key(make_tel, monkeypatch):
    tel = cpu_tel(make_tel)
    real_call_checked(real_dispatcher(tel))
    keys = set(tel.snapshot())
    monkeypatch.setattr(telemetry.core, "build_snapshot", boom)
    snap = tel.snapshot()
    assert snap["counts"] == [] and snap["health"]["snapshot_failed"]
    assert set(snap) == keys
    assert snap["health"]["telemetry_errors"]["export"] == 1


def test_flush_thread_survives_faults(make_tel, monkeypatch):
    tel = cpu_tel(make_tel)
    d = real_dispatcher(tel)
    monkeypatch.setattr(telemetry.core, "build_totals", boom)
    tel.start(flush_interval_s=0.01)
    for _ in range(20):
        real_call_checked(d)
    import time

    deadline = time.time() + 10
    while tel.aggregates.health.errors[2] < 3 and time.time() < deadline:  # stage "flush"
        time.sleep(0.01)
    assert tel.running
    tel.close()
    assert not tel.running
    assert tel.aggregates.health.errors[2] >= 3


def test_decode_path_fault(make_tel, monkeypatch):
    tel = cpu_tel(make_tel)
    tel.aggregates.decode_path.calls.clear()  # IndexError inside the hot path
    tel.record_decode_path(3, "glm")
    assert tel.aggregates.health.errors[0] == 1


def test_count_error_is_public_and_checks_the_stage(make_tel):
    """What code wrapping telemetry (the vLLM plugin) counts its own failures with."""
    tel = cpu_tel(make_tel)
    tel.count_error("probe")
    tel.count_error("probe")
    tel.count_error("export")
    errs = errors(tel)
    assert errs == {"probe": 2, "export": 1}  # zero-valued stages are dropped by series()
    with pytest.raises(ValueError, match="unknown telemetry error stage 'prob'; one of record, timing"):
        tel.count_error("prob")
    assert sum(errors(tel).values()) == 3  # the bad stage counted nothing


def test_count_error_survives_a_rebuild(make_tel):
    tel = cpu_tel(make_tel)
    tel.count_error("probe")
    tel.instrument(dispatcher(platform=what_if("cpu"), policy=Policy(gfx942_min_rows=768)))  # nothing recorded: rebuilds
    assert tel.policy.gfx942_min_rows == 768
    tel.count_error("probe")
    assert errors(tel)["probe"] == 2
