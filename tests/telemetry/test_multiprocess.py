"""Multiprocess mode: ranks aggregate exactly in one scrape; killed processes' files are compacted, not left stale."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from dispatcher import Policy, what_if
from telemetry import Telemetry, TelemetryConfig
from telemetry.bench.workload import make_calls
from telemetry.multiproc.directory import FILE_RE
from telemetry.multiproc.reader import multiprocess_registry

from .conftest import dispatcher, scrape, series

ROOT = Path(__file__).resolve().parents[2]


def spawn(tmp: Path, rank: str, calls: int, process_id: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests.telemetry.mp_worker", "--dir", str(tmp), "--rank", rank, "--calls", str(calls)]
    if process_id:
        cmd += ["--process-id", process_id]
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def wait_ready(p: subprocess.Popen) -> None:
    line = p.stdout.readline()  # type: ignore[union-attr]
    assert line.strip() == "ready", f"worker said {line!r} (rc {p.poll()})"


def finish(p: subprocess.Popen) -> None:
    out, _ = p.communicate("go\n", timeout=60)
    assert p.returncode == 0 and "closed" in out


def reference(calls: int) -> dict:
    """The same calls in one plain process: counts per label set, rank dropped."""
    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), log_first_decode_in_prefill=False),
                    platform=what_if("gfx942"), policy=Policy())
    d = tel.instrument(dispatcher())
    for args, kw in make_calls(calls):
        d(*args, **kw)
    out = drop_rank(scrape(tel.registry))
    tel.close()
    return out


def drop_rank(samples: dict, names: tuple[str, ...] = ("routescope_calls_total", "routescope_rows_total",
                                                      "routescope_decisions_total",
                                                      "routescope_decode_in_prefill_rows_total",
                                                      "routescope_would_route_calls_total",
                                                      "routescope_call_duration_seconds_count")) -> dict:
    out: dict = {}
    for name in names:
        for labels, v in series(samples, name).items():
            key = (name, frozenset(kv for kv in labels if kv[0] != "rank"))
            out[key] = out.get(key, 0) + v
    return out


def times(d: dict, k: int) -> dict:
    return {key: v * k for key, v in d.items()}


def our_files(path: Path) -> list[str]:
    return sorted(f for f in os.listdir(path) if FILE_RE.match(f))


@pytest.mark.slow
def test_four_ranks_aggregate_exactly_in_one_scrape(tmp_path):
    procs = [spawn(tmp_path, str(r), 10_000) for r in range(4)]
    try:
        for p in procs:
            wait_ready(p)
        live = scrape(multiprocess_registry(str(tmp_path)))
        ref = reference(10_000)
        assert drop_rank(live) == times(ref, 4)
        for r in range(4):
            assert sum(series(live, "routescope_calls_total", rank=str(r)).values()) == 10_000
        assert len(series(live, "routescope_telemetry_last_flush_timestamp_seconds")) == 4
        promtool = shutil.which("promtool")
        if promtool:  # the merged multiprocess exposition is clean too
            text = generate_latest(multiprocess_registry(str(tmp_path)))
            res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
            assert res.returncode == 0 and not res.stdout.strip(), res.stdout.decode() + res.stderr.decode()
    finally:
        for p in procs:
            finish(p)
    after = scrape(multiprocess_registry(str(tmp_path)))
    assert drop_rank(after) == times(ref, 4)  # closed: moved to the archive, nothing lost or doubled
    assert our_files(tmp_path) == ["counter_routescope-archive.db", "histogram_routescope-archive.db",
                                   "native_routescope-archive.ndb"]
    assert series(after, "routescope_telemetry_last_flush_timestamp_seconds") == {}  # no live process


@pytest.mark.slow
def test_killed_and_restarted_ranks_leave_nothing_stale(tmp_path):
    ref = reference(1_000)
    dead = []
    for k in range(3):
        p = spawn(tmp_path, "0", 1_000)
        wait_ready(p)
        files = our_files(tmp_path)
        assert len([f for f in files if "archive" not in f]) == 4  # this process's counter, histogram, native, gauge
        assert not any(str(pid) in f for pid in dead for f in files)  # the killed one was compacted away
        live = scrape(multiprocess_registry(str(tmp_path)))
        assert drop_rank(live) == times(ref, k + 1)
        assert len(series(live, "routescope_telemetry_last_flush_timestamp_seconds")) == 1
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        dead.append(p.pid)
    # a new process (here: this one) compacts the last dead rank at its first flush, not in its constructor
    # (a vLLM worker builds its Telemetry inside its first attention call)
    tel = Telemetry(TelemetryConfig(multiproc_dir=str(tmp_path)), platform=what_if("gfx942"), policy=Policy())
    try:
        assert any(str(dead[-1]) in f for f in our_files(tmp_path))
        tel.flush()
        files = our_files(tmp_path)
        assert "counter_routescope-archive.db" in files
        assert not any(str(pid) in f for pid in dead for f in files)
        got = drop_rank(scrape(tel.collect_registry()))
        assert got == times(ref, 3)
    finally:
        tel.close()


def test_fixed_process_id_reuses_its_files(tmp_path):
    def run(calls: int) -> Telemetry:
        tel = Telemetry(TelemetryConfig(multiproc_dir=str(tmp_path), process_id="rank0", rank="0"),
                        platform=what_if("gfx942"), policy=Policy())
        d = tel.instrument(dispatcher())
        for args, kw in make_calls(calls):
            d(*args, **kw)
        tel.flush()
        return tel

    run(100).close()
    tel = run(50)
    try:
        got = scrape(multiprocess_registry(str(tmp_path)))
        assert sum(series(got, "routescope_calls_total").values()) == 150
        assert [f for f in our_files(tmp_path) if f.startswith("counter_")] == ["counter_routescope-id.rank0.db"]
    finally:
        tel.close()


def test_single_process_registry_is_unchanged_in_multiprocess_mode(tmp_path):
    tel = Telemetry(TelemetryConfig(multiproc_dir=str(tmp_path)), platform=what_if("gfx942"), policy=Policy())
    try:
        d = tel.instrument(dispatcher())
        for args, kw in make_calls(64):
            d(*args, **kw)
        single = sum(series(scrape(tel.registry), "routescope_calls_total").values())
        multi = sum(series(scrape(tel.collect_registry()), "routescope_calls_total").values())
        assert single == multi == 64
    finally:
        tel.close()


def _by_key(rows: list[dict], keys: tuple[str, ...], value: str = "calls") -> dict:
    out: dict = {}
    for r in rows:
        k = tuple(r[x] for x in keys)
        out[k] = out.get(k, 0) + r[value]
    return out


def test_snapshot_shows_every_process_in_multiprocess_mode(tmp_path):
    """/routing's snapshot, taken in a process that made no calls (the service beside vLLM's workers): every
    rank's counts, latency samples and decode-in-prefill, summed; decisions and health stay its own."""
    procs = [spawn(tmp_path, str(r), 1_500) for r in range(2)]
    try:
        for p in procs:
            wait_ready(p)
        tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), multiproc_dir=str(tmp_path), rank="9",
                                        log_first_decode_in_prefill=False), platform=what_if("gfx942"), policy=Policy())
        try:
            snap = tel.snapshot()
            own = tel.snapshot(all_processes=False)
        finally:
            tel.close()
    finally:
        for p in procs:
            finish(p)
    ref_tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), log_first_decode_in_prefill=False),
                        platform=what_if("gfx942"), policy=Policy())
    d = ref_tel.instrument(dispatcher())
    for args, kw in make_calls(1_500):
        d(*args, **kw)
    ref = ref_tel.snapshot()
    ref_tel.close()
    assert snap["scope"]["series"] == "every process" and own["scope"]["series"] == "this process"
    assert own["counts"] == [] and own["latency"] == [] and snap["decisions"] == []  # this process made no calls
    ckeys = ("kernel", "impl", "rows_bucket", "model", "call_class")
    assert _by_key(snap["counts"], ckeys) == times(_by_key(ref["counts"], ckeys), 2)
    assert _by_key(snap["counts"], ckeys, "rows") == times(_by_key(ref["counts"], ckeys, "rows"), 2)
    dkeys = ("kernel", "model", "call_class")
    dip, ref_dip = snap["decode_in_prefill"]["counts"], ref["decode_in_prefill"]["counts"]
    assert ref_dip and _by_key(dip, dkeys) == times(_by_key(ref_dip, dkeys), 2)
    lkeys = ("kernel", "rows_bucket", "model")
    assert _by_key(snap["latency"], lkeys, "samples") == times(_by_key(ref["latency"], lkeys, "samples"), 2)
    wkeys = ("policy", "kernel", "rows_bucket", "model")
    assert _by_key(snap["would_route"], wkeys) == times(_by_key(ref["would_route"], wkeys), 2)
    assert all(r["decode_in_prefill_calls"] is None for r in snap["would_route"])  # never exported: unknown
    assert any(r["decode_in_prefill_calls"] for r in ref["would_route"])


