"""The reader: every process's files parsed, checked and merged into metric families at scrape, never raising.

A corrupt or truncated file is skipped and renamed aside (``*.db.corrupt-<unix ms>``), counted
and listed, and never stops a scrape. Files of dead processes are merged into
``*_routescope-archive.db`` by ``compact``; archives are read last.

A file is parsed and checked in full (``mpfile.parse``: bounds, keys, family membership) the first
time its bytes are seen, which gives its ``Layout``: where each value lies and which series it is.
A process's keys never move once written (a flush rewrites values in place and appends new series
past ``used``), so at the next scrape one read of the same length, compared with the layout's bytes
(values left out) in one array compare, proves the keys unchanged, and the values are taken from
their offsets at once. Bytes that differ anywhere outside the values (a new series, garbage, another
file renamed into place) mean a full parse again. The reads stay bounded: the same length as the last
accepted read, or ``mpfile.load``'s.

A process's files are read as one snapshot: its native file's generation (``mpfile.generation``, odd while its
writer is in a flush) is read before and after them, and only the same even generation both times accepts the
read. Otherwise they are read again, twice at once and once half a millisecond later (a flush writes its files in
about a tenth of a millisecond, unless its process is descheduled in between); past that the last accepted
snapshot of that process is served again (one of its flushes older; a scrape never waits for another process), or, for a process that died inside a flush, the files
as they are, where the merge's own check (``families``: native parts that contradict the classic ones are
withheld) keeps every series valid.
"""

from __future__ import annotations

import gc
import os
import stat
import threading
import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from . import mpfile
from .directory import ARCHIVE, FILE_RE, NATIVE, ident_pid, our_files, pid_alive, quarantine
from .families import Index, Plan
from .health import Problems, os_problem


