"""Compaction: dead processes' counter and histogram files merged into the archive exactly once, whenever a kill lands.

Under an exclusive ``flock`` on the directory, for each kind (counter, histogram): read the
archive and the names it records as merged (its manifest, kept past the format's ``used``
length where every prometheus_client reader stops); merge each dead file *not* listed; write
the new archive, with those names added to its manifest, to ``<archive>.tmp`` (not ``*.db``,
so no collector reads it), fsync it and rename it over the archive; only then delete the dead
files. A compactor killed before the rename leaves the old archive and every dead file (the
next one redoes the work; the stale temporary is removed); killed after it, the next one finds
the dead files listed and deletes them without merging them again. Gauge files of dead
processes are deleted (their gauges are live ones). Names are dropped from a manifest once
their files are gone. Corrupt files are quarantined, never merged.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from . import mpfile
from .mphealth import Problems
from .multiproc import ARCHIVE, FILE_RE, TMP_RE, dir_lock, ident_pid, our_files, pid_alive, quarantine

LOCK_TIMEOUT_S = 5.0


def archive_name(kind: str) -> str:
    return f"{kind}_routescope-{ARCHIVE}.db"


def compact(path: str, *, alive: Callable[[int], bool] = pid_alive, dead_idents: tuple[str, ...] = (),
            problems: Problems | None = None, lock_timeout: float = LOCK_TIMEOUT_S) -> list[str]:
    """Merge dead processes' files into the archives and delete them; returns their ids. OSError passes through."""
    problems = problems if problems is not None else Problems(lambda stage: None)
    with dir_lock(path, exclusive=True, timeout=lock_timeout):
        dead: dict[str, list[str]] = {}
        for f in our_files(path):
            ident = FILE_RE.match(f).group(2)  # type: ignore[union-attr]
            if ident == ARCHIVE:
                continue
            pid = ident_pid(ident)
            if ident in dead_idents or (pid is not None and not alive(pid)):
                dead.setdefault(ident, []).append(f)
        for kind in ("counter", "histogram"):
            tmp = os.path.join(path, archive_name(kind) + ".tmp")
            if os.path.exists(tmp):  # a compactor died while writing it
                os.remove(tmp)
        for f in os.listdir(path):  # a process died while creating one of its files
            m = TMP_RE.match(f)
            if m and not alive(int(m.group(1))):
                _remove(os.path.join(path, f))
        if not dead:
            return []
        files = [f for fs in dead.values() for f in fs]
        for kind in ("counter", "histogram"):
            srcs = [f for f in files if f.startswith(kind + "_")]
            if srcs:
                _merge(path, kind, srcs, problems)
        for f in files:
            if f.startswith("gauge_"):
                _remove(os.path.join(path, f))
        return sorted(dead)


def _merge(path: str, kind: str, srcs: list[str], problems: Problems) -> None:
    archive = os.path.join(path, archive_name(kind))
    values: dict[str, float] = {}
    listed: list[str] = []
    try:
        entries, manifest = mpfile.read(archive)
        values = {key: v for key, _p, v, _ts, _o in entries}
        listed = manifest or []
    except FileNotFoundError:
        pass
    except mpfile.CorruptFile as exc:  # its history is lost; the dead files are still merged, once
        quarantine(archive, exc.reason, problems, "compact")
    merged = []
    for name in srcs:
        if name in listed:
            continue
        try:
            entries, _ = mpfile.read(os.path.join(path, name))
        except FileNotFoundError:
            continue
        except mpfile.CorruptFile as exc:
            quarantine(os.path.join(path, name), exc.reason, problems, "compact")
            continue
        for key, _p, v, _ts, _o in entries:
            values[key] = values.get(key, 0.0) + v
        merged.append(name)
    if merged:
        keep = [n for n in listed if os.path.exists(os.path.join(path, n))]
        _write_atomic(archive, mpfile.build(values, keep + merged))
    for name in srcs:
        if name in listed or name in merged:
            _remove(os.path.join(path, name))


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
        _remove(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