def test_native_buckets_merge_across_processes_and_ranks(tmp_path):
    """Two processes of rank 0 (a restart) and one of rank 1: each rank's native sample is the bucket-by-bucket sum
    of its processes', and the merged totals (what /routing shows) the sum over ranks."""
    from telemetry.multiproc.merge import totals_from_families
    from telemetry.multiproc.writer import MultiprocWriter
    from telemetry.native import NativeCounts, counts_from_native
    from telemetry.view import Totals

    key = ("intree.ragged_prefill", "2-3", "glm", "device")

    def totals(latencies_ns: list[int]) -> Totals:
        t = Totals()
        n = t.latency_native[key] = NativeCounts()
        for ns in latencies_ns:
            n.observe(ns)
        return t

    a, b = totals([40_000, 41_000, 90_000]), totals([40_000, 2_000_000, 0])
    for ident, t, rank in (("1-aaaaaa", a, "0"), ("2-bbbbbb", b, "0"), ("3-cccccc", a, "1")):
        w = MultiprocWriter(str(tmp_path), ident)
        w.write(t, rank)
        w.close()
    families = list(multiprocess_registry(str(tmp_path)).collect())
    natives = {s.labels["rank"]: counts_from_native(s.native_histogram) for f in families for s in f.samples
               if s.native_histogram is not None}
    rank0 = a.latency_native[key].copy()
    rank0.merge(b.latency_native[key])
    assert natives == {"0": rank0, "1": a.latency_native[key]}
    everything = rank0.copy()
    everything.merge(a.latency_native[key])
    assert totals_from_families(families).latency_native == {key: everything}
    assert everything.count == 9 and everything.zero == 1


