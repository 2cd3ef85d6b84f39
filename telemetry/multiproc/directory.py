"""The multiprocess directory: file names and ids, the lock compaction takes, and quarantine of bad files."""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .health import Problems

# Kind, id, extension. prometheus_client reads every ``*.db``; native buckets, which it cannot read, live in ``*.ndb``.
FILE_RE = re.compile(r"^(counter|histogram|gauge_livemax|native)_routescope-([A-Za-z0-9.\-]+)\.(db|ndb)$")
TMP_RE = re.compile(r"^\..*_routescope-.*\.n?db\.tmp-(\d+)$")  # a file being created by process <pid>
KINDS = ("counter", "histogram", "native", "gauge_livemax")
NATIVE = "native"
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


class LockBusy(TimeoutError):
    """The directory lock is held elsewhere (another process, or another open of it here) past the wait asked for."""


@contextmanager
def dir_lock(path: str, *, exclusive: bool, timeout: float | None = None) -> Iterator[None]:
    """flock on the directory's lock file (compaction is exclusive).

    ``timeout``: None waits as long as it takes; 0 tries once and never waits; otherwise retries
    for that many seconds. LockBusy when it was not acquired."""
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        _flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, timeout, path)
        yield
    finally:
        os.close(fd)


def _flock(fd: int, op: int, timeout: float | None, path: str) -> None:
    if timeout is None:
        fcntl.flock(fd, op)
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                held = f" for more than {timeout} s" if timeout > 0 else ""
                raise LockBusy(f"lock on {path} held by another process{held}") from None
            time.sleep(0.005)


def file_name(kind: str, ident: str) -> str:
    """``<kind>_routescope-<id>.db``, or ``.ndb`` for native buckets (prometheus_client's collector skips those)."""
    return f"{kind}_routescope-{ident}.{'ndb' if kind == NATIVE else 'db'}"


def is_ours(name: str) -> bool:
    """A routescope file: kind and extension agree (a ``native_*.db`` would break prometheus_client's collector)."""
    m = FILE_RE.match(name)
    return m is not None and (m.group(1) == NATIVE) == (m.group(3) == "ndb")


def our_files(path: str) -> list[str]:
    """Routescope's files, archives last: a reader that meets an archive after its sources can drop them."""
    return sorted((f for f in os.listdir(path) if is_ours(f)), key=lambda f: (f"-{ARCHIVE}." in f, f))


def quarantine(path: str, reason: str, problems: Problems, stage: str, problem: str = "corrupt file") -> bool:
    """Rename a bad file aside (not ``*.db``: no collector reads it), count it and list it.

    True when the file is no longer at ``path`` (renamed here, or by another reader first);
    False when it could not be renamed (counted and listed once per version of the file)."""
    moved: str | None = f"{path}.corrupt-{int(time.time() * 1000)}"
    try:
        os.rename(path, moved)  # type: ignore[arg-type]
    except FileNotFoundError:
        return True  # another reader moved it (and counted it) first
    except OSError:
        moved = None
        if not problems.first_unmovable(path):
            return False
    problems.quarantined(stage, path, moved, reason, problem)
    return moved is not None
