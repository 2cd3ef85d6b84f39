"""A dead process's file that cannot be read never stops compaction (issue 43).

Whatever sits where a dead process's file should (a directory, a file that answers EACCES or
EIO, one this process cannot open for now), ``compact()`` returns, the other dead files merge,
and the bad one is counted as ``compact`` and logged once: renamed aside when the fault is the
file's own, left for the next round when it may pass (its condition listed until it reads
again). A deletion that fails is reported and skipped; an archive that cannot be read is set
aside (or, unmovable, defers only its own kind).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

import telemetry.multiproc.compact
import telemetry.multiproc.directory
from telemetry.multiproc import mpfile
from telemetry.multiproc.compact import archive_name, compact
from telemetry.multiproc.health import Problems

from .conftest import calls_in, db_files
from .test_compaction_crash import write_process

DEAD = {999_981, 999_982, 999_983}
BAD = "counter_routescope-999983-cccccc.db"  # the third dead process: 11 calls


def alive(pid: int) -> bool:
    return pid not in DEAD


@pytest.fixture
def mp(tmp_path) -> Path:
    """Three dead processes: 5, 7 and 11 calls."""
    for ident, n in (("999981-aaaaaa", 5), ("999982-bbbbbb", 7), ("999983-cccccc", 11)):
        write_process(tmp_path, ident, n)
    return tmp_path


def recorder() -> tuple[Problems, list[str]]:
    stages: list[str] = []
    return Problems(stages.append), stages


def failing_read(monkeypatch, name: str, code: int) -> None:
    """``mpfile.read`` of the file called ``name`` fails with ``code``, as a disk, a permission or the kernel would."""
    real = mpfile.read

    def read(path, cache=None):
        if os.path.basename(path) == name:
            raise OSError(code, os.strerror(code), path)
        return real(path, cache)

    monkeypatch.setattr(mpfile, "read", read)


def set_aside(path: Path, name: str) -> list[str]:
    return [f for f in os.listdir(path) if f.startswith(name + ".corrupt-")]


def only_archives(path: Path) -> bool:
    return all("archive" in f for f in db_files(path))


def test_a_directory_named_like_a_dead_file(mp):
    (mp / BAD).unlink()
    (mp / BAD).mkdir()
    problems, stages = recorder()
    assert compact(str(mp), alive=alive, problems=problems) == ["999981-aaaaaa", "999982-bbbbbb", "999983-cccccc"]
    assert calls_in(mp) == 5 + 7 and only_archives(mp)
    assert len(set_aside(mp, BAD)) == 1
    assert stages == ["compact"]
    assert [(os.path.basename(p["path"]), p["detail"]) for p in problems.files()] == [(BAD, "not a regular file")]


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO])
def test_the_files_own_fault_sets_it_aside(mp, monkeypatch, code):
    problems, stages = recorder()
    with monkeypatch.context() as m:
        failing_read(m, BAD, code)
        compact(str(mp), alive=alive, problems=problems)
    assert calls_in(mp) == 5 + 7 and only_archives(mp)  # its 11 calls are lost, and listed as lost
    assert len(set_aside(mp, BAD)) == 1
    assert stages == ["compact"]
    (listed,) = problems.files()
    assert listed["problem"] == "unreadable file" and os.strerror(code) in listed["detail"]


def test_a_passing_fault_leaves_the_file_for_the_next_round(mp, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, "routescope.telemetry")
    problems, stages = recorder()
    with monkeypatch.context() as m:
        failing_read(m, BAD, errno.EMFILE)  # this process's fault, not the file's: never set it aside
        compact(str(mp), alive=alive, problems=problems)
        compact(str(mp), alive=alive, problems=problems)
    assert BAD in db_files(mp) and not set_aside(mp, BAD)
    assert calls_in(mp) == 5 + 7 + 11  # still read where it is
    assert stages == ["compact", "compact"]  # each round counted
    assert [os.path.basename(c["path"]) for c in problems.conditions()] == [BAD]
    assert len([r for r in caplog.records if BAD in r.getMessage()]) == 1  # logged once
    compact(str(mp), alive=alive, problems=problems)  # it reads again: merged once, the condition ends
    assert calls_in(mp) == 5 + 7 + 11 and only_archives(mp)
    assert problems.conditions() == []


def test_a_file_that_cannot_be_set_aside_is_skipped_and_counted_once(mp, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, "routescope.telemetry")
    problems, stages = recorder()
    real_rename = os.rename

    def rename(src, dst, *a, **kw):
        if os.path.basename(src) == BAD:
            raise PermissionError(errno.EACCES, "read-only", src)
        return real_rename(src, dst, *a, **kw)

    with monkeypatch.context() as m:
        failing_read(m, BAD, errno.EACCES)
        m.setattr(telemetry.multiproc.directory.os, "rename", rename)
        compact(str(mp), alive=alive, problems=problems)
        compact(str(mp), alive=alive, problems=problems)
    assert BAD in db_files(mp)
    assert [f for f in db_files(mp) if "archive" not in f] == [BAD]  # the others merged
    assert stages == ["compact"]
    assert [p["quarantined_as"] for p in problems.files()] == [None]
    assert len([r for r in caplog.records if BAD in r.getMessage()]) == 1


def test_an_undeletable_dead_file_does_not_stop_the_rest(mp):
    gauge = mp / "gauge_livemax_routescope-999982-bbbbbb.db"
    gauge.unlink()
    gauge.mkdir()  # os.remove cannot delete a directory
    problems, stages = recorder()
    compact(str(mp), alive=alive, problems=problems)
    assert [f for f in db_files(mp) if "archive" not in f] == [gauge.name]
    assert stages == ["compact"]
    assert [os.path.basename(c["path"]) for c in problems.conditions()] == [gauge.name]
    assert calls_in(mp) == 5 + 7 + 11  # (a scrape sets the directory aside: not a regular file)
    assert not gauge.exists()
    compact(str(mp), alive=alive, problems=problems)
    assert problems.conditions() == []  # gone: its condition ends


def test_an_unreadable_archive_is_set_aside_and_the_dead_still_merge_once(tmp_path, monkeypatch):
    write_process(tmp_path, "999981-aaaaaa", 5)
    compact(str(tmp_path), alive=alive)  # the archive: 5
    write_process(tmp_path, "999982-bbbbbb", 7)
    archive = archive_name("counter")
    problems, stages = recorder()
    with monkeypatch.context() as m:
        failing_read(m, archive, errno.EIO)
        compact(str(tmp_path), alive=alive, problems=problems)
    assert calls_in(tmp_path) == 7  # the archive's history is lost (and listed); the dead process merged once
    assert mpfile.read(str(tmp_path / archive))[1] == ["counter_routescope-999982-bbbbbb.db"]
    assert len(set_aside(tmp_path, archive)) == 1 and stages == ["compact"]


def test_an_archive_unreadable_for_now_defers_its_own_kind_only(tmp_path, monkeypatch):
    write_process(tmp_path, "999981-aaaaaa", 5)
    compact(str(tmp_path), alive=alive)
    write_process(tmp_path, "999982-bbbbbb", 7)
    problems, _ = recorder()
    with monkeypatch.context() as m:
        failing_read(m, archive_name("counter"), errno.ENOMEM)
        compact(str(tmp_path), alive=alive, problems=problems)
    left = [f for f in db_files(tmp_path) if "archive" not in f]
    assert left == ["counter_routescope-999982-bbbbbb.db"]  # counters wait; histogram and gauge went on
    assert calls_in(tmp_path) == 5 + 7
    compact(str(tmp_path), alive=alive, problems=problems)
    assert calls_in(tmp_path) == 5 + 7 and only_archives(tmp_path) and problems.conditions() == []


def test_which_faults_are_the_files_own():
    from telemetry.multiproc.compact import the_files_fault

    assert the_files_fault(PermissionError(errno.EACCES, "x")) and the_files_fault(OSError(errno.EIO, "x"))
    assert the_files_fault(IsADirectoryError(errno.EISDIR, "x"))
    assert not the_files_fault(OSError(errno.EMFILE, "x")) and not the_files_fault(OSError(errno.ENOMEM, "x"))
    assert not the_files_fault(OSError(errno.ENOSPC, "x"))
    assert telemetry.multiproc.compact.LOCK_TIMEOUT_S > 0  # close() may wait; a flush never does (test_compact_lock.py)
