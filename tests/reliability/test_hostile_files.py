"""Hostile files in the multiprocess directory (issue 43): huge, sparse, not files at all, or keys that lie.

A reader reads no byte past what a file's header says is used (plus a manifest): an 8 GiB
sparse file is a few small reads, checked in a child process whose address space is capped
at 512 MiB over what it has mapped, so a reader that read the whole file could not. A FIFO or
directory named like a ``*.db`` is refused without opening it for a blocking read. A key that
is well formed but names a sample outside its metric's family (prometheus_client's
multiprocess format decides what belongs: see ``mpfile.SUFFIXES``) is corrupt: quarantined and
counted, not served.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.multiproc import mpfile
from telemetry.multiproc.compact import compact
from telemetry.multiproc.health import Problems
from telemetry.multiproc.reader import RoutescopeMultiProcessCollector

from .conftest import ROOT, calls_by_prometheus_client, calls_in, db_files
from .test_compaction_crash import write_process

DEAD = 999_961
GiB = 1 << 30


def alive(pid: int) -> bool:
    return pid != DEAD


def key(metric: str, sample: str, labels: dict | None = None) -> str:
    return json.dumps([metric, sample, labels or {}, "h"], sort_keys=True)


def sparse(path: Path, head: bytes, size: int = 8 * GiB) -> None:
    path.write_bytes(head)
    os.truncate(path, size)  # a hole: instant, and no disk


CAPPED = """
import json, os, resource, sys
from telemetry.multiproc import mpfile
from telemetry.multiproc.compact import compact
from telemetry.multiproc.health import Problems
from telemetry.multiproc.reader import RoutescopeMultiProcessCollector

path, dead = sys.argv[1], int(sys.argv[2])
mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (mapped + (512 << 20), resource.RLIM_INFINITY))
out = {}
for name in sorted(os.listdir(path)):
    try:
        entries, manifest = mpfile.read(os.path.join(path, name))
        out[name] = ["ok", len(entries)]
    except mpfile.CorruptFile as exc:
        out[name] = ["corrupt", exc.reason]
    except MemoryError:
        out[name] = ["MemoryError", ""]
