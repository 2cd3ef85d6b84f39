"""Compaction never holds up a flush or a worker's first call (issue 43).

The directory lock is tried once, never waited for, from a flush: while another process holds
it (that one is compacting), the flush writes its files and skips compaction. The constructor
does not compact at all (a vLLM worker builds its Telemetry inside its first attention call):
the first flush does. What is checked is structural, not a wall-clock time: no blocking
``flock`` and no retry sleep happens, the compaction answers "busy" and touches nothing, and
the flush's files are on disk.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import telemetry.multiproc.directory
from telemetry.multiproc.compact import compact
from telemetry.multiproc.directory import LOCK_NAME

from .conftest import call, calls_in, db_files, errors, make_tel, real_dispatcher
from .test_compaction_crash import write_process

DEAD_IDENT = "999971-aaaaaa"  # a dead process's files: 5 calls


@pytest.fixture
def mp(tmp_path) -> Path:
    write_process(tmp_path, DEAD_IDENT, 5)
    return tmp_path


@pytest.fixture
def held(mp):
    """Another process holds the directory's lock (as a compactor does) until the test ends or calls ``release()``."""
    code = ("import fcntl, os, sys\n"
            f"fd = os.open({str(mp / LOCK_NAME)!r}, os.O_CREAT | os.O_RDWR, 0o644)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def release() -> None:
        if p.returncode is None:
            p.communicate("", timeout=30)

    try:
        assert p.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        yield release
    finally:
        release()


class Recording:
    """A stand-in for a module, as ``telemetry.multiproc.directory`` sees it: ``overrides`` first, then the module."""

    def __init__(self, module, **overrides) -> None:
        self._module, self._overrides = module, overrides

    def __getattr__(self, name: str):
        return self._overrides.get(name) or getattr(self._module, name)


@pytest.fixture
def flocks(monkeypatch) -> list[int]:
    """Every flock operation the directory code asks for; a retry sleep there fails the test."""
    ops: list[int] = []

    def flock(fd, op):
        ops.append(op)
        return fcntl.flock(fd, op)

    def no_sleep(s):
        raise AssertionError(f"waited {s} s for the lock")

    monkeypatch.setattr(telemetry.multiproc.directory, "fcntl", Recording(fcntl, flock=flock))
    monkeypatch.setattr(telemetry.multiproc.directory, "time", Recording(time, sleep=no_sleep))
    return ops


def dead_files(path: Path) -> list[str]:
    return [f for f in db_files(path) if DEAD_IDENT in f]


def test_busy_lock_is_tried_once_and_nothing_is_touched(mp, held, flocks):
    before = sorted(os.listdir(mp))
    assert compact(str(mp), lock_timeout=0) is None  # busy
    assert flocks == [fcntl.LOCK_EX | fcntl.LOCK_NB]
    assert sorted(os.listdir(mp)) == before


def test_flush_writes_and_skips_compaction_while_another_process_compacts(mp, held, flocks):
    tel = make_tel(str(mp), flush_on_exit=False, compact_interval_s=0)  # compaction due at every flush
    try:
        d = tel.instrument(real_dispatcher())
        for _ in range(3):
            call(d)
        tel.flush()
        tel.flush()
        assert all(op & fcntl.LOCK_NB for op in flocks) and len(flocks) == 2  # tried once per flush, never waited
        assert calls_in(mp) == 5 + 3  # this flush's calls are on disk; the dead files still read
        assert len(dead_files(mp)) == 4  # counter, histogram, native, gauge: not compacted, the holder's job
        assert tel._compact_busy == 2
        assert errors(tel).get("compact", 0) == 0 and not tel.health_problems()  # busy is not a failure
    finally:
        held()
        tel.close()


def test_the_next_flush_compacts_once_the_lock_is_free(mp, flocks):
    tel = make_tel(str(mp), flush_on_exit=False, compact_interval_s=0)
    try:
        tel.flush()
        assert dead_files(mp) == [] and calls_in(mp) == 5
        assert tel._compact_busy == 0
    finally:
        tel.close()


def test_the_constructor_does_not_compact(mp, flocks):
    tel = make_tel(str(mp), flush_on_exit=False)
    try:
        assert flocks == [] and len(dead_files(mp)) == 4
        tel.flush()  # the first flush does
        assert flocks == [fcntl.LOCK_EX | fcntl.LOCK_NB] and dead_files(mp) == []
    finally:
        tel.close()


def test_a_lock_held_round_after_round_is_reported(mp, held):
    tel = make_tel(str(mp), flush_on_exit=False, compact_interval_s=0)
    try:
        for _ in range(10):
            tel.flush()
        (cond,) = [c for c in tel.health_problems() if c["stage"] == "compact"]
        assert cond["problem"] == "lock held" and not cond["blocking"]
        assert errors(tel)["compact"] >= 1
    finally:
        held()
        tel.close()


def test_when_compaction_is_due():
    from telemetry.core import compaction_due, lock_stuck

    assert compaction_due(None, 0.0, 60.0)  # none yet: the first flush
    assert not compaction_due(100.0, 159.9, 60.0) and compaction_due(100.0, 160.0, 60.0)
    assert not lock_stuck(9) and lock_stuck(10)