def test_scrapes_that_arrive_during_a_read_share_the_next_one(tmp_path, monkeypatch):
    """Scrapes that wait for a read in progress share the next read, which starts after they arrived: they never
    get values older than themselves, and two of them cost one read."""
    import threading
    import time

    from telemetry.multiproc.reader import ReaderCache, RoutescopeMultiProcessCollector
    from telemetry.multiproc.writer import MultiprocWriter
    from telemetry.view import Totals

    key = ("intree.ragged_prefill", "torch", "2-3", "glm", "pure_decode", "cpu")
    w = MultiprocWriter(str(tmp_path), "1-aaaaaa")
    w.write(Totals(calls={key: 1}), "0")
    reads: list[int] = []
    gate = threading.Event()
    real = RoutescopeMultiProcessCollector.read

    def read(self):
        got = real(self)
        reads.append(1)
        if len(reads) == 1:
            assert gate.wait(30)  # the first read holds on, its values already taken
        return got

    monkeypatch.setattr(RoutescopeMultiProcessCollector, "read", read)
    cache = ReaderCache()
    seen: dict[str, float] = {}

    def scrape(name: str) -> None:
        families = multiprocess_registry(str(tmp_path), None, cache).collect()
        seen[name] = sum(s.value for f in families for s in f.samples if s.name == "routescope_calls_total")

    first = threading.Thread(target=scrape, args=("first",))
    first.start()
    deadline = time.monotonic() + 30
    while not reads and time.monotonic() < deadline:
        time.sleep(0.01)
    w.write(Totals(calls={key: 2}), "0")  # a flush after the first read took its values
    later = [threading.Thread(target=scrape, args=(n,)) for n in ("second", "third")]
    for t in later:
        t.start()
    time.sleep(0.2)
    assert len(reads) == 1  # they wait: the read in progress is older than they are
    gate.set()
    for t in (first, *later):
        t.join(timeout=30)
    w.close()
    assert seen == {"first": 1, "second": 2, "third": 2} and len(reads) == 2


def test_series_whose_files_are_gone_leave_the_next_scrape(tmp_path):
    """The reader keeps every series' slot between scrapes; one that no file holds any more is not yielded (as
    prometheus_client's collector would not), native sample included."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from telemetry.exposition import classic_only
    from telemetry.multiproc.reader import ReaderCache
    from telemetry.multiproc.writer import MultiprocWriter
    from telemetry.native import NativeCounts
    from telemetry.view import Totals

    t = Totals(calls={("intree.ragged_prefill", "torch", "2-3", "glm", "pure_decode", "cpu"): 3})
    t.latency_native[("intree.ragged_prefill", "2-3", "glm", "device")] = n = NativeCounts()
    n.observe(40_000)
    for ident, rank in (("1-aaaaaa", "0"), ("2-bbbbbb", "1")):
        w = MultiprocWriter(str(tmp_path), ident)
        w.write(t, rank)
        w.close()
    cache = ReaderCache()

    def ranks() -> set[str]:
        return {s.labels.get("rank") for f in multiprocess_registry(str(tmp_path), None, cache).collect()
                for s in f.samples if "rank" in s.labels}

    assert ranks() == {"0", "1"}
    for f in os.listdir(tmp_path):
        if "2-bbbbbb" in f:
            os.remove(tmp_path / f)
    assert ranks() == {"0"}
    stock = CollectorRegistry()
    MultiProcessCollector(stock, path=str(tmp_path))
    ours = classic_only(multiprocess_registry(str(tmp_path), None, cache))
    def samples(text: bytes) -> list[bytes]:
        return sorted(x for x in text.splitlines() if x and not x.startswith(b"#"))

    assert samples(generate_latest(ours)) == samples(generate_latest(stock))
