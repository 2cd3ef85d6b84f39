"""Every native histogram the reader serves is valid: its count is its zero bucket plus its buckets and its classic
count, in the protobuf and the OpenMetrics 2.0 exposition alike, whatever part of the directory was lost, and no read
pairs one flush's counts with another's buckets (the generation bracket, telemetry.multiproc.reader)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.openmetrics.parser import text_string_to_metric_families

from telemetry.exposition.protobuf import decode_delimited
from telemetry.multiproc.health import Problems
from telemetry.multiproc.reader import ReaderCache, RoutescopeMultiProcessCollector
from telemetry.native import counts_from_native

from ..service.live import Served

ROOT = Path(__file__).resolve().parents[2]
HIST = "routescope_call_duration_seconds"
PROTOBUF = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
OM2 = "application/openmetrics-text; version=2.0.0"


def worker(path: Path, mode: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.reliability.flush_worker", str(path), mode, str(n)],
                            cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def labels_of(metric) -> frozenset:
    return frozenset((lp.name, lp.value) for lp in metric.label)


def protobuf_series(body: bytes) -> dict[frozenset, tuple[int, int | None, float]]:
    """Per latency series: (classic count, native zero + buckets or None when no native part, sum)."""
    out = {}
    for fam in decode_delimited(body):
        if fam.name != HIST:
            continue
        for m in fam.metric:
            h = m.histogram
            native = None
            if h.positive_span or h.zero_count or h.schema:
                running, native = 0, h.zero_count
                for d in h.positive_delta:
                    running += d
                    native += running
            out[labels_of(m)] = (h.sample_count, native, h.sample_sum)
    return out


def om2_series(text: str) -> dict[frozenset, tuple[int, int | None]]:
    """Per latency series: (classic count, native count or None)."""
    classic: dict[frozenset, int] = {}
    native: dict[frozenset, int] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != HIST:
            continue
        for s in fam.samples:
            key = frozenset((k, v) for k, v in s.labels.items() if k != "le")
            if s.native_histogram is not None:
                c = counts_from_native(s.native_histogram)
                assert c.zero + sum(c.buckets.values()) == c.count, (key, c)
                native[key] = c.count
            elif s.name == HIST + "_count":
                classic[key] = int(s.value)
    return {k: (v, native.get(k)) for k, v in classic.items()}


def test_the_audits_reproduction_serves_each_series_valid_in_both_formats(tmp_path):
    """A exits after 1,000 timed calls; B flushes 1,000 and is killed -9; B's .ndb becomes 64 bytes of 0xff; then
    `routescope serve --multiproc-dir` starts. The series that lost B's native half is served classic-only, in
    protobuf and OpenMetrics 2.0 alike (never sample_count 2,000 beside buckets that sum to 1,000), counted, and
    listed in /routing's health."""
    d = tmp_path / "mp"
    d.mkdir()
    a = worker(d, "exit", 1000)
    assert a.wait(timeout=120) == 0
    b = worker(d, "hang", 1000)
    try:
        assert b.stdout.readline().strip() == "flushed"
    finally:
        b.send_signal(signal.SIGKILL)
        b.wait(timeout=30)
    ndb = [f for f in os.listdir(d) if f.startswith(f"native_routescope-{b.pid}-")]
    assert len(ndb) == 1
    (d / ndb[0]).write_bytes(b"\xff" * 64)
    served = Served("--multiproc-dir", str(d), log=tmp_path / "serve.log").wait_ready()
    try:
        proto = protobuf_series(served.get("/metrics", headers={"Accept": PROTOBUF}).content)
        om2 = om2_series(served.get("/metrics", headers={"Accept": OM2}).text)
        routing = served.get("/routing").json()
    finally:
        served.stop()
    assert sum(c for c, _n, _s in proto.values()) == 2000  # A's and B's classic halves are whole
    for key, (count, native, _sum) in proto.items():
        assert native is None or native == count, (key, count, native)
        assert om2[key] == (count, native), (key, om2[key], count, native)  # the two formats agree
    lost = [key for key, (_c, native, _s) in proto.items() if native is None]
    assert lost, proto  # the series B's native file held is classic-only, not half native
    problems = routing["health"]["problems"]
    withheld = [p for p in problems if p["stage"] == "merge"]
    assert len(withheld) == len(lost) and all(p["active"] and "classic-only" in p["detail"] for p in withheld)
    assert any(p.get("quarantined_as") and p["path"].endswith(ndb[0]) for p in problems)
    assert routing["health"]["telemetry_errors"].get("merge", 0) >= len(lost)


def mismatches(families) -> tuple[int, int]:
    """(series read, series whose native part is missing or differs from the classic count or its own buckets)."""
    classic: dict[tuple, float] = {}
    native: dict[tuple, int] = {}
    for fam in families:
        if fam.name != HIST:
            continue
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.native_histogram is not None:
                c = counts_from_native(s.native_histogram)
                native[key] = c.count if c.zero + sum(c.buckets.values()) == c.count else -1
            elif s.name == HIST + "_count":
                classic[key] = s.value
    return len(classic), sum(1 for k, v in classic.items() if v and native.get(k) != v)


def test_a_reader_never_pairs_one_flushs_counts_with_anothers_buckets(tmp_path):
    """A real writer process flushes every 10 ms; 20,000 reads in this process: every one whole."""
    w = worker(tmp_path, "every", 10)
    problems: list[str] = []
    try:
        assert w.stdout.readline().strip() == "ready"
        cache = ReaderCache()
        collector = RoutescopeMultiProcessCollector(None, str(tmp_path), Problems(problems.append), cache)
        bad = reads = 0
        changed, last = 0, None
        for _ in range(20_000):
            families = collector.collect()
            n, wrong = mismatches(families)
            reads += n > 0
            bad += wrong > 0
            now = next((s.value for f in families if f.name == HIST for s in f.samples if s.name == HIST + "_count"),
                       None)
            changed += now != last
            last = now
        assert w.poll() is None, "the writer died"
    finally:
        w.kill()
        w.wait(timeout=30)
    assert reads == 20_000 and bad == 0, (bad, cache.torn)
    assert changed > 100  # the reads did meet many flushes
    assert "merge" not in problems
