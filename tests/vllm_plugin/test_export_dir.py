"""A multiprocess directory a worker cannot create costs its files, never its telemetry (issue 43).

Read-only, permission denied, a file in the way: the worker counts on in-process (its per-rank
/metrics, its snapshot), counts the failure in ``routescope_telemetry_errors_total{stage="write"}``
and keeps retrying its files at each flush, so they appear once the directory does.
vLLM here is TEST DOUBLES; the telemetry is real.
"""

from __future__ import annotations

import errno
import os

import pytest

from dispatcher import Policy, what_if
from routescope.vllm import export, plugin

from ..telemetry.conftest import dispatcher
from .conftest import Meta, prefill_args, samples, telemetry

ENV = "ROUTESCOPE_TELEMETRY_MULTIPROC_DIR"


def refusing(code: int):
    def makedirs(path, *a, **kw):
        raise OSError(code, os.strerror(code), path)

    return makedirs


def where(tmp_path, case: str, monkeypatch) -> str:
    """A directory path the worker cannot create, for each way that happens."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    if case == "file in the way":
        return str(blocker)
    if case == "under a file":
        return str(blocker / "mp")
    monkeypatch.setattr(export.os, "makedirs", refusing({"read-only": errno.EROFS, "permission": errno.EACCES}[case]))
    return str(tmp_path / "mp")


@pytest.mark.parametrize("case", ["file in the way", "under a file", "read-only", "permission"])
def test_counting_goes_on_and_the_failure_is_counted(tmp_path, monkeypatch, case):
    path = where(tmp_path, case, monkeypatch)
    tel = export.make_telemetry(platform=what_if("gfx942"), policy=Policy(), model=None, rank="0", env={ENV: path})
    try:
        assert tel.running
        d = tel.instrument(dispatcher(what_if("gfx942")))
        args, _ = prefill_args(8)
        d(*args)
        tel.flush()
        assert samples(tel, "routescope_calls_total") == 1
        assert samples(tel, "routescope_telemetry_errors_total", stage="write") >= 1
    finally:
        tel.close()


def test_the_files_appear_once_the_directory_does(tmp_path, monkeypatch):
    path = tmp_path / "mp"
    monkeypatch.setattr(export.os, "makedirs", refusing(errno.EACCES))
    tel = export.make_telemetry(platform=what_if("gfx942"), policy=Policy(), model=None, rank="0",
                                env={ENV: str(path)})
    try:
        path.mkdir()  # made later (another rank, an operator)
        tel.flush()
        assert sorted(f.split("_routescope")[0] for f in os.listdir(path) if f.endswith(".db")) == [
            "counter", "gauge_livemax", "histogram"]
    finally:
        tel.close()


def test_a_worker_keeps_its_telemetry(vllm_doubles, tmp_path):
    """Through the plugin, as a worker's first attention call builds it: the call is observed."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    d = vllm_doubles()
    assert plugin.install(env={"ROUTESCOPE_VLLM": "1", ENV: str(blocker)}, platform=what_if("gfx942")) in (
        "observing", "waiting")
    args, _ = prefill_args(16)
    with d.fc().set_forward_context({"l0": Meta(0, 0, 1, 16, 16)}):
        d.backend().forward_prefill(*args)
    tel = telemetry()
    tel.flush()
    assert samples(tel, "routescope_calls_total") == 1
    assert samples(tel, "routescope_telemetry_errors_total", stage="write") >= 1
