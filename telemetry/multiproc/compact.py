"""Compaction: dead processes' counter and histogram files merged into the archive exactly once, whenever a kill lands.

Under an exclusive ``flock`` on the directory, for each kind (counter, histogram, native): read the
archive and the names it records as merged (its manifest, kept past the format's ``used``
length where every prometheus_client reader stops); merge each dead file *not* listed; write
the new archive, with those names added to its manifest, to ``<archive>.tmp`` (not ``*.db``,
so no collector reads it), fsync it and rename it over the archive; only then delete the dead
files. A compactor killed before the rename leaves the old archive and every dead file (the
next one redoes the work; the stale temporary is removed); killed after it, the next one finds
the dead files listed and deletes them without merging them again. Gauge files of dead
processes are deleted (their gauges are live ones). Names are dropped from a manifest once
their files are gone. Corrupt files are quarantined, never merged.

Nothing one file does stops the rest. A dead file that cannot be read is skipped: renamed aside
like a corrupt one when the fault is the file's own (permission, I/O error, a directory or FIFO
in its place), or left for the next round when it may pass (too many open files, memory),
either way counted as ``compact`` and logged once, while the other dead files merge. An archive
that cannot be read and cannot be moved aside defers only its own kind. A deletion that fails is
reported and skipped (the manifest already keeps the file from being merged twice).

The lock is never waited for from a flush: ``lock_timeout=0`` tries it once, and ``compact``
returns None, touching nothing, when another process holds it (that one is compacting).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from . import mpfile
from .directory import (ARCHIVE, FILE_RE, NATIVE, TMP_RE, LockBusy, dir_lock, file_name, ident_pid, our_files,
                        pid_alive, quarantine)
from .health import Problems, os_problem

SUMMED = ("counter", "histogram", NATIVE)  # kinds whose values add across processes (gauges are live ones)
LOCK_TIMEOUT_S = 5.0  # how long ``close()`` waits for the lock; a flush does not wait (0)
_THE_FILES_FAULT = frozenset({errno.EACCES, errno.EPERM, errno.EIO, errno.EISDIR, errno.ELOOP, errno.ENXIO,
                              errno.ENODEV, errno.EINVAL})  # read errors no retry will cure: set the file aside


def archive_name(kind: str) -> str:
    return file_name(kind, ARCHIVE)


def compact(path: str, *, alive: Callable[[int], bool] = pid_alive, dead_idents: tuple[str, ...] = (),
            problems: Problems | None = None, lock_timeout: float = LOCK_TIMEOUT_S) -> list[str] | None:
    """Merge dead processes' files into the archives and delete them; returns their ids.

    None, with nothing touched, when the lock is held elsewhere past ``lock_timeout`` seconds (0:
    tried once, no wait). An OSError on the directory itself (listing it) passes through; one on
    a file or an archive is reported to ``problems`` and the rest goes on."""
    problems = problems if problems is not None else Problems(lambda stage: None)
    try:
        with dir_lock(path, exclusive=True, timeout=lock_timeout):
            return _compact_locked(path, alive, dead_idents, problems)
    except LockBusy:
        return None


def _compact_locked(path: str, alive: Callable[[int], bool], dead_idents: tuple[str, ...],
                    problems: Problems) -> list[str]:
    names = our_files(path)
    problems.clear_missing("compact", path, {os.path.join(path, f) for f in names})
    dead = _dead(names, alive, dead_idents)
    for kind in SUMMED:
        tmp = os.path.join(path, archive_name(kind) + ".tmp")
        if os.path.lexists(tmp):  # a compactor died while writing it
            _remove(tmp, problems)
    for f in os.listdir(path):  # a process died while creating one of its files
        m = TMP_RE.match(f)
        if m and not alive(int(m.group(1))):
            _remove(os.path.join(path, f), problems)
    if not dead:
        return []
    files = [f for fs in dead.values() for f in fs]
    for kind in SUMMED:
        srcs = [f for f in files if f.startswith(kind + "_")]
        if srcs:
            try:
                _merge(path, kind, srcs, problems)
            except OSError as exc:  # writing the archive (disk full): this kind's files stay, still read
                archive = os.path.join(path, archive_name(kind))
                problems.report("compact", archive, os_problem(exc), f"cannot write {archive}: {exc}")
    for f in files:
        if f.startswith("gauge_"):
            _remove(os.path.join(path, f), problems)
    return sorted(dead)


def _dead(names: list[str], alive: Callable[[int], bool], dead_idents: tuple[str, ...]) -> dict[str, list[str]]:
    """Files of dead processes (not the archives), by process id."""
    dead: dict[str, list[str]] = {}
    for f in names:
        ident = FILE_RE.match(f).group(2)  # type: ignore[union-attr]
        if ident == ARCHIVE:
            continue
        pid = ident_pid(ident)
        if ident in dead_idents or (pid is not None and not alive(pid)):
            dead.setdefault(ident, []).append(f)
    return dead


def _merge(path: str, kind: str, srcs: list[str], problems: Problems) -> None:
    archive = os.path.join(path, archive_name(kind))
    prior = _read(archive, problems)
    if prior is None and os.path.lexists(archive):
        return  # unreadable and still in place: merging would write over its history; the next round retries
    values = {key: v for key, _p, v, _ts, _o in prior[0]} if prior else {}
    listed = (prior[1] or []) if prior else []  # its history is lost if it was set aside; the dead merge once
    merged = []
    for name in srcs:
        if name in listed:
            continue
        got = _read(os.path.join(path, name), problems)
        if got is None:
            continue
        for key, _p, v, _ts, _o in got[0]:
            values[key] = values.get(key, 0.0) + v
        merged.append(name)
    if merged:
        keep = [n for n in listed if os.path.exists(os.path.join(path, n))]
        _write_atomic(archive, mpfile.build(values, keep + merged))
    for name in srcs:
        if name in listed or name in merged:
            _remove(os.path.join(path, name), problems)


def the_files_fault(exc: OSError) -> bool:
    """Is a read error the file's own (set it aside), rather than this process's or a passing one (retry)?"""
    return exc.errno in _THE_FILES_FAULT


def _read(full: str, problems: Problems) -> tuple[list, list[str] | None] | None:
    """A file's (entries, manifest), or None when there is nothing to merge from it now.

    None: it is gone; or it is corrupt or unreadable for good, and renamed aside when it can be
    (counted, listed, logged once); or it cannot be read now but may be later (it stays; the
    condition is counted and listed until it reads again or is gone)."""
    try:
        got = mpfile.read(full)
    except FileNotFoundError:
        problems.clear("compact", full)
        return None
    except mpfile.CorruptFile as exc:
        quarantine(full, exc.reason, problems, "compact")
        return None
    except OSError as exc:
        if the_files_fault(exc):
            problems.clear("compact", full)
            quarantine(full, f"unreadable: {os_problem(exc)} ({exc})", problems, "compact", "unreadable file")
        else:
            problems.report("compact", full, os_problem(exc), f"cannot read it now: {exc}")
        return None
    problems.clear("compact", full)
    return got


def _write_atomic(path: str, data: bytes) -> None:
    """Whole file to ``<path>.tmp``, fsync, rename over ``path``; on failure the old file stays and the tmp goes."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _remove(tmp, None)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _remove(path: str, problems: Problems | None) -> None:
    """Delete ``path``; gone already is fine, and any other failure is reported (when ``problems``) and skipped."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if problems is None:
            return
        problems.report("compact", path, os_problem(exc), f"cannot delete it: {exc}")