stages = []
compact(path, alive=lambda pid: pid != dead, problems=Problems(stages.append))
RoutescopeMultiProcessCollector(None, path, Problems(stages.append)).read()
print(json.dumps({"read": out, "stages": stages, "left": sorted(os.listdir(path))}))
"""


def run_capped(path: Path, timeout: float) -> dict:
    res = subprocess.run([sys.executable, "-c", CAPPED, str(path), str(DEAD)], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture
def hostile(tmp_path) -> Path:
    """A real dead process (5 calls) beside huge sparse files, dead and live."""
    write_process(tmp_path, f"{DEAD}-aaaaaa", 5)
    small = mpfile.build({key("routescope_calls", "routescope_calls_total", {"rank": "9"}): 2.0})
    sparse(tmp_path / f"counter_routescope-{DEAD}-zeroed.db", b"")  # used 0: corrupt, found in 8 bytes
    sparse(tmp_path / f"counter_routescope-{DEAD}-valid.db", small)  # valid header, 8 GiB of hole after it
    sparse(tmp_path / f"counter_routescope-{os.getpid()}-claims.db", mpfile.header(2**31 - 1))  # used: 2 GiB
    manifest = mpfile.header(8) + mpfile.MANIFEST_MAGIC + (2**31 - 1).to_bytes(4, sys.byteorder)
    sparse(tmp_path / "histogram_routescope-archive.db", manifest)  # a manifest of 2 GiB
    return tmp_path


def test_huge_sparse_files_are_never_read_whole(hostile):
    got = run_capped(hostile, 240)
    read = got["read"]
    assert read[f"counter_routescope-{DEAD}-valid.db"] == ["ok", 1]
    assert read[f"counter_routescope-{DEAD}-zeroed.db"][0] == "corrupt"
    assert "more than" in read[f"counter_routescope-{os.getpid()}-claims.db"][1]
    assert "manifest length" in read["histogram_routescope-archive.db"][1]
    left = [f for f in got["left"] if f.endswith(".db")]
    assert left == ["counter_routescope-archive.db", "histogram_routescope-archive.db"]  # all else merged or aside
    assert got["stages"] == ["compact", "compact", "read"]  # the zeroed and the archive; the live one
    assert calls_in(hostile) == 5 + 2  # the real dead process and the valid sparse one, merged once


def test_a_fifo_is_never_opened_for_a_blocking_read(tmp_path):
    os.mkfifo(tmp_path / f"counter_routescope-{os.getpid()}-fifo.db")  # live: the scrape sets it aside
    os.mkfifo(tmp_path / f"histogram_routescope-{DEAD}-fifo.db")  # dead: the merge does
    got = run_capped(tmp_path, 60)
    assert set(map(tuple, got["read"].values())) == {("corrupt", "not a regular file")}
    assert got["stages"] == ["compact", "read"] and not [f for f in got["left"] if f.endswith(".db")]


@pytest.mark.parametrize(("kind", "sample", "labels"), [
    ("counter", "b", {}),  # another metric's sample
    ("counter", "a", {}),  # a counter's sample is a_total (or a_created)
    ("gauge", "a_total", {}),
    ("histogram", "a_total", {}),
    ("histogram", "a_bucket", {}),  # a bucket without its bound
    ("histogram", "a_sum", {"le": "1.0"}),  # a bound on what is no bucket
    ("summary", "a_bucket", {"le": "1.0"}),
    ("counter", "ab_total", {}),  # a prefix is not a family
    ("native", "a_native_bucket", {}),  # a native bucket without its index
    ("native", "a_native_bucket", {"index": "1.5"}),  # an index is an int
    ("native", "a_native_bucket", {"index": "99999"}),  # past any schema-4 index of a latency
    ("native", "a_native_count", {"index": "3"}),  # an index on what is no bucket
    ("native", "a_bucket", {"le": "1.0"}),  # a classic bucket in a native file
    ("histogram", "a_native_bucket", {"index": "3"}),  # a native bucket in a classic file
])
def test_a_sample_outside_its_metric_family_is_corrupt(kind, sample, labels):
    data = mpfile.build({key("a", sample, labels): 1.0})
    with pytest.raises(mpfile.CorruptFile, match="not one of metric 'a'"):
        mpfile.parse(data, kind=kind)


def test_the_family_is_checked_even_without_a_file_type():
    with pytest.raises(mpfile.CorruptFile):
        mpfile.parse(mpfile.build({key("a", "b"): 1.0}))
    mpfile.parse(mpfile.build({key("a", "a_total"): 1.0, key("h", "h_bucket", {"le": "1.0"}): 1.0}))


PROMETHEUS_CLIENT_FILES = """
import os, sys
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]
from prometheus_client import Counter, Gauge, Histogram, Summary
Counter("c_total", "h", ["x"]).labels("1").inc()
Counter("d", "h").inc(2)
Gauge("g", "h", multiprocess_mode="livemax").set(3)
Gauge("s", "h", multiprocess_mode="sum").set(4)
Histogram("hist", "h", buckets=(0.1, 1.0)).observe(0.5)
Summary("summ", "h").observe(0.5)
"""


def test_prometheus_clients_own_files_pass(tmp_path):
    """What prometheus_client itself writes (each type, its own names) parses, as its file type says."""
    subprocess.run([sys.executable, "-c", PROMETHEUS_CLIENT_FILES, str(tmp_path)], check=True, timeout=120)
    names = sorted(os.listdir(tmp_path))
    assert {mpfile.file_type(n) for n in names} == {"counter", "gauge", "histogram", "summary"}
    for name in names:
        with open(tmp_path / name, "rb") as f:
            entries, _ = mpfile.parse(f.read(), kind=mpfile.file_type(name))
        assert entries, name


def test_a_lying_key_is_quarantined_by_the_merge_and_by_a_scrape(tmp_path):
    write_process(tmp_path, f"{DEAD}-aaaaaa", 5)
    dead = tmp_path / f"counter_routescope-{DEAD}-bbbbbb.db"
    live = tmp_path / f"histogram_routescope-{os.getpid()}-cccccc.db"
    dead.write_bytes(mpfile.build({key("routescope_calls", "b"): 1.0}))
    live.write_bytes(mpfile.build({key("routescope_call_duration_seconds", "routescope_call_duration_seconds_total"):
                                   1.0}))
    stages: list[str] = []
    compact(str(tmp_path), alive=alive, problems=Problems(stages.append))
    assert stages == ["compact"] and not dead.exists()
    RoutescopeMultiProcessCollector(None, str(tmp_path), Problems(stages.append)).read()
    assert stages == ["compact", "read"] and not live.exists()
    assert calls_in(tmp_path) == calls_by_prometheus_client(tmp_path) == 5
    assert all("archive" in f for f in db_files(tmp_path))
