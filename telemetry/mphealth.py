"""What went wrong with the multiprocess directory: each failure counted, logged once, and kept for /readyz and /routing.

Two kinds of entry. A *condition* (this process cannot write its files: disk full, directory
gone, permission; the directory cannot be listed) is active until the same operation succeeds
again; a *blocking* one makes ``/readyz`` answer 503. A *quarantined file* is history: a
corrupt file renamed aside (``*.db.corrupt-<unix ms>``) so that no collector reads it again.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
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

    def report(self, stage: str, subject: str, problem: str, detail: str, *, blocking: bool = False) -> None:
        """Count one failure of ``stage`` on ``subject`` (a path) and keep it active until ``clear``; logs once."""
        self._count(stage)
        now = time.time()
        with self._lock:
            cur = self._active.get((stage, subject))
            if cur is None:
                cur = self._active[(stage, subject)] = {"stage": stage, "path": subject, "since": now, "count": 0}
            cur.update(problem=problem, detail=detail, blocking=blocking, last=now, active=True)
            cur["count"] += 1
            first = (stage, subject, problem) not in self._logged
            self._logged.add((stage, subject, problem))
        if first:
            log.warning("routescope telemetry: %s %s: %s (%s); counted in routescope_telemetry_errors_total"
                        "{stage=%r}, logged once", stage, subject, problem, detail, stage)

    def clear(self, stage: str, subject: str) -> None:
        """The operation that failed on ``subject`` succeeded again."""
        if not self._active:
            return
        with self._lock:
            cur = self._active.pop((stage, subject), None)
            if cur is not None:
                self._logged = {k for k in self._logged if k[:2] != (stage, subject)}
        if cur is not None:
            log.warning("routescope telemetry: %s %s recovered after %d failures", stage, subject, cur["count"])

    def quarantined(self, stage: str, path: str, moved_to: str | None, reason: str) -> None:
        """A corrupt file was skipped and (when ``moved_to``) renamed aside; counted and logged once."""
        self._count(stage)
        with self._lock:
            self._quarantined.append({"stage": stage, "path": path, "problem": "corrupt file",
                                      "detail": reason, "quarantined_as": moved_to, "ts": time.time()})
        log.warning("routescope telemetry: skipped corrupt file %s (%s); %s", path, reason,
                    f"renamed to {moved_to}" if moved_to else "could not rename it aside")

    def first_unmovable(self, path: str) -> bool:
        """True once per version (size, mtime) of a corrupt file that cannot be renamed aside: count it once."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        sig = (path, st.st_size, st.st_mtime_ns)
        with self._lock:
            if sig in self._unmovable:
                return False
            self._unmovable.add(sig)
            return True

    def conditions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(c) for c in self._active.values()]

    def files(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._quarantined)

    @property
    def blocking(self) -> list[dict[str, Any]]:
        return [c for c in self.conditions() if c.get("blocking")]
