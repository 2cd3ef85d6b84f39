"""A file's ``read`` condition in /routing's health problems ends once the file reads again, or is gone (issue 43)."""

from __future__ import annotations

import errno
import os

import pytest

import telemetry.multiproc.reader as reader_module

from .conftest import make_tel
from .test_compaction_crash import write_process

OTHER = f"{os.getpid()}-bbbbbb"  # another live process's files (this pid: alive, never compacted)


def read_conditions(tel) -> list[str]:
    return [os.path.basename(p["path"]) for p in tel.health_problems() if p.get("active") and p["stage"] == "read"]


@pytest.fixture
def reader(tmp_path):
    write_process(tmp_path, OTHER, 4)
    tel = make_tel(str(tmp_path), flush_on_exit=False)
    yield tel
    tel.close()


def failing(monkeypatch, name: str) -> None:
    real = reader_module.read_file

    def read(path, prev, key_cache):
        if os.path.basename(path) == name:
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real(path, prev, key_cache)

    monkeypatch.setattr(reader_module, "read_file", read)


def test_cleared_when_the_file_reads_again(reader, monkeypatch):
    name = f"counter_routescope-{OTHER}.db"
    with monkeypatch.context() as m:
        failing(m, name)
        reader.snapshot()
        assert read_conditions(reader) == [name]
    reader.snapshot()
    assert read_conditions(reader) == []


def test_cleared_when_the_file_is_gone(reader, monkeypatch, tmp_path):
    name = f"histogram_routescope-{OTHER}.db"
    with monkeypatch.context() as m:
        failing(m, name)
        reader.snapshot()
        assert read_conditions(reader) == [name]
        (tmp_path / name).unlink()  # its process exited and was compacted, or it was moved away
        reader.snapshot()
    assert read_conditions(reader) == []


def test_cleared_when_a_scrape_sets_it_aside(reader, monkeypatch, tmp_path):
    name = f"counter_routescope-{OTHER}.db"
    with monkeypatch.context() as m:
        failing(m, name)
        reader.snapshot()
    (tmp_path / name).write_bytes(b"\0\0")  # now corrupt: the next scrape renames it aside
    reader.snapshot()
    assert read_conditions(reader) == []
    assert [p["stage"] for p in reader.health_problems() if p.get("quarantined_as")] == ["read"]
