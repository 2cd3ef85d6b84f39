"""The writer: this process's totals into its own files at flush, with plain file I/O, never fatal.

Each Telemetry writes its own files in prometheus_client's format (``mpfile``), named so its
MultiProcessCollector (and vLLM's /metrics) reads them: ``counter_routescope-<id>.db``,
``histogram_routescope-<id>.db``, ``gauge_livemax_routescope-<id>.db``; the latency's native
buckets (one entry per bucket index, the same format) go to ``native_routescope-<id>.ndb``, which
that collector never globs. The id is
``<pid>-<random>``, or ``id.<process_id>`` when configured: such a file is reopened and
continued by the next process with that id.

Writing uses ordinary file I/O (``pwrite``), never mmap, so a full disk is an ``OSError``
(counted, reported, retried) and never a SIGBUS. A file is created complete under a
temporary name and renamed into place, and grown with real zero bytes (not a sparse
truncate) after a free-space check, so every ``*.db`` a reader sees parses. Each flush
checks that the file on disk is still the one it writes (a deleted directory, a file
quarantined by a reader) and recreates it from memory when not.

A flush is bracketed by the native file's *generation* (header bytes 4-7, ``mpfile.generation``): made odd
before the first byte of the flush is written to any of the process's files, and even after the last, so a
reader that sees the same even generation before and after reading them has one flush's values in every file
(``reader``), never one flush's counts beside another's buckets.
"""

from __future__ import annotations

import os

from prometheus_client.mmap_dict import mmap_key  # the key format only: nothing here maps a file

from ..prom import LE
from ..spec import COUNTERS, GAUGES, HISTOGRAM
from ..view import Totals
from . import mpfile
from .mpfile import NATIVE_INDEX
from .directory import KINDS, NATIVE, file_name, quarantine
from .health import Problems, os_problem

MIN_CAPACITY = 16384  # bytes a new file is given (real zeros): room for new series while the disk is full
FREE_MARGIN = 4096  # a new file or growth leaves at least a page free
_CLEAN = 1 << 62


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(28, "short write")
        view, offset = view[n:], offset + n


