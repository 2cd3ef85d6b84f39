"""prometheus_client's multiprocess file format, read and written as plain bytes: no mmap, so no SIGBUS.

A file (``prometheus_client.mmap_dict``) is a 4-byte native int ``used``, 4 zero bytes, then
entries up to ``used``: a 4-byte key length, the UTF-8 JSON key padded to 8-byte alignment, and
two doubles (value, timestamp). Bytes past ``used`` are preallocated space, which every reader
ignores; routescope's archives keep there the names of the files merged into them (a
*manifest*, see ``compact``), so prometheus_client's collector (vLLM's /metrics)
reads an archive as any other file. In a native file (``*.ndb``, which prometheus_client never reads) bytes 4-7
hold the writer's *generation*, a seqlock over all of its process's files: odd while a flush is being written,
even once it is complete (``generation``; see ``writer`` and ``reader``). Pure: bytes in, entries out, or ``CorruptFile`` with why;
``read`` and ``load`` alone touch the disk, and read no byte past what the header says is used
(plus a manifest), so a huge or sparse hostile ``*.db`` costs a few reads, never its size.

A key must also name a sample of its own metric's family, as the file's type (the name's first
``_`` part, which prometheus_client's collector goes by) has it: ``<metric>_total`` or
``_created`` in a counter file, ``<metric>`` in a gauge file, ``_bucket`` (with an ``le`` label,
the only sample that has one), ``_count``, ``_sum`` or ``_created`` in a histogram file,
``_count``, ``_sum`` or ``_created`` in a summary file, and in a native file (routescope's
``*.ndb``, which prometheus_client never reads) ``_native_bucket`` (with an ``index`` label, a
bucket index of telemetry.native's schema), ``_native_zero``, ``_native_count`` or
``_native_sum_ns``. Anything else (sample ``b`` under metric ``a``, a ``_total`` in a histogram
file) would give a collector an invalid exposition.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct

HEADER = 8
_INT = struct.Struct("i")  # native, as prometheus_client packs them
_DD = struct.Struct("dd")
MANIFEST_MAGIC = b"RSMERGED"  # 8 bytes, then a 4-byte length and a JSON list of file names
MAX_KEY = 1 << 16  # a key longer than this is no key routescope wrote
MAX_USED = 1 << 26  # a used length past 64 MiB is no file routescope wrote (a process's is ~130 KB)
MAX_MANIFEST = 1 << 24  # a manifest lists only merged files still on disk: a few KiB
SUFFIXES = {  # sample name = metric name + one of these, per file type (prometheus_client's ValueClass names)
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "native": ("_native_bucket", "_native_zero", "_native_count", "_native_sum_ns"),  # routescope's ``*.ndb`` only
}
NATIVE_INDEX = "index"  # a native bucket's label: its schema-``native.SCHEMA`` index, a decimal int
MAX_NATIVE_INDEX = 1 << 15
_ANY_SUFFIX = tuple(sorted({x for xs in SUFFIXES.values() for x in xs}))
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # what prometheus_client's Metric accepts
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_INDEX = re.compile(r"^-?[0-9]{1,5}$")
_GOOD_NAMES: set[str] = set()  # metric and sample names already matched against _NAME (a few dozen in practice)
_GOOD_LABELS: set[str] = set()
_MAX_KNOWN = 4096


class CorruptFile(ValueError):
    """The bytes are not a multiprocess file (truncated, bad header, bad key); ``reason`` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def padded(n: int) -> int:
    """Key bytes plus padding, as prometheus_client pads them (4-byte length + key to 8-byte alignment)."""
    return n + (8 - (n + 4) % 8)


def entry(key: str, value: float, ts: float = 0.0) -> bytes:
    """One entry's bytes; its value lies at ``len(result) - 16``."""
    raw = key.encode("utf-8")
    return _INT.pack(len(raw)) + raw.ljust(padded(len(raw)), b" ") + _DD.pack(value, ts)


_GEN = struct.Struct("I")  # a native file's generation, bytes 4-7


def header(used: int, generation: int = 0) -> bytes:
    """The 8-byte header; ``generation`` only in a native file (prometheus_client's files keep bytes 4-7 zero)."""
    return _INT.pack(used) + _GEN.pack(generation & 0xFFFFFFFF)


