"""Output paths checked before work starts, and results kept when a write fails anyway.

Every command that writes (sweep, bench ab, the dashboard and rules builders) calls ``check_file`` or
``check_folder`` on its option at start, so a bad path costs a one-line message and exit status 2
instead of a traceback after the run. A write that fails at the end all the same (the disk filled,
the folder was removed) goes through ``write_or_keep``, which puts the bytes in a temporary file and
says where.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class OutputPathError(ValueError):
    """An output path that cannot be written; the message names the option and says why in one line."""


def _why(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


def _make_folder(folder: Path, option: str, given: Path) -> None:
    """Create ``folder`` and its missing parents, then prove a file can be made in it (and remove that file)."""
    for parent in (folder, *folder.parents):
        if parent.exists() and not parent.is_dir():
            raise OutputPathError(f"{option} {given}: {parent} is a file, not a folder")
        if parent.exists():
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"{option} {given}: cannot create folder {folder}: {_why(exc)}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".routescope-probe-", dir=folder)
    except OSError as exc:
        raise OutputPathError(f"{option} {given}: cannot write in {folder}: {_why(exc)}") from None
    os.close(fd)
    os.unlink(probe)


def check_folder(path: Path | str, option: str) -> Path:
    """A folder to write files into: made if missing (with its parents); refused if a file or unwritable."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"{option} {folder}: is a file; give a folder (it is made if missing)")
    _make_folder(folder, option, folder)
    return folder


def check_file(path: Path | str, option: str) -> Path:
    """A file to write: its folder made if missing; refused if it is a folder or cannot be written."""
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(f"{option} {target}: is a folder; give a file name")
    _make_folder(target.parent if str(target.parent) else Path("."), option, target)
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputPathError(f"{option} {target}: the file exists and cannot be written")
    return target


def keep_aside(data: bytes, name: str) -> Path:
    """Write ``data`` to a new temporary file named after ``name``; return its path."""
    stem, dot, suffix = Path(name).name.partition(".")
    fd, kept = tempfile.mkstemp(prefix=f"routescope-{stem}-", suffix=dot + suffix)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return Path(kept)


def write_or_keep(path: Path, data: bytes | str, option: str,
                  write: Callable[[Path, bytes], None] | None = None) -> tuple[Path, str | None]:
    """(where the data is, None) after writing ``path``; (a temporary file, why) when that write fails."""
    blob = data.encode("utf-8") if isinstance(data, str) else data
    try:
        (write or _write_bytes)(path, blob)
        return path, None
    except OSError as exc:
        kept = keep_aside(blob, path.name)
        return kept, f"{option} {path}: the write failed ({_why(exc)}); the results are in {kept}"


def _write_bytes(path: Path, blob: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)


def write_folder_or_keep(folder: Path, write: Callable[[Path], T], option: str) -> tuple[T, str | None]:
    """(what ``write(folder)`` returned, None); when it fails, ``write`` into a new temporary folder, and why."""
    try:
        return write(folder), None
    except OSError as exc:
        kept = Path(tempfile.mkdtemp(prefix=f"routescope-{folder.name or 'out'}-"))
        return write(kept), f"{option} {folder}: the write failed ({_why(exc)}); the results are in {kept}"