def _capacity(needed: int) -> int:
    return max(MIN_CAPACITY, -(-(needed + needed // 2) // 4096) * 4096)


def _check_free(fd: int, nbytes: int) -> None:
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    if free < nbytes + FREE_MARGIN:
        raise OSError(28, f"no space left: {free} bytes free, {nbytes} needed (+{FREE_MARGIN} margin)")


class _File:
    """One of this process's files: its bytes mirrored in memory, so a flush writes only what changed."""

    __slots__ = ("path", "fd", "ino", "buf", "pos", "last", "capacity", "lo", "hi", "native")

    def __init__(self, path: str, fd: int, buf: bytearray, pos: dict[str, int], capacity: int) -> None:
        st = os.fstat(fd)
        self.path, self.fd, self.ino = path, fd, (st.st_dev, st.st_ino)
        self.buf, self.pos, self.capacity = buf, pos, capacity
        self.last: dict[str, tuple[float, float]] = {}
        self.lo, self.hi = _CLEAN, 0  # dirty span not yet on disk
        self.native = os.path.basename(path).startswith(NATIVE + "_")  # its header carries the generation

    def on_disk(self) -> bool:
        """Is ``path`` still this file? (No after a deleted directory, a quarantine, a replacement.)"""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self.ino


class MultiprocWriter:
    """Writes this process's totals into its files at flush; unchanged values are not rewritten. Raises nothing."""

    def __init__(self, path: str, ident: str, problems: Problems | None = None) -> None:
        self.path = path
        self.ident = ident
        self.problems = problems if problems is not None else Problems(lambda stage: None)
        self._files: dict[str, _File] = {}
        self._base: dict[str, float] = {}  # values a previous process with this id left (reuse)
        self._keys: dict[tuple, str] = {}
        self._generation = 0  # even between flushes, odd during one (the native file's header bytes 4-7)
        for kind in KINDS:  # at start, so a directory that cannot be written shows before the first flush
            self._guard(kind, self._ready)

    def filename(self, kind: str) -> str:
        return os.path.join(self.path, file_name(kind, self.ident))

    def _guard(self, kind: str, fn, *args) -> None:
        path = self.filename(kind)
        try:
            fn(kind, *args)
        except OSError as exc:
            detail = str(exc)
            if not os.path.isdir(self.path):
                detail = f"multiprocess directory {self.path} is gone ({exc.strerror or exc})"
            self.problems.report("write", path, os_problem(exc), detail, blocking=True)
        else:
            self.problems.clear("write", path)

    def _ready(self, kind: str) -> _File:
        f = self._files.get(kind)
        if f is not None and f.on_disk():
            return f
        if f is not None:  # gone or replaced: recreate it from memory, every value rewritten
            os.close(f.fd)
            del self._files[kind]
            last = f.last
            f = self._create(kind, bytearray(f.buf), dict(f.pos))
            f.last = last
        else:
            f = self._reopen(kind) or self._create(kind, bytearray(mpfile.header(mpfile.HEADER)), {})
        self._files[kind] = f
        return f

    def _reopen(self, kind: str) -> _File | None:
        """A file this id left (process_id reuse): continue from its values; a corrupt one is quarantined."""
        path = self.filename(kind)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            data = mpfile.load(fd)
            entries, _ = mpfile.parse(data, kind=mpfile.file_type(path))
            size = os.fstat(fd).st_size
        except mpfile.CorruptFile as exc:
            os.close(fd)
            quarantine(path, exc.reason, self.problems, "write")
            return None
        except BaseException:
            os.close(fd)
            raise
        used = mpfile.used(data)
        if kind == NATIVE:  # continue the generation a reader may have seen (made even: that flush is over)
            self._generation = max(self._generation, mpfile.generation(data) + 1) & ~1
        f = _File(path, fd, bytearray(data[:used]), {k: off for k, _p, _v, _t, off in entries}, size)
        for k, _p, v, ts, _o in entries:
            f.last[k] = (v, ts)
            if not kind.startswith("gauge"):
                self._base[k] = v
        return f

    def _create(self, kind: str, buf: bytearray, pos: dict[str, int]) -> _File:
        """Write the whole file under a temporary name (real bytes, capacity included) and rename it into place."""
        path = self.filename(kind)
        tmp = os.path.join(self.path, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        if kind == NATIVE:
            buf[4:8] = mpfile.generation_bytes(self._generation)  # mid-flush (odd) when made again inside one
        capacity = _capacity(len(buf))
        fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o644)
        try:
            _check_free(fd, capacity)
            _pwrite_all(fd, bytes(buf) + bytes(capacity - len(buf)), 0)
            os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        return _File(path, fd, buf, pos, capacity)

    def _key(self, metric: str, sample: str, labels: tuple[str, ...], values: tuple, help_text: str) -> str:
        ck = (sample, values)
        k = self._keys.get(ck)
        if k is None:
            k = self._keys[ck] = mmap_key(metric, sample, list(labels), list(values), help_text)
        return k

    def _values(self, totals: Totals, rank: str) -> dict[str, dict[str, tuple[float, float]]]:
        """Every series of ``totals`` as file key -> (value, timestamp), per file kind."""
        c: dict[str, tuple[float, float]] = {}
        for spec in COUNTERS:
            for key, v in getattr(totals, spec.field).items():
                c[self._key(spec.base, spec.name, spec.labels, key + (rank,), spec.help)] = (float(v), 0.0)
        h: dict[str, tuple[float, float]] = {}
        hs = HISTOGRAM
        for key, (counts, total) in totals.latency.items():
            lv = key + (rank,)
            for le, n in zip(LE, counts):
                h[self._key(hs.name, hs.name + "_bucket", hs.labels + ("le",), lv + (le,), hs.help)] = (float(n), 0.0)
            h[self._key(hs.name, hs.name + "_sum", hs.labels, lv, hs.help)] = (float(total), 0.0)
        n: dict[str, tuple[float, float]] = {}
        for key, counts in totals.latency_native.items():
            lv = key + (rank,)
            for suffix, v in (("_native_count", counts.count), ("_native_zero", counts.zero),
                              ("_native_sum_ns", counts.sum_ns)):
                n[self._key(hs.name, hs.name + suffix, hs.labels, lv, hs.help)] = (float(v), 0.0)
            for index, v in counts.buckets.items():
                n[self._key(hs.name, hs.name + "_native_bucket", hs.labels + (NATIVE_INDEX,), lv + (str(index),),
                            hs.help)] = (float(v), 0.0)
        g: dict[str, tuple[float, float]] = {}
        for spec in GAUGES:
            for key, v in getattr(totals, spec.field).items():
                lv = key + ((rank,) if "rank" in spec.labels else ())
                g[self._key(spec.base, spec.name, spec.labels, lv, spec.help)] = (float(v), totals.ts)
        return {"counter": c, "histogram": h, NATIVE: n, "gauge_livemax": g}

    def write(self, totals: Totals, rank: str) -> None:
        """Write what changed, inside the generation bracket; a failure is counted and reported per file, and
        retried at the next flush."""
        values = self._values(totals, rank)
        self._bracket()  # odd: a flush is being written
        try:
            for kind, kind_values in values.items():
                self._guard(kind, self._write_kind, kind_values)
        finally:
            self._bracket()  # even: this flush is complete in every file

    def _bracket(self) -> None:
        """The next generation into the native file's header (4 bytes in place: never needs space)."""
        self._generation = (self._generation + 1) & 0xFFFFFFFF
        f = self._files.get(NATIVE)
        if f is None:
            return  # no native file (it could not be made): a reader finds no bracket and checks the values
        raw = mpfile.generation_bytes(self._generation)
        f.buf[4:8] = raw
        try:
            _pwrite_all(f.fd, raw, 4)
        except OSError:
            pass  # the file is gone or unwritable: its own write below reports it

    def _write_kind(self, kind: str, values: dict[str, tuple[float, float]]) -> None:
        f = self._ready(kind)
        add = not kind.startswith("gauge")
        new: list[tuple[str, bytes]] = []
        for key, (v, ts) in values.items():
            if add:
                v += self._base.get(key, 0.0)
            if f.last.get(key) == (v, ts):
                continue
            off = f.pos.get(key)
            if off is None:
                new.append((key, mpfile.entry(key, v, ts)))
                continue
            f.buf[off:off + 16] = mpfile.value_bytes(v, ts)
            f.last[key] = (v, ts)
            f.lo, f.hi = min(f.lo, off), max(f.hi, off + 16)
        if f.hi > f.lo:  # values in place: their blocks exist, so this cannot need space
            _pwrite_all(f.fd, memoryview(f.buf)[f.lo:f.hi], f.lo)
            f.lo, f.hi = _CLEAN, 0
        if new:
            self._append(f, new)

    def _append(self, f: _File, new: list[tuple[str, bytes]]) -> None:
        """New series: entries past ``used`` first, the header last, so a reader never sees half of one."""
        used = len(f.buf)
        blob = b"".join(b for _k, b in new)
        if used + len(blob) > f.capacity:
            cap = _capacity(used + len(blob))
            _check_free(f.fd, cap - f.capacity)
            try:
                _pwrite_all(f.fd, bytes(cap - f.capacity), f.capacity)
            finally:
                f.capacity = max(f.capacity, os.fstat(f.fd).st_size)
        _pwrite_all(f.fd, blob, used)
        head = mpfile.header(used + len(blob), self._generation if f.native else 0)
        _pwrite_all(f.fd, head, 0)
        f.buf[0:mpfile.HEADER] = head
        off = used
        for key, b in new:
            off += len(b)
            f.pos[key] = off - 16
            f.last[key] = mpfile.value_at(b, len(b) - 16)  # (value, ts) as written
        f.buf += blob

    def close(self) -> None:
        for f in self._files.values():
            try:
                os.close(f.fd)
            except OSError:
                pass
        self._files.clear()