def generation_bytes(generation: int) -> bytes:
    """Bytes 4-7 of a native file's header."""
    return _GEN.pack(generation & 0xFFFFFFFF)


def generation(data: bytes) -> int:
    """A native file's generation (bytes 4-7): odd while its writer is in a flush, even between flushes."""
    return _GEN.unpack_from(data, 4)[0]


def value_bytes(value: float, ts: float = 0.0) -> bytes:
    return _DD.pack(value, ts)


def value_at(data: bytes, offset: int) -> tuple[float, float]:
    return _DD.unpack_from(data, offset)


def used(data: bytes) -> int:
    """The header's used length (of bytes ``parse`` accepted)."""
    return _INT.unpack_from(data, 0)[0]


def key_parts(key: str) -> list:
    """A key is JSON ``[metric, sample, {label: value}, help]`` (``mmap_key``); anything else breaks collectors."""
    try:
        parts = json.loads(key)
    except ValueError:
        raise CorruptFile("a key is not JSON") from None
    if not (isinstance(parts, list) and len(parts) == 4 and isinstance(parts[0], str) and isinstance(parts[1], str)
            and isinstance(parts[2], dict) and isinstance(parts[3], str)
            and all(isinstance(v, str) for v in parts[2].values())):
        raise CorruptFile("a key is not [metric, sample, labels, help]")
    labels = parts[2]
    if not ((parts[0] in _GOOD_NAMES or _good(_NAME, parts[0])) and (parts[1] in _GOOD_NAMES or _good(_NAME, parts[1]))
            and (labels.keys() <= _GOOD_LABELS or all(_good(_LABEL, k) for k in labels))):
        raise CorruptFile("a key has an invalid metric or label name")
    if "le" in parts[2]:
        try:
            float(parts[2]["le"])
        except ValueError:
            raise CorruptFile("a bucket bound is not a number") from None
    return parts


def _good(pattern: re.Pattern, name: str) -> bool:
    """Does ``name`` match ``pattern``? A name that does is remembered: the next key with it costs a set lookup."""
    if pattern.match(name) is None:
        return False
    known = _GOOD_NAMES if pattern is _NAME else _GOOD_LABELS
    if len(known) < _MAX_KNOWN:
        known.add(name)
    return True


def file_type(path: str) -> str:
    """``counter``, ``gauge``, ``histogram``, ``summary``: a file's type, from its name, as prometheus_client does."""
    return os.path.basename(path).split("_", 1)[0]


def in_family(kind: str | None, metric: str, sample: str, labels: dict) -> bool:
    """Is ``sample`` one of ``metric``'s samples in a file of type ``kind``? (None: of any type; unknown: no.)"""
    suffixes = _ANY_SUFFIX if kind is None else SUFFIXES.get(kind, ())
    if not sample.startswith(metric) or sample[len(metric):] not in suffixes:
        return False
    if kind == "native":
        index = labels.get(NATIVE_INDEX)
        if (index is not None) != (sample == metric + "_native_bucket"):
            return False
        return index is None or (_INDEX.match(index) is not None and abs(int(index)) <= MAX_NATIVE_INDEX)
    return kind != "histogram" or ("le" in labels) == (sample == metric + "_bucket")


Entry = tuple  # (key, key parts, value, timestamp, offset of the value)


