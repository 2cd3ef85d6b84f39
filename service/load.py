"""The load `routescope bench serve` puts on a server: closed-loop clients, and the server and writers it starts.

Each client is a thread with one keep-alive connection that asks again as soon as an answer arrives, cycling through
its endpoints (a path and an Accept header), so the server is saturated: the figures are the worst a page or a
scraper meets, not what one Prometheus scraping once a second sees. Standard library only (``http.client``), so the
clients cost the machine as little as a Python client can.

Without a URL the bench starts what it measures (``served``): a real ``routescope serve --demo`` on a free loopback
port, over a multiprocess directory that ``writers`` real processes (``telemetry.bench.load_writer``: a real
Telemetry each, calling and flushing every second) write into, or over no directory (``writers`` 0: the demo's
own registry). The writers (``writing``) and the server (``serving``) start apart, so one directory can be loaded
through servers of two checkouts in turn (``routescope bench serve --against DIR``: before and after in one run).
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = "text/plain; version=0.0.4"  # what a classic Prometheus (and vLLM's /metrics) speaks
PROTOBUF = ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited;q=0.7,"
            "text/plain;version=0.0.4;q=0.3")  # Prometheus with --enable-feature=native-histograms
LISTENING = re.compile(rb"listening on (\S+):(\d+)")


@dataclass(frozen=True)
class Endpoint:
    """What a client asks for: a name for the figures, a path, an Accept header (None: none sent)."""

    name: str
    path: str
    accept: str | None = None


METRICS_TEXT = Endpoint("/metrics text", "/metrics", TEXT)
METRICS_PROTOBUF = Endpoint("/metrics protobuf", "/metrics", PROTOBUF)
ROUTING = Endpoint("/routing", "/routing")


def scrapers(clients: int) -> list[tuple[Endpoint, ...]]:
    """The default mix: odd clients poll /routing, even ones scrape /metrics, text and protobuf in turn."""
    return [(ROUTING,) if i % 2 else (METRICS_TEXT, METRICS_PROTOBUF) for i in range(clients)]


@dataclass
class Load:
    """What the clients saw: seconds per answered request, per endpoint name, and every failure."""

    seconds: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def run_clients(host: str, port: int, plan: Sequence[Sequence[Endpoint]], *, seconds: float,
                timeout: float = 30.0) -> Load:
    """One thread per entry of ``plan``, each cycling through its endpoints on one keep-alive connection."""
    if not plan or seconds <= 0 or not all(plan):
        raise ValueError("need at least one client with an endpoint and a positive duration")
    load = Load(latencies={e.name: [] for client in plan for e in client})
    lock, stop = threading.Lock(), threading.Event()

    def client(endpoints: Sequence[Endpoint]) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        mine: dict[str, list[float]] = {e.name: [] for e in endpoints}
        n = 0
        try:
            while not stop.is_set():
                e = endpoints[n % len(endpoints)]
                n += 1
                start = time.perf_counter()
                try:
                    conn.request("GET", e.path, headers={"Accept": e.accept} if e.accept else {})
                    reply = conn.getresponse()
                    reply.read()
                except (OSError, http.client.HTTPException) as exc:
                    with lock:
                        load.failures.append(f"{e.name}: {exc!r}")
                    conn.close()
                    stop.wait(0.05)  # a server that is gone is not asked again in a tight loop
                    continue
                if reply.status != 200:
                    with lock:
                        load.failures.append(f"{e.name}: HTTP {reply.status}")
                    continue
                if not stop.is_set():
                    mine[e.name].append(time.perf_counter() - start)
        finally:
            conn.close()
            with lock:
                for name, xs in mine.items():
                    load.latencies[name].extend(xs)

    threads = [threading.Thread(target=client, args=(tuple(c),), daemon=True) for c in plan]
    began = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout + 5)
    load.seconds = time.monotonic() - began
    return load


def _clean_env(root: Path = ROOT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTESCOPE_", "OTEL_", "PROMETHEUS_MULTIPROC"))}
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    env["PYTHONPATH"] = os.pathsep.join([str(root), *kept])
    return env


def _ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/readyz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def _get(port: int, e: Endpoint) -> int:
    """One request; its size in bytes (0 when it failed)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", e.path, headers={"Accept": e.accept} if e.accept else {})
        body = conn.getresponse().read()
        conn.close()
        return len(body)
    except (OSError, http.client.HTTPException):
        return 0


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@contextmanager
def writing(writers: int, *, progress=None) -> Iterator[str | None]:
    """A multiprocess directory that ``writers`` real writer processes flush into (each ready after its first calls),
    or None for 0 writers; the writers stopped and the directory removed after."""
    say = progress or (lambda msg: None)
    if not writers:
        yield None
        return
    env = _clean_env()
    with tempfile.TemporaryDirectory(prefix="routescope-load-") as tmp:
        path = os.path.join(tmp, "mp")
        os.mkdir(path)
        procs: list[subprocess.Popen] = []
        try:
            for rank in range(writers):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "telemetry.bench.load_writer", "--dir", path, "--rank", str(rank)],
                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True))
            for rank, p in enumerate(procs):
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"writer {rank} exited {p.wait(timeout=30)} before it was ready")
            say(f"{writers} writer processes flushing into {path}")
            yield path
        finally:
            for p in procs:
                _stop(p)


@contextmanager
def serving(path: str | None, *, root: Path = ROOT, demo: bool = True, extra: Sequence[str] = (), progress=None,
            timeout_s: float = 180.0) -> Iterator[int]:
    """The port of ``routescope serve`` (from the checkout at ``root``) on a free loopback port, over ``path`` (None:
    no directory), after one warm-up request per endpoint; stopped after."""
    say = progress or (lambda msg: None)
    env = _clean_env(root)
    with tempfile.TemporaryDirectory(prefix="routescope-serve-") as tmp:
        log = Path(tmp) / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [sys.executable, "-c", "from routescope.cli import main; main()", "serve", "--port", "0",
                 "--log-level", "warning", *(("--demo",) if demo else ()),
                 *(("--multiproc-dir", path) if path else ()), *extra],
                cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"routescope serve exited {server.returncode}: "
                                       f"{log.read_text(errors='replace')[-2000:]}")
                m = LISTENING.search(log.read_bytes())
                if m and _ready(int(m.group(2))):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"routescope serve not ready within {timeout_s:.0f} s: "
                                       f"{log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.2)
            port = int(m.group(2))
            for e in (METRICS_TEXT, METRICS_PROTOBUF, ROUTING):  # the first read of every file is not the load's
                _get(port, e)
            say(f"routescope serve{' --demo' if demo else ''} from {root} ready on 127.0.0.1:{port}")
            yield port
        finally:
            _stop(server)


@contextmanager
def served(writers: int, *, demo: bool = True, extra: Sequence[str] = (), progress=None,
           timeout_s: float = 180.0) -> Iterator[tuple[int, str | None]]:
    """(port, directory or None): ``writing`` and ``serving`` together, this checkout's server."""
    with writing(writers, progress=progress) as path:
        with serving(path, demo=demo, extra=extra, progress=progress, timeout_s=timeout_s) as port:
            yield port, path