class Layout:
    """One version of one file, checked in full once: its words with the values zeroed, and each entry's key."""

    __slots__ = ("ino", "nbytes", "words", "tail", "value_at", "blank_at", "keys", "manifest", "series", "native")

    def __init__(self, ino: tuple[int, int], data: bytes, entries: list, manifest: list[str] | None,
                 native: bool = False) -> None:
        self.ino, self.nbytes, self.manifest, self.native = ino, len(data), manifest, native
        n8 = len(data) // 8
        self.value_at = np.asarray([off // 8 for *_rest, off in entries], dtype=np.intp)
        self.blank_at = np.concatenate((self.value_at, self.value_at + 1))  # value and timestamp words
        words = np.frombuffer(data, np.uint64, count=n8).copy()
        words[self.blank_at] = 0
        if native and n8:
            words[0] &= _USED_ONLY  # a native header's generation moves at every flush, like a value
        self.words, self.tail = words, data[n8 * 8:]
        self.keys = [parts for _k, parts, *_rest in entries]
        self.series: list[tuple] | None = None  # families.series_of(keys), made by the first plan that needs it

    def values_if_same(self, data: bytes) -> np.ndarray | None:
        """The values, when ``data`` is this layout's file with only values and timestamps changed; else None."""
        if len(data) != self.nbytes or data[len(data) - len(self.tail):] != self.tail:
            return None
        now = np.frombuffer(data, np.uint64, count=len(self.words))
        blanked = now.copy()
        blanked[self.blank_at] = 0
        if self.native and len(blanked):
            blanked[0] &= _USED_ONLY
        if not np.array_equal(blanked, self.words):
            return None
        return now.view(np.float64)[self.value_at]

    def values(self, data: bytes) -> np.ndarray:
        return np.frombuffer(data, np.float64, count=len(self.words))[self.value_at]


_USED_ONLY = np.uint64(0xFFFFFFFF)  # a header word without bytes 4-7 (little-endian: the used length)
SNAPSHOT_WAITS_S = (0.0, 0.0, 0.0005)  # before each read of a process's files: then its last accepted read serves


class ReaderCache:
    """What a reader keeps between scrapes: each file's layout, decoded keys, and the merge plan. Thread-safe."""

    def __init__(self) -> None:
        self.turn = threading.Condition()  # one read at a time; scrapes that wait share the next one's result
        self.running = False
        self.started = self.finished = 0  # reads started, and the last finished one's number
        self.result: list[Metric] = []
        self.layouts: dict[str, Layout] = {}
        self.keys: dict[str, list] = {}  # key string -> parts (mpfile.parse's cache): keys repeat across files
        self.plan: Plan | None = None
        self.index = Index()  # every series seen, its slot and labels dict, kept across plans
        self.plan_of: tuple[Layout, ...] = ()
        self.snapshots: dict[str, list[tuple[str, Layout, np.ndarray]]] = {}  # process id -> its last accepted read
        self.classic_only: set[tuple] = set()  # series served classic-only at the last scrape (reported once)
        self.torn = 0  # reads of a process's files that never saw one even generation before and after


def read_file(full: str, prev: Layout | None, key_cache: dict[str, list]) -> tuple[Layout, np.ndarray]:
    """(layout, values) of one file; OSError and mpfile.CorruptFile pass, as ``mpfile.read``'s do.

    Opened without blocking and refused unless a regular file; when it is the inode ``prev`` read,
    the same number of bytes is read once and, if only values changed, ``prev`` is its layout."""
    fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise mpfile.CorruptFile("not a regular file")
        ino = (st.st_dev, st.st_ino)
        if prev is not None and prev.ino == ino:
            values = prev.values_if_same(os.pread(fd, prev.nbytes, 0))
            if values is not None:
                return prev, values
        data = mpfile.load(fd)
    finally:
        os.close(fd)
    kind = mpfile.file_type(full)
    entries, manifest = mpfile.parse(data, key_cache, kind)
    layout = Layout(ino, data, entries, manifest, native=kind == NATIVE)
    return layout, layout.values(data)


def generation_of(full: str) -> int | None:
    """A native file's generation (its header's bytes 4-7), or None when it cannot be read."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        head = os.pread(fd, mpfile.HEADER, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    return mpfile.generation(head) if len(head) == mpfile.HEADER else None


class RoutescopeMultiProcessCollector:
    """Reads only routescope's files (not vLLM's, which may share the directory); never raises.

    No lock on the directory: archives are read last, and a file an archive lists as merged is
    dropped, so a compaction running meanwhile neither hides nor doubles a dead process's values."""

    def __init__(self, registry: CollectorRegistry | None, path: str, problems: Problems | None = None,
                 cache: ReaderCache | None = None) -> None:
        self._path = path
        self._problems = problems if problems is not None else Problems(lambda stage: None)
        self._cache = cache if cache is not None else ReaderCache()
        if registry:
            registry.register(self)

    def read(self) -> list[tuple[str, Layout, np.ndarray]]:
        """(file name, layout, values) of every readable file not yet merged into an archive, in read order.

        A file's ``read`` condition (an I/O error) lasts until it reads again, or is gone."""
        try:
            names = our_files(self._path)
        except OSError as exc:
            self._problems.report("read", self._path, os_problem(exc), f"cannot list {self._path}: {exc}",
                                  blocking=True)
            return []
        self._problems.clear("read", self._path)
        self._problems.clear_missing("read", self._path, {os.path.join(self._path, n) for n in names})
        cache = self._cache
        layouts: dict[str, Layout] = {}
        by_name: dict[str, tuple[str, Layout, np.ndarray]] = {}
        groups: dict[str, list[str]] = {}
        for name in names:
            m = FILE_RE.match(name)
            groups.setdefault(m.group(2) if m else name, []).append(name)
        snapshots: dict[str, list[tuple[str, Layout, np.ndarray]]] = {}
        for ident, group in groups.items():
            got = self._snapshot(ident, group, layouts)
            snapshots[ident] = got
            by_name.update((g[0], g) for g in got)
        cache.layouts, cache.snapshots = layouts, snapshots
        if len(cache.keys) > 1 << 18:
            cache.keys.clear()
        merged: set[str] = set()
        for _name, layout, _values in by_name.values():
            merged.update(layout.manifest or ())
        return [by_name[n] for n in names if n in by_name and n not in merged]

    def _snapshot(self, ident: str, group: list[str], layouts: dict[str, Layout]) -> list[tuple[str, Layout, np.ndarray]]:
        """One process's files as one flush left them: the same even generation of its native file before and after
        (archives and processes without a native file have no bracket: read once)."""
        native = next((n for n in group if n.startswith(NATIVE + "_")), None)
        if native is None or ident == ARCHIVE:
            return self._read_files(group, layouts)
        full = os.path.join(self._path, native)
        before = None
        for wait in SNAPSHOT_WAITS_S:
            if wait:
                time.sleep(wait)
            before = generation_of(full)
            if before is None:
                return self._read_files(group, layouts)  # gone or unreadable: the reads below say why
            if before % 2:
                continue  # its writer is inside a flush
            got = self._read_files(group, layouts)
            if generation_of(full) == before:
                return got
        pid = ident_pid(ident)
        if before is not None and before % 2 and pid is not None and not pid_alive(pid):
            return self._read_files(group, layouts)  # died inside a flush: what it left is all there will be
        self._cache.torn += 1
        kept = self._cache.snapshots.get(ident)
        if kept is not None:
            for name, layout, _values in kept:
                layouts.setdefault(os.path.join(self._path, name), layout)
            return kept  # the last accepted read of this process: one flush older, never torn
        return self._read_files(group, layouts)  # none yet: the merge withholds native parts that do not agree

    def _read_files(self, group: list[str], layouts: dict[str, Layout]) -> list[tuple[str, Layout, np.ndarray]]:
        """(file name, layout, values) of each readable file of ``group``; a bad one is quarantined, an unreadable
        one reported."""
        cache = self._cache
        got: list[tuple[str, Layout, np.ndarray]] = []
        for name in group:
            full = os.path.join(self._path, name)
            try:
                layout, values = read_file(full, layouts.get(full) or cache.layouts.get(full), cache.keys)
            except FileNotFoundError:
                self._problems.clear("read", full)
                continue  # compacted meanwhile: its values are in the archive read after it
            except mpfile.CorruptFile as exc:
                self._problems.clear("read", full)  # it reads, if wrongly: no I/O error any more
                quarantine(full, exc.reason, self._problems, "read")
                continue
            except OSError as exc:
                self._problems.report("read", full, os_problem(exc), str(exc))
                continue
            self._problems.clear("read", full)
            layouts[full] = layout
            got.append((name, layout, values))
        return got

    def collect(self) -> list[Metric]:
        """As prometheus_client's MultiProcessCollector merges them, from values already read and checked.

        Concurrent scrapes share the work: one that arrives while another reads waits for the next read, which
        starts after it arrived (so it never gets values older than itself) and serves every scrape that waited.
        The families are shared between them, so a consumer must not change them."""
        cache = self._cache
        with cache.turn:
            arrived = cache.started
            while cache.running or cache.finished <= arrived:
                if not cache.running:
                    cache.running = True
                    cache.started += 1
                    break
                cache.turn.wait()
            else:
                return cache.result
        result: list[Metric] = []
        try:
            result = self._collect_now()
        finally:
            with cache.turn:
                cache.running = False
                cache.finished, cache.result = cache.started, result
                cache.turn.notify_all()
        return result

    def _collect_now(self) -> list[Metric]:
        """Read and merge (the garbage collector held off meanwhile: a scrape makes tens of thousands of acyclic
        objects, and the collections they would trigger walk every object of the process)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            files = self.read()
            try:
                return self._merge(files)
            except Exception as exc:  # noqa: BLE001 - a scrape answers; the files passed every check parse() made
                self._cache.plan, self._cache.index = None, Index()
                self._problems.report("read", self._path, exc.__class__.__name__, f"merging the files failed: {exc}")
                return []
        finally:
            if collecting:
                gc.enable()

    def _merge(self, files: list[tuple[str, Layout, np.ndarray]]) -> list[Metric]:
        cache = self._cache
        of = tuple(layout for _n, layout, _v in files)
        if cache.plan is None or of != cache.plan_of:
            named = [(name, layout) for name, layout, _v in files]
            plan = Plan(named, cache.index)
            if cache.index.stale(plan.present):  # mostly series no file holds any more: start over
                cache.index = Index()
                plan = Plan(named, cache.index)
            cache.plan, cache.plan_of = plan, of
        values: Any = np.concatenate([v for _n, _l, v in files]) if files else np.zeros(0)
        families = cache.plan.families_from(cache.plan.values(values))
        self._report_classic_only(cache.plan.classic_only)
        return families

    def _report_classic_only(self, withheld: dict[tuple, tuple[dict, str]]) -> None:
        """A series that starts to be served classic-only is counted (stage ``merge``) and listed as a condition
        until its native part agrees with its classic part again."""
        cache = self._cache
        now = set(withheld)
        for key in now - cache.classic_only:
            labels, why = withheld[key]
            self._problems.report("merge", _series_name(key[0], labels), "native part incomplete",
                                  f"{why}; served classic-only until they agree")
        for key in cache.classic_only - now:
            self._problems.clear("merge", _series_name(key[0], dict(key[1])))
        cache.classic_only = now


def _series_name(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def multiprocess_registry(path: str, problems: Problems | None = None,
                          cache: ReaderCache | None = None) -> CollectorRegistry:
    """A fresh registry that merges every process's files at each scrape (``cache``: what the last scrape kept)."""
    reg = CollectorRegistry()
    RoutescopeMultiProcessCollector(reg, path=path, problems=problems, cache=cache)
    return reg
