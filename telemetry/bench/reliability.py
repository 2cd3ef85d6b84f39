"""`routescope bench multiproc`: what the multiprocess directory costs and loses.

* scrape cost: one /metrics exposition over the files of 8, 64 and 256 live processes (each the
  totals of the same real workload, written by the real writer; no process needs to run):
  prometheus_client's own collector and text, as vLLM serves it, beside routescope's reader with
  its text and protobuf (native) encoders and the merged totals /routing reads, in one run, for
  files of classic series only and files with the native buckets too;
* calls lost per kill -9: real worker processes (``kill_worker``: real Dispatcher and torch
  kernels, Telemetry at its defaults) killed at random instants; lost = calls started minus
  calls in the files, also as seconds of that worker's calls;
* time to recover from a corrupt file: a live worker's counter file overwritten with garbage,
  then scraped every 10 ms until the totals are back to at least what they were.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from dispatcher import Dispatcher, Policy, what_if

from ..config import TelemetryConfig
from ..core import Telemetry
from ..exposition import classic_only, negotiate
from ..multiproc.merge import totals_from_families
from ..multiproc.reader import ReaderCache, multiprocess_registry
from ..multiproc.writer import MultiprocWriter
from ..native import NativeCounts
from ..view import Totals
from .kill_worker import read_slot
from .workload import make_calls, noop_registry

ROOT = Path(__file__).resolve().parents[2]


TEXT = "text/plain; version=0.0.4"  # what a classic Prometheus (and vLLM's /metrics) speaks
PROTOBUF = ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited;q=0.7,"
            "text/plain;version=0.0.4;q=0.3")  # Prometheus with --enable-feature=native-histograms


def scaled(totals: Totals, k: int) -> Totals:
    """The same series with every value times ``k``: a flush of every process rewrites each value, adds none."""
    out = Totals(ts=totals.ts + k)
    for f in fields(Totals):
        v = getattr(totals, f.name)
        if f.name == "latency":
            v = {key: ([c * k for c in counts], total * k) for key, (counts, total) in v.items()}
        elif f.name == "latency_native":
            native = {}
            for key, n in v.items():
                m = native[key] = NativeCounts()
                m.count, m.zero, m.sum_ns = n.count * k, n.zero * k, n.sum_ns * k
                m.buckets = {i: c * k for i, c in n.buckets.items()}
            v = native
        elif isinstance(v, dict):
            v = {key: x * k for key, x in v.items()}
        else:
            continue
        setattr(out, f.name, v)
    return out


def workload_totals(calls: int) -> Totals:
    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), flush_on_exit=False, log_first_decode_in_prefill=False),
                    platform=what_if("gfx942"), policy=Policy())
    d = tel.instrument(Dispatcher(platform=what_if("gfx942"), policy=Policy(), registry=noop_registry()))
    for args, kw in make_calls(calls):
        d(*args, **kw)
    totals = tel.flush()
    tel.close()
    return totals


def _stock(path: str) -> bytes:
    """vLLM's /metrics: prometheus_client's MultiProcessCollector, text exposition."""
    reg = CollectorRegistry()
    MultiProcessCollector(reg, path=path)
    return generate_latest(reg)


def _directory(path: str, totals: Totals, processes: int) -> list[MultiprocWriter]:
    """``processes`` live processes' files (rank i each), written by the real writer; the writers stay open."""
    writers = []
    for i in range(processes):
        w = MultiprocWriter(path, f"{os.getpid()}-{i:06x}")  # a live pid: nothing is compacted
        w.write(totals, str(i))
        writers.append(w)
    return writers


