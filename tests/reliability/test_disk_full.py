"""A full disk never reaches the caller: no signal, no exception; counted, reported (blocking /readyz), recovered.

Always: a writer whose ``os`` fails as a full filesystem does (``ENOSPC`` on any write that needs
new blocks, no free space in ``statvfs``), at file creation and while running. Where this
machine lets root mount one (``needs_mount``): a real 64 KiB tmpfs, filled up, in a child
process, beside a control showing that prometheus_client's mmap writer dies of SIGBUS there.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

import telemetry.multiproc.writer
from dispatcher.types import Kernel

from .conftest import ROOT, call, calls_in, contradicting_natives, errors, latency_in, make_tel, real_dispatcher


class FullDisk:
    """``os`` for telemetry.multiproc.writer, on a full filesystem (a test double: CI may not mount one)."""

    def __getattr__(self, name: str):
        return getattr(os, name)

    @staticmethod
    def pwrite(fd: int, data, offset: int) -> int:
        if offset + len(data) > os.fstat(fd).st_size:  # needs blocks the filesystem no longer has
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.pwrite(fd, data, offset)

    @staticmethod
    def fstatvfs(fd: int):
        return SimpleNamespace(f_bavail=0, f_frsize=4096)


@pytest.fixture
def full(monkeypatch):
    def fill() -> None:
        monkeypatch.setattr(telemetry.multiproc.writer, "os", FullDisk())

    return fill


def blocking(tel) -> list[str]:
    return [p["problem"] for p in tel.health_problems() if p.get("blocking")]


def test_full_disk_at_start(tmp_path, full, monkeypatch):
    full()
    tel = make_tel(str(tmp_path), flush_on_exit=False)
    try:
        d = tel.instrument(real_dispatcher())
        for _ in range(10):
            call(d)
        tel.flush()
        assert blocking(tel) == ["disk full"] * 4  # counter, histogram, native, gauge files
        assert errors(tel)["write"] >= 6
        assert not [f for f in os.listdir(tmp_path) if f.endswith(".db")]  # nothing half-made
        monkeypatch.undo()  # space freed
        call(d)
        tel.flush()
        assert blocking(tel) == []
        assert calls_in(tmp_path) == 11
    finally:
        tel.close()


def test_disk_fills_while_running(tmp_path, full, monkeypatch):
    monkeypatch.setattr(telemetry.multiproc.writer, "MIN_CAPACITY", 0)  # little slack, so new series soon need new blocks
    tel = make_tel(str(tmp_path), models=("glm", "dsv4"), flush_on_exit=False)
    try:
        d = tel.instrument(real_dispatcher())
        call(d)
        tel.flush()
        full()
        for _ in range(50):
            call(d)  # the same series: values rewritten in place, in blocks the file already has
        tel.flush()
        # (a latency may land in a native bucket not yet written, a new entry that needs a block: that file may fail)
        classic = [p for p in tel.health_problems() if p.get("blocking") and not p["path"].endswith(".ndb")]
        assert classic == [] and calls_in(tmp_path) == 51
        made = 51
        for model in ("dsv4", None, "x", "y"):  # new label sets: the file must grow, and cannot
            call(d, model=model)
            made += 1
        tel.flush()
        assert "disk full" in blocking(tel)
        assert calls_in(tmp_path) <= made
        assert contradicting_natives(tmp_path) == []  # a native part a full disk cut short is not served
        monkeypatch.undo()
        tel.flush()
        assert blocking(tel) == [] and calls_in(tmp_path) == made
        classic, native = latency_in(tmp_path)
        assert classic == native and contradicting_natives(tmp_path) == []  # native again, whole
        assert errors(tel)["write"] >= 1
    finally:
        tel.close()


def _mount_tmpfs(path) -> None:
    os.makedirs(path, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}): the patched writer covers it")


def _fill(path) -> None:
    fd = os.open(os.path.join(path, "filler"), os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        while True:
            os.write(fd, b"\xff" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.needs_mount
def test_real_full_tmpfs(tmp_path):
    mnt = tmp_path / "full"
    _mount_tmpfs(mnt)
    try:
        _fill(mnt)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        mm = subprocess.run([sys.executable, "-m", "tests.reliability.fullfs_worker", "mmap", str(mnt)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
        assert mm.returncode == -signal.SIGBUS, (mm.returncode, mm.stderr[-500:])  # the hazard is real here
        os.remove(mnt / "counter_mmap.db")
        p = subprocess.Popen([sys.executable, "-m", "tests.reliability.fullfs_worker", "telemetry", str(mnt)], cwd=ROOT,
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = json.loads(p.stdout.readline())  # type: ignore[union-attr]
        assert first == {"phase": "full", "problems": ["disk full"] * 4}
        os.remove(mnt / "filler")
        out, _ = p.communicate("freed\n", timeout=60)
        assert p.returncode == 0
        assert json.loads(out.splitlines()[-1]) == {"phase": "freed", "problems": []}
        assert calls_in(mnt, kernel=Kernel.INTREE_RAGGED_PREFILL.value) == 25
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
