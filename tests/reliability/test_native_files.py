"""Native buckets in the multiprocess directory (``*.ndb``): merged, compacted, quarantined like the classic files,
never read by prometheus_client's own collector, and the reader's per-file cache never skips a check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from telemetry.exposition import classic_only
from telemetry.multiproc import mpfile
from telemetry.multiproc.compact import compact
from telemetry.multiproc.health import Problems
from telemetry.multiproc.reader import ReaderCache, multiprocess_registry

from .conftest import calls_by_prometheus_client, calls_in, call, errors, latency_in, make_tel, real_dispatcher
from .test_compaction_crash import write_process
from .test_corrupt_files import damage, dead_pid, three_sources


def stock_text(path: Path) -> bytes:
    reg = CollectorRegistry()
    MultiProcessCollector(reg, path=str(path))
    return generate_latest(reg)


def lines(text: bytes) -> list[str]:
    return sorted(x for x in text.decode().splitlines() if x and not x.startswith("#"))


def test_prometheus_clients_collector_reads_the_directory_cleanly(tmp_path):
    """vLLM's /metrics: the stock collector over live, dead and archived files, native ones beside them, gives the
    same classic exposition as routescope's reader, passes promtool, and never sees a native bucket."""
    dead = dead_pid()
    write_process(tmp_path, f"{dead}-aaaaaa", 5)
    compact(str(tmp_path))  # an archive of each kind, native included
    write_process(tmp_path, f"{dead}-bbbbbb", 7)  # dead, not yet compacted
    worker = make_tel(str(tmp_path), flush_on_exit=False)
    try:
        d = worker.instrument(real_dispatcher())
        for _ in range(3):
            call(d)
        worker.flush()
        assert {f.rsplit(".", 1)[1] for f in os.listdir(tmp_path) if "_routescope-" in f} == {"db", "ndb"}
        assert "native_routescope-archive.ndb" in os.listdir(tmp_path)
        text = stock_text(tmp_path)
        assert b"native" not in text and b"index=" not in text
        assert lines(text) == lines(generate_latest(classic_only(multiprocess_registry(str(tmp_path)))))
        assert calls_by_prometheus_client(tmp_path) == calls_in(tmp_path) == 15
        assert latency_in(tmp_path) == (15, 15)
        promtool = shutil.which("promtool")
        if promtool:
            res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
            assert res.returncode == 0 and not res.stdout.strip(), res.stdout.decode() + res.stderr.decode()
    finally:
        worker.close()


@pytest.mark.parametrize("how", ["random_bytes", "key_not_json", "truncated_entries", "wrong_length"])
@pytest.mark.parametrize("where", ["dead", "archive", "live"])
def test_a_corrupt_native_file_is_quarantined_and_the_classic_series_stay(tmp_path, where, how):
    worker, dead = three_sources(tmp_path)  # the archives: 5 calls, native included
    target = {"dead": f"native_routescope-{dead}-bbbbbb.ndb", "archive": "native_routescope-archive.ndb",
              "live": os.path.basename(worker._writer.filename("native"))}[where]
    damage(tmp_path / target, how)
    reader = make_tel(str(tmp_path), flush_on_exit=False)  # compacts the dead process on start, then reads
    try:
        assert reader.snapshot()
        assert calls_in(tmp_path) == calls_by_prometheus_client(tmp_path) == 15  # classic series untouched
        # the one latency series lost part of its native data: served classic-only, never a native count of 15 - lost
        assert latency_in(tmp_path) == (15, 0)
        assert len([f for f in os.listdir(tmp_path) if f.startswith(target + ".corrupt-")]) == 1
        stage = "read" if where == "live" else "compact"
        listed = [p for p in reader.health_problems() if p.get("quarantined_as")]
        assert [(p["stage"], os.path.basename(p["path"])) for p in listed] == [(stage, target)]
        assert errors(reader)[stage] >= 1
        withheld = [p for p in reader.health_problems() if p["stage"] == "merge"]
        assert len(withheld) == 1 and withheld[0]["active"] and "classic-only" in withheld[0]["detail"], withheld
        assert errors(reader)["merge"] == 1
        if where == "live":
            worker.flush()  # the owner finds its file gone and writes it again, whole
            assert latency_in(tmp_path) == (15, 15)
            reader.snapshot()
            assert not [p for p in reader.health_problems() if p["stage"] == "merge"]  # native again: cleared
    finally:
        reader.close()
        worker.close()


def _rewrite_key_in_place(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    with open(path, "r+b") as f:  # same inode, same length, same used header: only key bytes differ
        f.write(data.replace(old, new, 1))


@pytest.mark.parametrize("kind", ["counter", "native"])
def test_a_key_changed_in_place_after_a_scrape_is_still_caught(tmp_path, kind):
    """The reader keeps each file's checked layout between scrapes; a key rewritten in place (no new length, no new
    inode) must still be found and the file quarantined, not read through the old layout."""
    worker = make_tel(str(tmp_path), flush_on_exit=False)
    try:
        d = worker.instrument(real_dispatcher())
        for _ in range(3):
            call(d)
        worker.flush()
        problems: list[str] = []
        cache = ReaderCache()
        reg = multiprocess_registry(str(tmp_path), Problems(problems.append), cache)
        assert list(reg.collect()) and problems == []  # the layouts are cached now
        target = Path(worker._writer.filename(kind))
        if kind == "counter":  # a counter's sample name becomes another metric's: outside its family
            _rewrite_key_in_place(target, b'"routescope_calls_total"', b'"routescope_calls_totaX"')
        else:  # a native count becomes a bucket without an index
            _rewrite_key_in_place(target, b"_native_count", b"_native_bXcke")
        list(reg.collect())
        # a lost native file also leaves its series classic-only (counted as merge) until its writer makes it again
        assert problems == (["read"] if kind == "counter" else ["read", "merge"]) and not target.exists()
        assert len([f for f in os.listdir(tmp_path) if ".corrupt-" in f]) == 1
    finally:
        worker.close()


def test_values_change_between_scrapes_and_the_cache_follows(tmp_path):
    """Only values move (the next flush rewrites them in place): the cached layouts read the new ones."""
    worker = make_tel(str(tmp_path), flush_on_exit=False)
    try:
        d = worker.instrument(real_dispatcher())
        cache = ReaderCache()
        done = 0
        for n in (2, 5, 9):
            for _ in range(n - done):
                call(d)
            done = n
            worker.flush()
            families = list(multiprocess_registry(str(tmp_path), None, cache).collect())
            native = sum(s.native_histogram.count_value for f in families for s in f.samples
                         if s.native_histogram is not None)
            assert native == calls_in(tmp_path) == n
        assert mpfile.read(worker._writer.filename("native"))[0]  # a plain, full parse agrees the file is sound
    finally:
        worker.close()