def _scrapes(path: str, totals: Totals, writers: list[MultiprocWriter], repeats: int) -> dict[str, float]:
    """Median seconds per scrape, stock and routescope alternating; before each scrape every process flushes new
    values, so no scrape reads values it has read before. ``routescope_text_new_series_s``: the text scrape
    after one process also added a series (its file is parsed again, the merge plan extended)."""
    cache = ReaderCache()
    registry = multiprocess_registry(path, cache=cache)  # as the service: one reader cache, kept between scrapes
    text, protobuf = negotiate(TEXT)[0], negotiate(PROTOBUF)[0]
    t0 = time.perf_counter()
    text(registry)  # the first scrape: every file parsed and checked in full
    cold = time.perf_counter() - t0
    runs: dict[str, list[float]] = {"prometheus_client_text_s": [], "routescope_text_s": [],
                                    "routescope_protobuf_s": [], "routescope_merged_totals_s": [],
                                    "routescope_text_new_series_s": []}
    flushes = itertools.count(2)
    added: dict = {}
    call_key = next(iter(totals.calls))
    for r in range(repeats):
        for name, fn in (("prometheus_client_text_s", lambda: _stock(path)),
                         ("routescope_text_s", lambda: text(registry)),
                         ("routescope_protobuf_s", lambda: protobuf(registry)),
                         ("routescope_merged_totals_s", lambda: totals_from_families(registry.collect())),
                         ("routescope_text_new_series_s", lambda: text(registry))):
            now = scaled(totals, next(flushes))
            first = now
            if name == "routescope_text_new_series_s":  # process 0 routes a model it had not seen
                added[call_key[:3] + (f"new-{r}",) + call_key[4:]] = 1
                first = replace(now, calls={**now.calls, **added})
            for i, w in enumerate(writers):
                w.write(first if i == 0 else now, str(i))
            t0 = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - t0)
    out = {name: statistics.median(ts) for name, ts in runs.items()}
    out["routescope_first_scrape_s"] = cold
    return out


def scrape_cost(processes: tuple[int, ...] = (8, 64, 256), *, calls: int = 2000, repeats: int = 5,
                progress: Callable[[str], None] | None = None) -> list[dict]:
    """Seconds per /metrics over the files of N live processes: routescope beside prometheus_client, same series.

    Two directories per N, both written by the real writer from the same workload's totals: ``classic`` (no
    native buckets in the files) and ``native`` (the latency's native buckets too, as routescope writes them)."""
    totals = workload_totals(calls)
    classic = replace(totals, latency_native={})
    out = []
    for n in processes:
        for series, t in (("classic", classic), ("native", totals)):
            if progress:
                progress(f"scrape cost: {n} processes' files, {series} buckets, {repeats} scrapes a reader")
            with tempfile.TemporaryDirectory() as path:
                writers = _directory(path, t, n)
                try:
                    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
                    text = negotiate(TEXT)[0](multiprocess_registry(path))
                    row = {"processes": n, "series": series, "files": len(os.listdir(path)), "bytes_on_disk": size,
                           "exposition_bytes": len(text),
                           "samples": sum(1 for line in text.splitlines() if line and not line.startswith(b"#")),
                           **_scrapes(path, t, writers, repeats)}
                finally:
                    for w in writers:
                        w.close()
            row["text_ratio"] = row["routescope_text_s"] / row["prometheus_client_text_s"]
            row["protobuf_ratio"] = row["routescope_protobuf_s"] / row["prometheus_client_text_s"]
            out.append(row)
    return out


def _spawn(path: Path, slot: Path, rank: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "telemetry.bench.kill_worker", "--dir", str(path), "--slot", str(slot),
                          "--rank", str(rank)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"})
    if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
        raise RuntimeError("worker did not start")
    return p


def _calls(path: Path, rank: int) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(classic_only(multiprocess_registry(str(path)))).decode()
    return int(sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "routescope_calls_total" and s.labels.get("rank") == str(rank)))


