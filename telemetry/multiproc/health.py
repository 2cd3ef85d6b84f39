"""What went wrong with the multiprocess directory: each failure counted, logged once, and kept for /readyz and /routing.

Two kinds of entry. A *condition* (this process cannot write its files: disk full, directory
gone, permission; the directory cannot be listed; a file cannot be read) is active until the
same operation succeeds again, or its file is gone; a *blocking* one makes ``/readyz`` answer
503. A *quarantined file* is history: a corrupt or unreadable file renamed aside
(``*.db.corrupt-<unix ms>``) so that no collector reads it again.

A signal handler's flush reports here too, and may have interrupted a thread inside one of these
methods, holding the lock: within ``bounded`` the writers' methods wait at most that long for
it, and skip their bookkeeping past it (the failure itself is still counted; the skip is
counted as stage ``flush``) instead of waiting forever.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("routescope.telemetry")

QUARANTINE_KEPT = 32  # the most recent quarantined files listed


def os_problem(exc: BaseException) -> str:
    """A short name for an OSError a directory can raise: what an operator greps for."""
    code = getattr(exc, "errno", None)
    return {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.ENOENT: "missing",
            errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EROFS: "read-only filesystem",
            errno.ENOTDIR: "not a directory", errno.EIO: "I/O error"}.get(code, exc.__class__.__name__)


class Problems:
    """Thread-safe: the flush thread, scrapes and exit hooks all report here."""

    def __init__(self, count: Callable[[str], None]) -> None:
        self._count = count
        self._lock = threading.Lock()
        self._active: dict[tuple[str, str], dict[str, Any]] = {}
        self._quarantined: deque[dict[str, Any]] = deque(maxlen=QUARANTINE_KEPT)
        self._logged: set[tuple[str, str, str]] = set()
        self._unmovable: set[tuple[str, int, int]] = set()
        self._wait = -1.0  # how long the writers' methods wait for the lock; -1: as long as it takes

    @contextmanager
    def bounded(self, wait_s: float) -> Iterator[None]:
        """For a signal handler's flush: within it, ``report``, ``clear``, ``clear_missing``, ``quarantined`` and
        ``first_unmovable`` wait at most ``wait_s`` for the lock, and skip their bookkeeping past it (counted as
        ``flush``)."""
        self._wait = wait_s
        try:
            yield
        finally:
            self._wait = -1.0

    def _take(self) -> bool:
        """The lock, within the current wait; False (the skip counted) when it stays held."""
        if self._lock.acquire(timeout=self._wait):
            return True
        self._count("flush")
        return False

    def report(self, stage: str, subject: str, problem: str, detail: str, *, blocking: bool = False) -> None:
        """Count one failure of ``stage`` on ``subject`` (a path) and keep it active until ``clear``; logs once."""
        self._count(stage)
        now = time.time()
        if not self._take():
            return
        try:
            cur = self._active.get((stage, subject))
            if cur is None:
                cur = self._active[(stage, subject)] = {"stage": stage, "path": subject, "since": now, "count": 0}
            cur.update(problem=problem, detail=detail, blocking=blocking, last=now, active=True)
            cur["count"] += 1
            first = (stage, subject, problem) not in self._logged
            self._logged.add((stage, subject, problem))
        finally:
            self._lock.release()
        if first:
            log.warning("routescope telemetry: %s %s: %s (%s); counted in routescope_telemetry_errors_total"
                        "{stage=%r}, logged once", stage, subject, problem, detail, stage)

    def clear(self, stage: str, subject: str) -> None:
        """The operation that failed on ``subject`` succeeded again."""
        if not self._active:
            return
        self._drop(lambda key: key == (stage, subject))

    def clear_missing(self, stage: str, directory: str, present: set[str]) -> None:
        """End ``stage``'s conditions on files of ``directory`` no longer there (``present``: the paths that are)."""
        if not self._active:
            return
        self._drop(lambda key: key[0] == stage and key[1] not in present and os.path.dirname(key[1]) == directory)

    def _drop(self, match: Callable[[tuple[str, str]], bool]) -> None:
        """End the active conditions whose (stage, subject) ``match``; each logs its recovery."""
        if not self._take():
            return
        try:
            gone = [(key, self._active.pop(key)) for key in [k for k in self._active if match(k)]]
            if gone:
                self._logged = {k for k in self._logged if not match(k[:2])}
        finally:
            self._lock.release()
        for (stage, subject), cur in gone:
            log.warning("routescope telemetry: %s %s recovered after %d failures", stage, subject, cur["count"])

    def quarantined(self, stage: str, path: str, moved_to: str | None, reason: str,
                    problem: str = "corrupt file") -> None:
        """A corrupt (or unreadable) file was skipped and (when ``moved_to``) renamed aside; counted and logged once."""
        self._count(stage)
        if self._take():
            try:
                self._quarantined.append({"stage": stage, "path": path, "problem": problem,
                                          "detail": reason, "quarantined_as": moved_to, "ts": time.time()})
            finally:
                self._lock.release()
        log.warning("routescope telemetry: skipped %s %s (%s); %s", problem, path, reason,
                    f"renamed to {moved_to}" if moved_to else "could not rename it aside")

    def first_unmovable(self, path: str) -> bool:
        """True once per version (size, mtime) of a bad file that cannot be renamed aside: count it once."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        sig = (path, st.st_size, st.st_mtime_ns)
        if not self._take():
            return False
        try:
            if sig in self._unmovable:
                return False
            self._unmovable.add(sig)
            return True
        finally:
            self._lock.release()

    def conditions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(c) for c in self._active.values()]

    def files(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._quarantined)

    @property
    def blocking(self) -> list[dict[str, Any]]:
        return [c for c in self.conditions() if c.get("blocking")]
