"""Kill -9 loses at most the calls since the victim's last flush (1 s by default) and never counts one twice;
SIGTERM and a normal exit lose nothing; the host's own SIGTERM behaviour is kept.

Real worker processes (``telemetry/bench/kill_worker.py``: a real Dispatcher with the torch kernels and a real
Telemetry with its defaults) share one multiprocess directory with the test; each counts the calls
it starts in a mapped file that survives the kill.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from telemetry import exithooks
from telemetry.config import TelemetryConfig

from .conftest import ROOT, calls_in, latency_in, make_tel
from telemetry.bench.kill_worker import read_slot

INTERVAL = TelemetryConfig().flush_interval_s
WINDOW = INTERVAL + 0.5  # the documented loss: one flush interval, plus a flush's own time and scheduling slack


def spawn(tmp: Path, rank: int, *extra: str) -> tuple[subprocess.Popen, str]:
    slot = str(tmp / f"slot{rank}")
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    p = subprocess.Popen([sys.executable, "-m", "telemetry.bench.kill_worker", "--dir", str(tmp / "mp"), "--slot", slot,
                          "--rank", str(rank), *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    return p, slot


def ready(p: subprocess.Popen) -> None:
    line = p.stdout.readline()  # type: ignore[union-attr]
    assert line.strip() == "ready", (line, p.poll(), p.stderr.read() if p.poll() is not None else "")  # type: ignore[union-attr]


def exported(tmp: Path, rank: int) -> int:
    return int(calls_in(tmp / "mp", rank=str(rank)))


def started_before(marks: list[tuple[float, int]], t: float) -> int:
    """Calls started by time ``t``, from the worker's checkpoints (0 before the first)."""
    return max((n for ts, n in marks if ts <= t), default=0)


def test_kill9_loses_at_most_one_flush_interval_and_never_doubles(tmp_path):
    (tmp_path / "mp").mkdir()
    rng = random.Random(43)
    delays = [0.1, 0.7, 1.4, 2.1, 2.8]  # before the first flush, between flushes, after several
    procs = [(rank, *spawn(tmp_path, rank), delay) for rank, delay in enumerate(delays)]
    for _rank, p, _slot, _delay in procs:
        ready(p)
    t0 = time.monotonic()
    report = []
    for rank, p, slot, delay in procs:
        time.sleep(max(0.0, t0 + delay + rng.uniform(0, 0.2) - time.monotonic()))
        t_kill = time.monotonic()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        report.append((rank, slot, t_kill))
    reader = make_tel(str(tmp_path / "mp"), flush_on_exit=False)  # compacts the dead workers' files
    try:
        lines = []
        timed = 0
        for rank, slot, t_kill in report:
            started, marks = read_slot(slot)
            got = exported(tmp_path, rank)
            bound = started - started_before(marks, t_kill - WINDOW)
            lines.append(f"rank {rank}: started {started}, exported {got}, lost {started - got} (bound {bound})")
            assert got <= started, lines[-1]  # never more than was called
            assert started - got <= bound, lines[-1]
            assert started > 0
            classic, native = latency_in(tmp_path / "mp", rank=str(rank))
            assert native == classic, (rank, classic, native)  # the native buckets lose what the classic lose
            timed += classic
        print("\n".join(lines))
        assert sum(exported(tmp_path, r) for r, _s, _t in report) > 0 and timed > 0  # the flushes did land
    finally:
        reader.close()


def test_sigterm_and_normal_exit_lose_nothing(tmp_path):
    (tmp_path / "mp").mkdir()
    plain, s0 = spawn(tmp_path, 0)
    host, s1 = spawn(tmp_path, 1, "--host", "handler")
    exits, s2 = spawn(tmp_path, 2, "--calls", "300")
    deaf, _s3 = spawn(tmp_path, 3, "--host", "ignore")
    for p in (plain, host, deaf):
        ready(p)
    time.sleep(0.4)  # before the first background flush: only the SIGTERM flush can save these calls
    for p in (plain, host, deaf):
        p.send_signal(signal.SIGTERM)
    assert plain.wait(timeout=30) == -signal.SIGTERM  # dies of SIGTERM, as without telemetry
    assert host.wait(timeout=30) == 3 and "host handler ran" in host.stderr.read()  # type: ignore[union-attr]
    assert exits.wait(timeout=60) == 0
    assert deaf.poll() is None  # a host that ignores SIGTERM still does
    deaf.kill()
    deaf.wait(timeout=30)
    for rank, slot in ((0, s0), (1, s1)):
        started, _ = read_slot(slot)
        assert started > 0 and started - 1 <= exported(tmp_path, rank) <= started  # at most the call in flight
    assert exported(tmp_path, 2) == 300 == read_slot(s2)[0]  # flushed (and compacted) at exit
    for rank in (0, 1, 2):
        classic, native = latency_in(tmp_path / "mp", rank=str(rank))
        assert native == classic > 0, (rank, classic, native)


def test_no_handler_from_another_thread(monkeypatch):
    """Python allows signal handlers from the main thread only: from another, telemetry installs none."""
    monkeypatch.setattr(exithooks, "_installed", {"atexit": True, "sigterm": False})
    monkeypatch.setattr(exithooks, "_previous", [])
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        made = []
        t = threading.Thread(target=lambda: made.append(make_tel(None)))
        t.start()
        t.join()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        made.append(make_tel(None))
        assert signal.getsignal(signal.SIGTERM) is exithooks._on_sigterm
        assert exithooks._previous == [signal.SIG_DFL]
        for tel in made:
            tel.close()
    finally:
        signal.signal(signal.SIGTERM, before)
