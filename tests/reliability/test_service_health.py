"""The service over a damaged multiprocess directory: /metrics and /routing answer, /readyz says what is wrong."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

import telemetry.multiproc.writer
from service.app import create_app
from service.settings import ServiceSettings

from .conftest import call, make_tel, real_dispatcher
from .test_corrupt_files import damage, dead_pid
from .test_compaction_crash import write_process
from .test_disk_full import FullDisk


@pytest.fixture
def served(tmp_path):
    mp = tmp_path / "mp"
    mp.mkdir()
    with TestClient(create_app(ServiceSettings(multiproc_dir=str(mp), flush_interval_s=0.2)),
                    base_url="http://127.0.0.1") as c:
        yield c, mp


def metrics(c) -> dict:
    r = c.get("/metrics")
    assert r.status_code == 200
    out: dict = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            key = (s.name, s.labels.get("stage"))
            out[key] = out.get(key, 0) + s.value
    return out


def metrics_when(c, ok, timeout: float = 5.0) -> dict:
    """/metrics once ``ok`` holds, or at the deadline: a scrape may be one flush behind (docs/multiproc.md)."""
    deadline = time.monotonic() + timeout
    got = metrics(c)
    while not ok(got) and time.monotonic() < deadline:
        time.sleep(0.05)
        got = metrics(c)
    return got


def ready(c) -> tuple[int, dict]:
    r = c.get("/readyz")
    return r.status_code, {ch["name"]: ch for ch in r.json()["checks"]}


def test_corrupt_files_are_listed_and_nothing_fails(served):
    c, mp = served
    worker = make_tel(str(mp), flush_on_exit=False)
    d = worker.instrument(real_dispatcher())
    for _ in range(4):
        call(d)
    worker.flush()
    dead = dead_pid()
    write_process(mp, f"{dead}-aaaaaa", 6)
    damage(mp / f"counter_routescope-{dead}-aaaaaa.db", "bad_utf8_key")
    damage(mp / os.path.basename(worker._writer.filename("counter")), "bad_utf8_key")
    try:
        metrics(c)  # the scrape meets both corrupt files: skipped, renamed aside, counted (in its files from the next)
        counted = lambda g: g[("routescope_telemetry_errors_total", "read")] + g.get(  # noqa: E731
            ("routescope_telemetry_errors_total", "compact"), 0)
        got = metrics_when(c, lambda g: counted(g) >= 2)  # (the dead one may meet the first compaction instead)
        assert counted(got) >= 2
        routing = c.get("/routing").json()
        listed = {os.path.basename(p["path"]): p for p in routing["health"]["problems"]}
        assert {f"counter_routescope-{dead}-aaaaaa.db", os.path.basename(worker._writer.filename("counter"))} <= set(listed)
        assert all("UTF-8" in p["detail"] and p["quarantined_as"] for p in listed.values())
        assert ready(c)[0] == 200
        worker.flush()  # the live one comes back whole at its owner's next flush
        key = ("routescope_calls_total", None)
        assert metrics_when(c, lambda g: g.get(key) == 4).get(key) == 4
    finally:
        worker.close()


def test_deleted_directory_turns_readyz_503_then_recovers(served):
    c, mp = served
    assert ready(c)[0] == 200
    shutil.rmtree(mp)
    deadline = time.monotonic() + 10
    while ready(c)[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    status, checks = ready(c)
    assert status == 503 and "missing" in checks["multiprocess"]["detail"], checks
    assert c.get("/metrics").status_code == 200 and c.get("/routing").status_code == 200
    mp.mkdir()
    deadline = time.monotonic() + 10
    while ready(c)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready(c)[0] == 200
    assert sorted(f for f in os.listdir(mp) if f.endswith(".db"))  # its files are back


def test_full_disk_turns_readyz_503_then_recovers(tmp_path, monkeypatch):
    monkeypatch.setattr(telemetry.multiproc.writer, "os", FullDisk())  # full before the service starts: no file can be made
    app = create_app(ServiceSettings(multiproc_dir=str(tmp_path), flush_interval_s=0.2))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        d = app.state.routescope.telemetry.instrument(real_dispatcher())
        for _ in range(5):
            call(d)
        status, checks = ready(c)
        assert status == 503 and "disk full" in checks["multiprocess"]["detail"], checks
        assert c.get("/metrics").status_code == 200 and c.get("/routing").status_code == 200
        monkeypatch.undo()  # space freed
        deadline = time.monotonic() + 10
        while ready(c)[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        key = ("routescope_calls_total", None)
        assert ready(c)[0] == 200 and metrics_when(c, lambda g: g.get(key) == 5).get(key) == 5