def kill_loss(kills: int = 8, *, seed: int = 0, max_age_s: float = 4.0,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Calls lost per kill -9 at a random instant (0.1 s to ``max_age_s`` after the worker's start)."""
    rng = random.Random(seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mp"
        path.mkdir()
        for k in range(kills):
            if progress:
                progress(f"kill -9 {k + 1} of {kills}")
            slot = Path(tmp) / f"slot{k}"
            p = _spawn(path, slot, k)
            time.sleep(rng.uniform(0.1, max_age_s))
            t_kill = time.monotonic()
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
            started, marks = read_slot(str(slot))
            last = [n for t, n in marks if t >= t_kill - 1.0]
            rate = (started - min(last)) if last else started  # calls in its last second
            lost = started - _calls(path, k)
            rows.append({"age_s": round(t_kill - marks[0][0], 2) if marks else None, "started": started, "lost": lost,
                         "lost_s": round(lost / rate, 3) if rate else None})
    lost = [r["lost"] for r in rows]
    lost_s = [r["lost_s"] for r in rows if r["lost_s"] is not None]
    return {"kills": rows, "flush_interval_s": TelemetryConfig().flush_interval_s,
            "lost_calls_median": statistics.median(lost), "lost_calls_max": max(lost),
            "lost_seconds_median": statistics.median(lost_s) if lost_s else None,
            "lost_seconds_max": max(lost_s) if lost_s else None,
            "exported_more_than_started": sum(1 for r in rows if r["lost"] < 0)}


def recovery_time(repeats: int = 5, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Seconds from a live worker's counter file overwritten with garbage to totals back at (at least) their level."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mp"
        path.mkdir()
        p = _spawn(path, Path(tmp) / "slot", 0)
        try:
            time.sleep(1.5)
            for i in range(repeats):
                if progress:
                    progress(f"corrupt file {i + 1} of {repeats} (each is logged as skipped and renamed: this bench's "
                             "own garbage)")
                before = _calls(path, 0)
                target = next(f for f in os.listdir(path) if f.startswith("counter_routescope-") and f.endswith(".db"))
                with open(path / target, "r+b") as f:
                    f.write(os.urandom(64))
                t0 = time.monotonic()
                while _calls(path, 0) < before:  # the first scrape quarantines it; the owner rewrites it at its flush
                    time.sleep(0.01)
                times.append(time.monotonic() - t0)
                time.sleep(0.3)
        finally:
            p.kill()
            p.wait(timeout=30)
    return {"repeats": repeats, "median_s": statistics.median(times), "max_s": max(times),
            "times_s": [round(t, 3) for t in times]}


def run(*, kills: int = 8, repeats: int = 5, processes: tuple[int, ...] = (8, 64, 256),
        scrapes: int = 5, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Scrape cost, and (when asked: ``kills``, ``repeats`` > 0) kill -9 loss and corrupt-file recovery."""
    return {"scrape": scrape_cost(processes, repeats=scrapes, progress=progress),
            "kill_loss": kill_loss(kills, progress=progress) if kills else None,
            "recovery": recovery_time(repeats, progress=progress) if repeats else None}


COLUMNS = ("processes", "files", "latency buckets", "on disk", "sample lines", "prometheus_client text",
           "routescope text", "÷ p_c", "routescope protobuf", "÷ p_c", "merged totals",
           "text, a series added", "first scrape")


def scrape_cells(r: dict[str, Any]) -> list[str]:
    """One scrape row as printed, in COLUMNS' order (each ratio is routescope's time over prometheus_client's)."""
    ms = lambda key, digits=1: f"{r[key] * 1e3:.{digits}f} ms"  # noqa: E731
    return [str(r["processes"]), str(r["files"]), "classic" if r["series"] == "classic" else "+native",
            f"{r['bytes_on_disk'] / 1e6:.1f} MB", str(r["samples"]), ms("prometheus_client_text_s"),
            ms("routescope_text_s"), f"{r['text_ratio']:.2f}", ms("routescope_protobuf_s"), f"{r['protobuf_ratio']:.2f}",
            ms("routescope_merged_totals_s"), ms("routescope_text_new_series_s"), ms("routescope_first_scrape_s", 0)]


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The lines under the table: calls lost per kill -9, time to recover a corrupt file."""
    lines = []
    k = result.get("kill_loss")
    if k:
        lines.append(f"kill -9 ({len(k['kills'])} kills, flush every {k['flush_interval_s']:g} s): calls lost median "
                     f"{k['lost_calls_median']:g}, max {k['lost_calls_max']:g}"
                     + ("" if k["lost_seconds_median"] is None else
                        f"; as seconds of that worker's calls: median {k['lost_seconds_median']:.2f} s, max "
                        f"{k['lost_seconds_max']:.2f} s")
                     + f"; kills that exported more calls than started: {k['exported_more_than_started']}")
    r = result.get("recovery")
    if r:
        n = r["repeats"]
        lines.append(f"corrupt live file to exact totals again: median {r['median_s']:.2f} s, max {r['max_s']:.2f} s "
                     f"over {n} corrupt file{'s' if n != 1 else ''} (the 'skipped corrupt file' warnings above are "
                     "these)")
    return lines


def render(result: dict[str, Any]) -> None:
    """The scrape table (classic and native files per process count), then the kill and recovery lines."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 200))
    table = Table(*COLUMNS)
    for r in result["scrape"]:
        table.add_row(*scrape_cells(r))
    console.print(table)
    console.print("÷ p_c: routescope's time over prometheus_client's text on the same files (under 1: routescope is "
                  "faster); medians over the scrapes, every process flushing new values before each; latency buckets "
                  "+native: the files hold the native buckets beside the classic ones")
    for line in summary_lines(result):
        console.print(line)
