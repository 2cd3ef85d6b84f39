"""Corrupt and truncated files in the multiprocess directory: skipped, quarantined, counted, listed, never fatal.

Each kind of damage (empty, truncated, zeroed, random bytes, a non-UTF-8 key, a key that is not
JSON, a wrong header, a wrong length) lands on a dead process's file, the archive, and a live
process's file. The merge and every scrape still answer; the file is renamed aside where no
collector reads it (prometheus_client's, as vLLM's /metrics runs it, included); the loss is
exactly that file's contribution, and a live process's file is rewritten by its owner at its
next flush, so the totals are exact again.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.mmap_dict import _read_all_values

from telemetry.multiproc import mpfile
from telemetry.multiproc.compact import compact

from .conftest import calls_by_prometheus_client, calls_in, call, db_files, errors, make_tel, real_dispatcher
from .test_compaction_crash import write_process


def _key_at(data: bytes) -> int:
    return 8 + 4  # the first key's first byte


def _bad_utf8(data: bytes) -> bytes:
    b = bytearray(data)
    b[_key_at(data)] = 0xFF
    return bytes(b)


def _not_json(data: bytes) -> bytes:
    b = bytearray(data)
    b[_key_at(data)] = ord("x")
    return bytes(b)


DAMAGE = {
    "empty": lambda d: b"",
    "truncated_header": lambda d: d[:5],
    "truncated_entries": lambda d: d[: mpfile.used(d) // 2],
    "zeroed": lambda d: bytes(len(d)),
    "random_bytes": lambda d: random.Random(7).randbytes(len(d)),
    "bad_utf8_key": _bad_utf8,
    "key_not_json": _not_json,
    "wrong_magic": lambda d: d[:4] + b"\x01\x02\x03\x04" + d[8:],
    "wrong_length": lambda d: (len(d) + 64).to_bytes(4, sys.byteorder) + d[4:],
}


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    with open(path, "r+b") as f:  # in place: the same inode, as a bad disk or a stray writer would leave it
        f.truncate(0)
        f.write(DAMAGE[how](data))


def three_sources(tmp_path: Path):
    """A directory read from three sources: a live process (3 calls), the archive (5) and a dead process's files (7).
    Returns the live worker and the dead process's pid."""
    dead = dead_pid()
    worker = make_tel(str(tmp_path), flush_on_exit=False)  # a live process: 3
    d = worker.instrument(real_dispatcher())
    for _ in range(3):
        call(d)
    worker.flush()
    write_process(tmp_path, f"{dead}-aaaaaa", 5)
    compact(str(tmp_path))  # the archive: 5 calls
    write_process(tmp_path, f"{dead}-bbbbbb", 7)  # a dead process's files: 7
    return worker, dead


@pytest.mark.parametrize("how", sorted(DAMAGE))
@pytest.mark.parametrize("where", ["dead", "archive", "live"])
def test_corrupt_file_is_skipped_quarantined_and_counted(tmp_path, where, how):
    worker, dead = three_sources(tmp_path)
    target = {"dead": f"counter_routescope-{dead}-bbbbbb.db", "archive": "counter_routescope-archive.db",
              "live": os.path.basename(worker._writer.filename("counter"))}[where]
    damage(tmp_path / target, how)

    reader = make_tel(str(tmp_path), flush_on_exit=False)  # the service: compacts the dead file on start, then reads
    try:
        expected = {"dead": 5 + 3, "archive": 7 + 3, "live": 5 + 7}[where]
        assert reader.snapshot()  # answers
        assert calls_in(tmp_path) == expected
        if where == "archive":  # a new one, holding the dead process merged after the old one went aside
            assert mpfile.read(str(tmp_path / target))[1] == [f"counter_routescope-{dead}-bbbbbb.db"]
        else:
            assert target not in db_files(tmp_path)
        moved = [f for f in os.listdir(tmp_path) if f.startswith(target + ".corrupt-")]
        assert len(moved) == 1
        assert calls_by_prometheus_client(tmp_path) == expected  # vLLM's collector is not broken by it either
        listed = [p for p in reader.health_problems() if p.get("quarantined_as")]
        stage = "read" if where == "live" else "compact"
        assert [(p["stage"], os.path.basename(p["path"])) for p in listed] == [(stage, target)]
        assert listed[0]["detail"]
        assert errors(reader)[stage] >= 1
        assert not [p for p in reader.health_problems() if p.get("blocking")]  # quarantine is history, not a fault
        if where == "live":
            worker.flush()  # the owner notices its file was moved aside and writes it again, whole
            assert calls_in(tmp_path) == 5 + 7 + 3
    finally:
        reader.close()
        worker.close()


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_parse_raises_only_corrupt_file(data):
    """Any damage to a real file: parse() returns entries prometheus_client can read, or raises CorruptFile."""
    good = VALID
    ops = data.draw(st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert", "set_len"]),
                                       st.integers(0, len(good) + 8), st.integers(0, 255)), min_size=1, max_size=4))
    b = bytearray(good)
    for op, at, val in ops:
        at = min(at, len(b))
        if op == "flip" and at < len(b):
            b[at] ^= val or 1
        elif op == "cut":
            del b[at:]
        elif op == "insert":
            b[at:at] = bytes([val])
        elif op == "set_len" and len(b) >= 4:
            b[0:4] = (at * 8).to_bytes(4, sys.byteorder)
    try:
        entries, _ = mpfile.parse(bytes(b))
    except mpfile.CorruptFile:
        return
    got = [(k, v) for k, v, _ts, _pos in _read_all_values(bytes(b), mpfile.used(bytes(b)))]
    assert got == [(k, v) for k, _p, v, _ts, _o in entries]


def _valid_file() -> bytes:
    return mpfile.build({
        '["routescope_calls", "routescope_calls_total", {"kernel": "intree.ragged_prefill", "rank": "0"}, "h"]': 3.0,
        '["routescope_call_duration_seconds", "routescope_call_duration_seconds_bucket", {"le": "0.001"}, "h"]': 1.0,
    }, ["counter_routescope-1-abcdef.db"])


VALID = _valid_file()
