"""When and from which commit a sweep ran: what a latency table built from its JSON must show beside its figures.

``routescope advise --table sweep.json`` prints each table's device, date and commit next to every
prediction it makes; a sweep JSON that does not record them can only say "not recorded in the file".
The two readers here are the only side effects (the clock and ``git``); neither ever fails a sweep:
where the tree is not a git checkout of its own (an installed package, a copy with no ``.git``, even one
inside another repository's work tree) the commit is None, unless it is given (``--commit`` or
``ROUTESCOPE_COMMIT``: a copy made from a known commit, as on a GPU machine with no ``.git``).
"""

from __future__ import annotations

import os
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

# The checkout this package sits in (dispatcher/sweep/provenance.py -> the repository root), if it is one.
CHECKOUT = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S = 5.0
COMMIT_ENV = "ROUTESCOPE_COMMIT"
_COMMIT = re.compile(r"^[0-9a-f]{7,40}(-dirty)?$")


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
    top = _git(where, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0 or not _same_dir(top.stdout.strip(), where):
        return None  # no checkout, or ``where`` is a plain folder inside some other repository's tree
    head = _git(where, "rev-parse", "--short=7", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    commit = head.stdout.strip()
    diff = _git(where, "diff", "--quiet", "HEAD", "--")
    return commit + "-dirty" if diff is not None and diff.returncode == 1 else commit


def _same_dir(a: str, b: Path) -> bool:
    try:
        return bool(a) and Path(a).resolve() == b.resolve()
    except OSError:
        return False


def check_commit(commit: str) -> str:
    """A commit given by hand: 7-40 lowercase hex digits, optionally ``-dirty``; ValueError otherwise."""
    text = commit.strip()
    if not _COMMIT.match(text):
        raise ValueError(f"a commit is 7-40 lowercase hex digits (optionally -dirty); got {commit!r}")
    return text


def sweep_commit(given: str | None = None, env: dict[str, str] | None = None, where: Path = CHECKOUT) -> str | None:
    """The commit a sweep records: ``given`` (``--commit``), else ``ROUTESCOPE_COMMIT``, else the tree's own checkout."""
    if given:
        return check_commit(given)
    from_env = (os.environ if env is None else env).get(COMMIT_ENV, "").strip()
    if from_env:
        return check_commit(from_env)
    return git_commit(where)
