"""Compaction killed at every step: a dead process's calls are merged exactly once, whatever instant the kill lands.

The compactor's every side effect (lock, temporary archive open/write/fsync, rename into place,
quarantine rename, each deletion) is enumerated by running it once through a recording ``os``;
then, for each step k, a fresh copy of the directory is compacted with a crash at step k (an
exception in process, and a real ``os._exit`` in a forked child), read back, compacted again,
and read back again: the totals must equal the calls made, every time.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import telemetry.multiproc.compact
import telemetry.multiproc.directory
from telemetry.multiproc.compact import compact
from telemetry.multiproc.writer import MultiprocWriter

from .conftest import calls_by_prometheus_client, calls_in, call, db_files, latency_in, make_tel, real_dispatcher

DEAD = {999_991, 999_992, 999_993, 999_994}
LIVE = os.getpid()
STEPS = ("open", "write", "fsync", "replace", "remove", "rename")


def alive(pid: int) -> bool:
    return pid not in DEAD


class Crash(BaseException):
    """Not an Exception: nothing in the compactor may catch it, as nothing can catch a kill."""


class FaultyOs:
    """The ``os`` module, except that side effects are counted and step ``at`` crashes (test double for a kill)."""

    def __init__(self, at: int | None, how: str = "raise") -> None:
        self.at, self.how, self.seen = at, how, []

    def __getattr__(self, name: str):
        real = getattr(os, name)
        if name not in STEPS:
            return real

        def step(*args, **kw):
            if name == "open" and not (args[1] & (os.O_CREAT | os.O_WRONLY | os.O_RDWR)):
                return real(*args, **kw)
            self.seen.append(name)
            if self.at is not None and len(self.seen) - 1 == self.at:
                if self.how == "exit":
                    os._exit(137)
                raise Crash(f"step {self.at}: {name}")
            return real(*args, **kw)

        return step


def write_process(path: Path, ident: str, n: int) -> None:
    """``n`` real calls' totals written as process ``ident`` would have left them."""
    tel = make_tel(None, flush_on_exit=False)
    d = tel.instrument(real_dispatcher())
    for _ in range(n):
        call(d)
    w = MultiprocWriter(str(path), ident)
    w.write(tel.flush(), "0")
    w.close()
    tel.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, int]:
    """An archive (5 calls), two dead processes (7 and 11), a live one (3), a corrupt dead file: 26 calls."""
    base = tmp_path_factory.mktemp("pristine")
    write_process(base, "999991-aaaaaa", 5)
    compact(str(base), alive=alive)  # the archive, with its manifest
    write_process(base, "999992-bbbbbb", 7)
    write_process(base, "999993-cccccc", 11)
    write_process(base, f"{LIVE}-dddddd", 3)
    (base / "counter_routescope-999994-eeeeee.db").write_bytes(b"\x00\x01\x02")  # truncated: quarantined, never merged
    return base, 26


def run(path: Path, fault: FaultyOs) -> None:
    saved = telemetry.multiproc.compact.os, telemetry.multiproc.directory.os
    telemetry.multiproc.compact.os = telemetry.multiproc.directory.os = fault  # type: ignore[assignment]
    try:
        compact(str(path), alive=alive)
    finally:
        telemetry.multiproc.compact.os, telemetry.multiproc.directory.os = saved


def steps(pristine, tmp_path) -> list[str]:
    probe = FaultyOs(None)
    run(shutil.copytree(pristine[0], tmp_path / "probe"), probe)
    return probe.seen


def check_recovers(path: Path, total: int) -> None:
    assert calls_in(path) == total  # right after the crash, as routescope's reader sees it
    assert latency_in(path) == (total, total)  # every call is timed here: native buckets merged exactly once too
    compact(str(path), alive=alive)  # the next compactor (a restart, or the next interval)
    assert calls_in(path) == total
    assert latency_in(path) == (total, total)
    assert calls_by_prometheus_client(path) == total  # as vLLM's /metrics reads it
    live = [f for f in db_files(path) if "archive" not in f]
    assert all(str(LIVE) in f for f in live) and len(live) == 4
    assert not [f for f in os.listdir(path) if f.endswith(".tmp")]


def test_every_step_is_enumerated(pristine, tmp_path):
    seen = steps(pristine, tmp_path)
    for name in ("open", "write", "fsync", "replace", "remove", "rename"):
        assert name in seen, seen
    assert seen.count("replace") == 3 and seen.count("remove") >= 8  # three archives; 2 dead x 4 files


def test_crash_at_every_step_raising(pristine, tmp_path):
    base, total = pristine
    n = len(steps(pristine, tmp_path))
    for k in range(n):
        path = shutil.copytree(base, tmp_path / f"k{k}")
        with pytest.raises(Crash):
            run(path, FaultyOs(k))
        check_recovers(path, total)


def test_kill_at_every_step(pristine, tmp_path):
    """A real process exit at each step (forked child, ``os._exit``): no finally block, no cleanup ran."""
    base, total = pristine
    n = len(steps(pristine, tmp_path))
    for k in range(n):
        path = shutil.copytree(base, tmp_path / f"k{k}")
        pid = os.fork()
        if pid == 0:  # the child: compact, dying at step k
            try:
                run(path, FaultyOs(k, how="exit"))
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 137, f"step {k} was not reached"
        check_recovers(path, total)


def test_crash_during_recovery_too(pristine, tmp_path):
    """A crash at step k, then the recovering compactor crashes at step j: still exact once one completes."""
    base, total = pristine
    n = len(steps(pristine, tmp_path))
    for k in range(0, n, 2):
        for j in range(0, n, 3):
            path = shutil.copytree(base, tmp_path / f"k{k}j{j}")
            with pytest.raises(Crash):
                run(path, FaultyOs(k))
            try:
                run(path, FaultyOs(j))
            except Crash:
                pass
            check_recovers(path, total)


def test_half_created_files_of_dead_processes_are_removed(tmp_path):
    """A process killed while creating a file leaves ``.<name>.tmp-<pid>`` (never read): the next compaction removes it."""
    dead_tmp = tmp_path / ".counter_routescope-999991-aaaaaa.db.tmp-999991"
    live_tmp = tmp_path / f".counter_routescope-{LIVE}-aaaaaa.db.tmp-{LIVE}"
    dead_tmp.write_bytes(b"\0" * 8)
    live_tmp.write_bytes(b"\0" * 8)
    compact(str(tmp_path), alive=alive)
    assert not dead_tmp.exists() and live_tmp.exists()
