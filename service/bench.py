"""`routescope bench serve`: closed-loop HTTP load on a running `routescope serve`, and the latency each path saw.

Each client is a thread with one keep-alive connection that asks for its path again as soon as an
answer arrives (a poller with no pause), so the server is saturated: the figures are the worst a
page or a scraper meets, not what one Prometheus scraping once a second sees. Standard library
only (``http.client``), so the clients cost the machine as little as a Python client can.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Optional

import typer

DEFAULT_PATHS = ("/metrics", "/routing")


@dataclass
class Load:
    """What the clients saw: seconds per answered request, per path, and every failure."""

    seconds: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of ``values`` (no interpolation: a p99 is a latency some request had)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(load: Load) -> list[dict]:
    """Per path: requests, p50, p99 and max in ms, requests per second."""
    rows = []
    for path, xs in load.latencies.items():
        if not xs:
            rows.append({"path": path, "requests": 0})
            continue
        rows.append({"path": path, "requests": len(xs), "p50_ms": quantile(xs, 0.5) * 1e3,
                     "p99_ms": quantile(xs, 0.99) * 1e3, "max_ms": max(xs) * 1e3,
                     "per_s": len(xs) / load.seconds if load.seconds else 0.0})
    return rows


def run_load(base: str, *, clients: int = 8, seconds: float = 20.0, paths: Sequence[str] = DEFAULT_PATHS,
             timeout: float = 30.0) -> Load:
    """``clients`` threads, client i on ``paths[i % len(paths)]``, each asking again at once, for ``seconds``."""
    if clients < 1 or seconds <= 0 or not paths:
        raise ValueError("need at least one client, one path and a positive duration")
    url = urllib.parse.urlsplit(base)
    load = Load(latencies={p: [] for p in paths})
    lock, stop = threading.Lock(), threading.Event()

    def client(path: str) -> None:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=timeout)
        mine: list[float] = []
        try:
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    conn.request("GET", path)
                    reply = conn.getresponse()
                    reply.read()
                except (OSError, http.client.HTTPException) as exc:
                    with lock:
                        load.failures.append(f"{path}: {exc!r}")
                    conn.close()
                    stop.wait(0.05)  # a server that is gone is not asked again in a tight loop
                    continue
                if reply.status != 200:
                    with lock:
                        load.failures.append(f"{path}: HTTP {reply.status}")
                    continue
                mine.append(time.perf_counter() - start)
        finally:
            conn.close()
            with lock:
                load.latencies[path].extend(mine)

    threads = [threading.Thread(target=client, args=(paths[i % len(paths)],), daemon=True) for i in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout + 5)
    load.seconds = time.monotonic() - began
    return load


def render(load: Load, clients: int, demo: dict | None = None) -> list[str]:
    """The lines `routescope bench serve` prints."""
    lines = [f"{clients} clients for {load.seconds:.1f} s"
             + (f"; demo {demo.get('state')}, {demo.get('prefill_calls', 0)} prefill-entry and "
                f"{demo.get('decode_path_calls', 0)} decode-entry calls so far" if demo else "; no demo")]
    for r in summary(load):
        if not r["requests"]:
            lines.append(f"  {r['path']:9s}     0 requests")
            continue
        lines.append(f"  {r['path']:9s} {r['requests']:5d} requests  p50 {r['p50_ms']:7.1f} ms  "
                     f"p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']:7.1f} ms  {r['per_s']:6.1f} req/s")
    if load.failures:
        lines.append(f"  {len(load.failures)} failed, first: {load.failures[0]}")
    return lines


def _demo(base: str) -> dict | None:
    """/routing's demo section after the load (None without a demo, or when the server no longer answers)."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=30)
    try:
        conn.request("GET", "/routing")
        return json.loads(conn.getresponse().read()).get("demo")
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def serve_bench_command(
    url: Annotated[str, typer.Option(help="a running `routescope serve` (start it with --demo for the usual figures)")],
    clients: Annotated[int, typer.Option(min=1, max=256, help="concurrent keep-alive clients")] = 8,
    seconds: Annotated[float, typer.Option(min=0.1, help="how long the clients run")] = 20.0,
    path: Annotated[Optional[list[str]], typer.Option("--path", help="a path to load (repeat); client i takes path "
                                                                   "i mod n")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
) -> None:
    """Closed-loop load on a running server: p50/p99/max per path (default: /metrics and /routing, half each)."""
    paths = tuple(path) if path else DEFAULT_PATHS
    load = run_load(url.rstrip("/"), clients=clients, seconds=seconds, paths=paths)
    demo = _demo(url.rstrip("/"))
    if as_json:
        typer.echo(json.dumps({"clients": clients, "seconds": load.seconds, "paths": summary(load),
                               "failures": load.failures[:20], "demo": demo}))
    else:
        for line in render(load, clients, demo):
            typer.echo(line)
    if load.failures:
        raise typer.Exit(1)
