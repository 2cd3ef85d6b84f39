"""`routescope bench multiproc --load`: /metrics and /routing latency under concurrent scrapers while the demo runs.

A real ``routescope serve --demo --multiproc-dir DIR`` on a free loopback port (or, with no other processes, ``serve
--demo`` alone), beside N other live processes' files in DIR (the real writer, the workload's totals, values
rewritten every second as their flushes would). ``clients`` threads scrape for ``seconds``: half /routing, half
/metrics (alternately the text exposition and the protobuf one with native buckets, as Prometheus with native
histograms asks). Prints what it measured; asserts nothing.
"""

from __future__ import annotations

import http.client
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..multiproc.writer import MultiprocWriter
from .reliability import PROTOBUF, TEXT, scaled, workload_totals

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(rb"listening on (\S+):(\d+)")


def _serve(path: str | None, log: Path) -> tuple[subprocess.Popen, int]:
    """``routescope serve --demo`` on a free loopback port (over ``path`` when given), once /readyz answers 200."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTESCOPE_", "OTEL_", "PROMETHEUS_MULTIPROC"))}
    with log.open("wb") as out:
        p = subprocess.Popen([sys.executable, "-c", "from routescope.cli import main; main()", "serve", "--demo",
                              "--port", "0", "--log-level", "warning", *(("--multiproc-dir", path) if path else ())],
                             cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"routescope serve exited {p.returncode}: {log.read_text(errors='replace')[-2000:]}")
        m = LISTENING.search(log.read_bytes())
        if m and _get(int(m.group(2)), "/readyz")[0] == 200:
            return p, int(m.group(2))
        time.sleep(0.2)
    p.kill()
    p.wait(timeout=30)
    raise RuntimeError(f"routescope serve not ready within 120 s: {log.read_text(errors='replace')[-2000:]}")


def _get(port: int, path: str, accept: str | None = None) -> tuple[int, int]:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", path, headers={"Accept": accept} if accept else {})
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, len(body)
    except OSError:
        return 0, 0


def _summary(times: list[float]) -> dict[str, Any]:
    xs = sorted(times)
    q = (lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]) if xs else (lambda f: None)
    return {"requests": len(xs), "p50_s": q(0.5), "p99_s": q(0.99), "max_s": xs[-1] if xs else None,
            "mean_s": statistics.fmean(xs) if xs else None}


def run(*, clients: int = 8, seconds: float = 20.0, processes: int = 8, calls: int = 2000) -> dict[str, Any]:
    """p50/p99 per endpoint under ``clients`` concurrent scrapers for ``seconds``, with ``processes`` other
    processes' files in the directory and the demo calling in the server (``processes`` 0: no directory, the
    demo's single-process registry)."""
    totals = workload_totals(calls)
    lat: dict[str, list[float]] = {"/metrics text": [], "/metrics protobuf": [], "/routing": []}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="routescope-load-") as tmp:
        path = os.path.join(tmp, "mp")
        os.mkdir(path)
        writers = [MultiprocWriter(path, f"{os.getpid()}-{i:06x}") for i in range(processes)]
        stop = threading.Event()

        def flushes() -> None:  # every other process flushes once a second: every value moves, no series added
            k = 1
            while not stop.is_set():
                now = scaled(totals, k)
                for i, w in enumerate(writers):
                    w.write(now, str(i))
                k += 1
                stop.wait(1.0)

        flusher = threading.Thread(target=flushes, daemon=True)
        flusher.start()
        server, port = _serve(path if processes else None, Path(tmp) / "serve.log")
        try:
            def client(i: int) -> None:
                routing = i % 2 == 1
                n = 0
                while not stop.is_set():
                    if routing:
                        name, accept = "/routing", None
                    else:
                        name, accept = ("/metrics text", TEXT) if n % 2 == 0 else ("/metrics protobuf", PROTOBUF)
                    t0 = time.perf_counter()
                    status, _size = _get(port, name.split()[0], accept)
                    dt = time.perf_counter() - t0
                    if status != 200:
                        failed.append(f"{name}: {status}")
                    elif not stop.is_set():
                        lat[name].append(dt)
                    n += 1

            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join(timeout=60)
        finally:
            stop.set()
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=30)
            flusher.join(timeout=30)
            for w in writers:
                w.close()
    out = {name: _summary(ts) for name, ts in lat.items()}
    out["/metrics"] = _summary(lat["/metrics text"] + lat["/metrics protobuf"])
    return {"clients": clients, "seconds": seconds, "processes": processes, "failed": len(failed),
            "endpoints": out}
