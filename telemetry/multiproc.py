"""Prometheus multiprocess mode (TP ranks, as vLLM runs it): mmap files fed at flush, compacted when processes die.

Each Telemetry writes its own files, named like prometheus_client's so its
MultiProcessCollector (and vLLM's /metrics) reads them: ``counter_routescope-<id>.db``,
``histogram_routescope-<id>.db``, ``gauge_livemax_routescope-<id>.db``. The id is
``<pid>-<random>``, or ``id.<process_id>`` when configured: such a file is reopened and
continued by the next process with that id. Files of dead pids are merged into
``*_routescope-archive.db`` (counters and histograms; live gauges are dropped), under an
exclusive lock on the directory, so a scrape reads one file per live process plus one.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from .prom import LE
from .spec import COUNTERS, GAUGES, HISTOGRAM
from .view import Totals

FILE_RE = re.compile(r"^(counter|histogram|gauge_[a-z]+)_routescope-([A-Za-z0-9.\-]+)\.db$")
ARCHIVE = "archive"
LOCK_NAME = ".routescope.lock"
_PROCESS_ID_RE = re.compile(r"^[A-Za-z0-9.\-]+$")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ident_for(process_id: str | None) -> str:
    """``<pid>-<random>`` (unique per Telemetry, compacted after death) or ``id.<process_id>`` (reused)."""
    if process_id is None:
        return f"{os.getpid()}-{secrets.token_hex(3)}"
    if not _PROCESS_ID_RE.match(process_id):
        raise ValueError(f"process_id may hold letters, digits, '.' and '-' only; got {process_id!r}")
    return f"id.{process_id}"


def ident_pid(ident: str) -> int | None:
    head = ident.split("-", 1)[0]
    return int(head) if head.isdigit() else None


@contextmanager
def dir_lock(path: str, *, exclusive: bool) -> Iterator[None]:
    """flock on the directory's lock file: compaction is exclusive, our scrapes shared."""
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def our_files(path: str) -> list[str]:
    return sorted(f for f in os.listdir(path) if FILE_RE.match(f))


def compact(path: str, *, alive: Callable[[int], bool] = pid_alive, dead_idents: tuple[str, ...] = ()) -> list[str]:
    """Merge dead processes' counter and histogram files into the archive and delete their files; returns their ids."""
    with dir_lock(path, exclusive=True):
        dead: dict[str, list[str]] = {}
        for f in our_files(path):
            ident = FILE_RE.match(f).group(2)  # type: ignore[union-attr]
            if ident == ARCHIVE:
                continue
            pid = ident_pid(ident)
            if ident in dead_idents or (pid is not None and not alive(pid)):
                dead.setdefault(ident, []).append(f)
        if not dead:
            return []
        files = [f for fs in dead.values() for f in fs]
        for kind in ("counter", "histogram"):
            srcs = [f for f in files if f.startswith(kind + "_")]
            if srcs:
                _merge_into_archive(path, kind, srcs)
        for f in files:
            try:
                os.remove(os.path.join(path, f))
            except FileNotFoundError:
                pass
        return sorted(dead)


def _merge_into_archive(path: str, kind: str, srcs: list[str]) -> None:
    archive = os.path.join(path, f"{kind}_routescope-{ARCHIVE}.db")
    merged: dict[str, float] = {}
    for f in ([archive] if os.path.exists(archive) else []) + [os.path.join(path, s) for s in srcs]:
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(f):
            merged[key] = merged.get(key, 0.0) + value
    tmp = archive + ".tmp"  # not *.db: invisible to collectors until the atomic rename
    if os.path.exists(tmp):
        os.remove(tmp)
    md = MmapedDict(tmp)
    try:
        for key, value in merged.items():
            md.write_value(key, value, 0.0)
    finally:
        md.close()
    os.replace(tmp, archive)


class MultiprocWriter:
    """Writes this process's totals into its files at flush; unchanged values are not rewritten."""

    def __init__(self, path: str, ident: str) -> None:
        if not os.path.isdir(path):
            raise ValueError(f"multiprocess directory {path!r} does not exist")
        self.path = path
        self.ident = ident
        self._files: dict[str, MmapedDict] = {}
        self._base: dict[str, float] = {}  # values a previous process with this id left (reuse)
        self._last: dict[str, float] = {}
        self._keys: dict[tuple, str] = {}

    def filename(self, kind: str) -> str:
        return os.path.join(self.path, f"{kind}_routescope-{self.ident}.db")

    def _file(self, kind: str) -> MmapedDict:
        f = self._files.get(kind)
        if f is None:
            f = self._files[kind] = MmapedDict(self.filename(kind))
            if not kind.startswith("gauge"):
                for key, value, _ts in f.read_all_values():
                    self._base[key] = value
        return f

    def _key(self, metric: str, sample: str, labels: tuple[str, ...], values: tuple, help_text: str) -> str:
        ck = (sample, values)
        k = self._keys.get(ck)
        if k is None:
            k = self._keys[ck] = mmap_key(metric, sample, list(labels), list(values), help_text)
        return k

    def _put(self, f: MmapedDict, key: str, value: float, ts: float = 0.0) -> None:
        value = self._base.get(key, 0.0) + value
        if self._last.get(key) != value:
            f.write_value(key, value, ts)
            self._last[key] = value

    def write(self, totals: Totals, rank: str) -> None:
        cf = self._file("counter")
        for spec in COUNTERS:
            for key, v in getattr(totals, spec.field).items():
                lv = key + (rank,)
                self._put(cf, self._key(spec.base, spec.name, spec.labels, lv, spec.help), float(v))
        hf = self._file("histogram")
        h = HISTOGRAM
        for key, (counts, total) in totals.latency.items():
            lv = key + (rank,)
            for le, c in zip(LE, counts):
                self._put(hf, self._key(h.name, h.name + "_bucket", h.labels + ("le",), lv + (le,), h.help), float(c))
            self._put(hf, self._key(h.name, h.name + "_sum", h.labels, lv, h.help), float(total))
        gf = self._file("gauge_livemax")
        for spec in GAUGES:
            for key, v in getattr(totals, spec.field).items():
                lv = key + ((rank,) if "rank" in spec.labels else ())
                self._put(gf, self._key(spec.base, spec.name, spec.labels, lv, spec.help), float(v), totals.ts)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class RoutescopeMultiProcessCollector(MultiProcessCollector):
    """Reads only routescope's files (not vLLM's, which may share the directory), under a shared lock."""

    def collect(self):  # type: ignore[override]
        with dir_lock(self._path, exclusive=False):
            files = [os.path.join(self._path, f) for f in our_files(self._path)]
            return list(self.merge(files, accumulate=True))


def multiprocess_registry(path: str) -> CollectorRegistry:
    """A fresh registry that merges every process's files at each scrape."""
    reg = CollectorRegistry()
    RoutescopeMultiProcessCollector(reg, path=path)
    return reg
