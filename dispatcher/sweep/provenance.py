"""When and from which commit a sweep ran: what a latency table built from its JSON must show beside its figures.

``routescope advise --table sweep.json`` prints each table's device, date and commit next to every
prediction it makes; a sweep JSON that does not record them can only say "not recorded in the file".
The two readers here are the only side effects (the clock and ``git``); neither ever fails a sweep:
where there is no git checkout (an installed package) the commit is None.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path

# The checkout this package sits in (dispatcher/sweep/provenance.py -> the repository root), if it is one.
CHECKOUT = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S = 5.0


def run_date(now: datetime | None = None) -> str:
    """The day the sweep ran, in UTC, as the shipped latency tables write it (``2026-12-01``)."""
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%d")


def _git(where: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit(where: Path = CHECKOUT) -> str | None:
    """The checkout's commit (short hash), ``-dirty`` when tracked files differ from it; None outside a checkout.

    ``-dirty`` is git's own word (``git describe --dirty``): the kernels timed may not be the commit's.
    """
    head = _git(where, "rev-parse", "--short=7", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    commit = head.stdout.strip()
    diff = _git(where, "diff", "--quiet", "HEAD", "--")
    return commit + "-dirty" if diff is not None and diff.returncode == 1 else commit