def parse(data: bytes, cache: dict[str, list] | None = None,
          kind: str | None = None) -> tuple[list[Entry], list[str] | None]:
    """(entries, the manifest or None); raises CorruptFile. ``cache`` keeps decoded keys between files.

    ``kind`` is the file's type (``file_type``): each sample must belong to its metric's family
    as that type has it; None checks only that it belongs to the family under some type."""
    if len(data) < HEADER:
        raise CorruptFile(f"truncated: {len(data)} bytes, shorter than the 8-byte header")
    used = _INT.unpack_from(data, 0)[0]
    if data[4:8] != b"\0\0\0\0" and kind != "native":  # a native file keeps its generation there
        raise CorruptFile("bad header: bytes 4-7 are not zero")
    if used < HEADER or used > len(data):
        raise CorruptFile(f"bad length header: {used} bytes used of {len(data)}")
    out = []
    pos = HEADER
    while pos < used:
        if pos + 4 > used:
            raise CorruptFile(f"entry header cut at byte {pos}")
        n = _INT.unpack_from(data, pos)[0]
        end = pos + 4 + (padded(n) if n >= 0 else 0) + 16
        if n < 0 or n > MAX_KEY or end > used:
            raise CorruptFile(f"entry at byte {pos} runs past the used length {used}")
        try:
            key = bytes(data[pos + 4:pos + 4 + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptFile(f"key at byte {pos} is not UTF-8") from None
        parts = cache.get(key) if cache is not None else None
        if parts is None:
            parts = key_parts(key)
            if cache is not None and len(cache) < 1 << 18:
                cache[key] = parts
        if not in_family(kind, parts[0], parts[1], parts[2]):
            raise CorruptFile(f"key at byte {pos}: sample {parts[1]!r} is not one of metric {parts[0]!r}'s "
                              f"in a {kind or 'multiprocess'} file")
        value, ts = _DD.unpack_from(data, end - 16)
        out.append((key, parts, value, ts, end - 16))
        pos = end
    return out, _manifest(data, used)


def _manifest(data: bytes, used: int) -> list[str] | None:
    tail = data[used:used + len(MANIFEST_MAGIC)]
    if tail != MANIFEST_MAGIC:
        return None
    start = used + len(MANIFEST_MAGIC) + 4
    if start > len(data):
        raise CorruptFile("manifest cut short")
    n = _INT.unpack_from(data, used + len(MANIFEST_MAGIC))[0]
    if n < 0 or start + n > len(data):
        raise CorruptFile("manifest length runs past the file")
    try:
        names = json.loads(bytes(data[start:start + n]).decode("utf-8"))
    except ValueError:
        raise CorruptFile("manifest is not JSON") from None
    if not (isinstance(names, list) and all(isinstance(x, str) for x in names)):
        raise CorruptFile("manifest is not a list of file names")
    return names


def build(values: dict[str, float], manifest: list[str] | None = None) -> bytes:
    """A whole file: entries for ``values`` (timestamps 0), then the manifest past ``used`` when given."""
    body = b"".join(entry(k, v) for k, v in values.items())
    out = header(HEADER + len(body)) + body
    if manifest is not None:
        raw = json.dumps(sorted(manifest)).encode()
        out += MANIFEST_MAGIC + _INT.pack(len(raw)) + raw
    return out


def load(fd: int) -> bytes:
    """The bytes ``parse`` needs: the header, entries up to its used length, the manifest when one follows.

    Never more: a used length past ``MAX_USED`` or a manifest past ``MAX_MANIFEST`` is a
    CorruptFile before anything is read, and the space past them (preallocated, or a sparse
    hole of any size) is not read at all. A file shorter than it says is returned short
    (``parse`` calls it truncated). OSError passes through."""
    head = os.pread(fd, HEADER, 0)
    if len(head) < HEADER:
        return head
    n = _INT.unpack_from(head, 0)[0]
    if n > MAX_USED:
        raise CorruptFile(f"bad length header: {n} bytes used, more than the {MAX_USED} a file may use")
    if n < HEADER:
        return head  # parse says why
    data = head + os.pread(fd, n - HEADER + len(MANIFEST_MAGIC) + 4, HEADER)
    if len(data) < n + len(MANIFEST_MAGIC) + 4 or data[n:n + len(MANIFEST_MAGIC)] != MANIFEST_MAGIC:
        return data
    m = _INT.unpack_from(data, n + len(MANIFEST_MAGIC))[0]
    if not 0 <= m <= MAX_MANIFEST:
        raise CorruptFile(f"manifest length {m} is out of bounds")
    return data + os.pread(fd, m, len(data))


def read(path: str, cache: dict[str, list] | None = None) -> tuple[list[Entry], list[str] | None]:
    """Parse a file from disk (bounded reads: ``load``) as the type its name gives; OSError and CorruptFile pass.

    Opened without blocking and refused unless a regular file: a directory, FIFO or device named
    like a ``*.db`` is a CorruptFile ("not a regular file"), never a read that waits forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CorruptFile("not a regular file")
        return parse(load(fd), cache, file_type(path))
    finally:
        os.close(fd)
