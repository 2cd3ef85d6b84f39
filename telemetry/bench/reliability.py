"""`routescope bench multiproc`: what the multiprocess directory costs and loses.

* scrape cost: one /metrics exposition (routescope's collector, and prometheus_client's own as
  vLLM runs it) and one merged snapshot, over the files of 8, 64 and 256 processes (each the
  totals of the same real workload, written by the real writer; no process needs to run);
* calls lost per kill -9: real worker processes (``kill_worker``: real Dispatcher and torch
  kernels, Telemetry at its defaults) killed at random instants; lost = calls started minus
  calls in the files, also as seconds of that worker's calls;
* time to recover from a corrupt file: a live worker's counter file overwritten with garbage,
  then scraped every 10 ms until the totals are back to at least what they were.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from dispatcher import Dispatcher, Policy, what_if

from ..config import TelemetryConfig
from ..core import Telemetry
from ..multiproc.merge import totals_from_families
from ..multiproc.reader import multiprocess_registry
from ..multiproc.writer import MultiprocWriter
from .kill_worker import read_slot
from .workload import make_calls, noop_registry

ROOT = Path(__file__).resolve().parents[2]


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def scrape_cost(processes: tuple[int, ...] = (8, 64, 256), *, calls: int = 2000, repeats: int = 5) -> list[dict]:
    """Seconds per scrape over the files of N processes (rank label i each), and what those files weigh."""
    tel = Telemetry(TelemetryConfig(models=("glm", "dsv4"), flush_on_exit=False, log_first_decode_in_prefill=False),
                    platform=what_if("gfx942"),
                    policy=Policy())
    d = tel.instrument(Dispatcher(platform=what_if("gfx942"), policy=Policy(), registry=noop_registry()))
    for args, kw in make_calls(calls):
        d(*args, **kw)
    totals = tel.flush()
    tel.close()
    out = []
    for n in processes:
        with tempfile.TemporaryDirectory() as path:
            for i in range(n):
                w = MultiprocWriter(path, f"{os.getpid()}-{i:06x}")  # a live pid: nothing is compacted
                w.write(totals, str(i))
                w.close()
            size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
            text = generate_latest(multiprocess_registry(path))

            def prom_client(p: str = path) -> bytes:
                reg = CollectorRegistry()
                MultiProcessCollector(reg, path=p)
                return generate_latest(reg)

            out.append({
                "processes": n, "files": 3 * n, "bytes_on_disk": size, "exposition_bytes": len(text),
                "series": sum(1 for line in text.splitlines() if line and not line.startswith(b"#")),
                "routescope_metrics_s": _timed(lambda p=path: generate_latest(multiprocess_registry(p)), repeats),
                "prometheus_client_metrics_s": _timed(prom_client, repeats),
                "snapshot_merge_s": _timed(lambda p=path: totals_from_families(multiprocess_registry(p).collect()),
                                           repeats),
            })
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

    text = generate_latest(multiprocess_registry(str(path))).decode()
    return int(sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "routescope_calls_total" and s.labels.get("rank") == str(rank)))


def kill_loss(kills: int = 8, *, seed: int = 0, max_age_s: float = 4.0) -> dict[str, Any]:
    """Calls lost per kill -9 at a random instant (0.1 s to ``max_age_s`` after the worker's start)."""
    rng = random.Random(seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mp"
        path.mkdir()
        for k in range(kills):
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


def recovery_time(repeats: int = 5) -> dict[str, Any]:
    """Seconds from a live worker's counter file overwritten with garbage to totals back at (at least) their level."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mp"
        path.mkdir()
        p = _spawn(path, Path(tmp) / "slot", 0)
        try:
            time.sleep(1.5)
            for _ in range(repeats):
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


def run(*, kills: int = 8, repeats: int = 5, processes: tuple[int, ...] = (8, 64, 256)) -> dict[str, Any]:
    return {"scrape": scrape_cost(processes), "kill_loss": kill_loss(kills), "recovery": recovery_time(repeats)}
