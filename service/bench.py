"""`routescope bench serve`: closed-loop HTTP load on `routescope serve`, and the latency each endpoint saw.

One bench for both cases: a running server (``--url``), or one it starts itself (``service.load.served``): ``serve
--demo`` over a directory that ``--writers`` real processes flush into (default 8, as vLLM's TP ranks would), or
over no directory (``--writers 0``). Clients and endpoints: ``service.load``. Prints what it measured; asserts nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import math
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Optional

import typer

from .load import ROOT, Endpoint, Load, run_clients, scrapers, serving, writing

__all__ = ["Load", "quantile", "render", "run_load", "summary"]


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of ``values``: the sample at rank ceil(q * n), as `bench quantiles` takes it (no
    interpolation: a p99 is a latency some request had; of 100 requests, the 99th slowest, not the slowest)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


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


def run_load(base: str, *, clients: int = 8, seconds: float = 20.0, paths: Sequence[str] | None = None,
             timeout: float = 30.0) -> Load:
    """``clients`` threads for ``seconds``: client i on ``paths[i % len(paths)]``, or (no paths) the scrapers' mix,
    odd clients on /routing and even ones on /metrics, text and protobuf in turn."""
    if clients < 1 or (paths is not None and not paths):
        raise ValueError("need at least one client and one path")
    url = urllib.parse.urlsplit(base)
    plan = (scrapers(clients) if paths is None else
            [(Endpoint(paths[i % len(paths)], paths[i % len(paths)]),) for i in range(clients)])
    return run_clients(url.hostname or "127.0.0.1", url.port or 80, plan, seconds=seconds, timeout=timeout)


def render(load: Load, clients: int, demo: dict | None = None) -> list[str]:
    """The lines `routescope bench serve` prints."""
    lines = [f"{clients} clients for {load.seconds:.1f} s"
             + (f"; demo {demo.get('state')}, {demo.get('prefill_calls', 0)} prefill-entry and "
                f"{demo.get('decode_path_calls', 0)} decode-entry calls so far" if demo else "; no demo")]
    for r in summary(load):
        if not r["requests"]:
            lines.append(f"  {r['path']:17s}     0 requests")
            continue
        lines.append(f"  {r['path']:17s} {r['requests']:5d} requests  p50 {r['p50_ms']:7.1f} ms  "
                     f"p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']:7.1f} ms  {r['per_s']:6.1f} req/s")
    if load.failures:
        lines.append(f"  {len(load.failures)} failed, first: {load.failures[0]}")
    return lines


def unreachable(base: str) -> str | None:
    """Why ``base`` cannot be loaded (not an http URL, or no answer to /healthz), checked before any load; None: it
    answers."""
    url = urllib.parse.urlsplit(base)
    if url.scheme != "http" or not url.hostname:
        return "give the http URL of a running `routescope serve`, like http://127.0.0.1:9475"
    try:
        conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=10)
        try:
            conn.request("GET", "/healthz")
            status = conn.getresponse().status
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return f"no answer ({exc}); is `routescope serve` running there?"
    return None if status == 200 else f"/healthz answered HTTP {status}; is it a `routescope serve`?"


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
    url: Annotated[Optional[str], typer.Option(help="a running `routescope serve`; without it the bench starts "
                                                  "`serve --demo` itself over --writers processes' directory")] = None,
    writers: Annotated[int, typer.Option(min=0, max=64, help="without --url: real writer processes flushing into "
                                                             "the server's directory (0: no directory)")] = 8,
    clients: Annotated[int, typer.Option(min=1, max=256, help="concurrent keep-alive clients")] = 8,
    seconds: Annotated[float, typer.Option(min=0.1, help="how long the clients run, per run")] = 20.0,
    runs: Annotated[int, typer.Option(min=1, max=20, help="runs one after another on the same server")] = 1,
    path: Annotated[Optional[list[str]], typer.Option("--path", help="a path to load (repeat); client i takes path "
                                                                   "i mod n (default: odd clients /routing, even "
                                                                   "/metrics in text and protobuf by turns)")] = None,
    against: Annotated[Optional[Path], typer.Option(
        exists=True, file_okay=False, help="without --url: another checkout whose server takes turns with this "
                                           "tree's over the same writers, each run (before and after, side by side)")] = None,
    phases: Annotated[int, typer.Option(min=0, max=600, help="instead of the clients: this many reads of the "
                                                          "writers' directory here, the CPU of each build phase")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
) -> None:
    """Closed-loop load: p50/p99/max per endpoint, by default with 8 real writer processes beside the server."""
    paths = tuple(path) if path else None
    if url and against:
        raise typer.BadParameter("--against starts its own servers: leave out --url", param_hint="--against")
    if phases:
        _phases(writers, phases, as_json)
        return

    loads: list[tuple[float, float, float]] = []  # the machine's load average as each run started

    def one_run(base: str) -> tuple[Load, dict | None]:
        loads.append(os.getloadavg())
        load = run_load(base, clients=clients, seconds=seconds, paths=paths)
        return load, _demo(base)

    results: list[tuple[Load, dict | None]] = []
    trees: list[str] = []
    if url:
        why = unreachable(url)
        if why:
            typer.echo(f"routescope bench serve: --url {url}: {why}", err=True)
            raise typer.Exit(2)
        results = [one_run(url.rstrip("/")) for _ in range(runs)]
        trees = [url] * runs
        setting = {"url": url}
    else:
        progress = (lambda msg: None) if as_json else (lambda msg: typer.echo(f"bench serve: {msg}", err=True))
        roots = [ROOT] if against is None else [ROOT, against.resolve()]
        with writing(writers, progress=progress) as directory:
            if against is None:
                with serving(directory, progress=progress) as port:
                    results = [one_run(f"http://127.0.0.1:{port}") for _ in range(runs)]
                trees = [str(ROOT)] * runs
            else:
                for _ in range(runs):
                    for root in roots:
                        with serving(directory, root=root, progress=progress) as port:
                            results.append(one_run(f"http://127.0.0.1:{port}"))
                        trees.append(str(root))
        setting = {"writers": writers, "server": "routescope serve --demo"
                   + (f" --multiproc-dir (with {writers} writer processes)" if writers else "")}
    failed = any(load.failures for load, _ in results)
    if as_json:
        out = [{"seconds": load.seconds, "paths": summary(load), "failures": load.failures[:20], "demo": demo,
                "load_average": list(loads[i]),
                **({"tree": trees[i]} if against is not None else {})} for i, (load, demo) in enumerate(results)]
        doc = {"clients": clients, **setting, "runs": out}
        if len(out) == 1:
            doc.update(out[0])
        typer.echo(json.dumps(doc))
    else:
        typer.echo(f"{setting.get('server', setting.get('url'))}")
        for i, (load, demo) in enumerate(results):
            if against is not None:
                typer.echo(f"run {i // 2 + 1} of {runs}, server from {trees[i]} (load average {loads[i][0]:.1f}):")
            elif runs > 1:
                typer.echo(f"run {i + 1} of {runs} (load average {loads[i][0]:.1f}):")
            for line in render(load, clients, demo):
                typer.echo(line)
        for tree in dict.fromkeys(trees) if against is not None else [None]:
            mine = [load for (load, _), t in zip(results, trees) if tree is None or t == tree]
            if len(mine) < 2:
                continue
            if tree is not None:
                typer.echo(f"server from {tree}:")
            for line in over_runs(mine):
                typer.echo(line)
    if failed:
        raise typer.Exit(1)


def over_runs(loads: Sequence[Load]) -> list[str]:
    """Each endpoint's p99 in every run, in run order ("none" for a run in which it had no answer)."""
    names = dict.fromkeys(name for load in loads for name in load.latencies)
    return [f"  {name:17s} p99 over runs: "
            + ", ".join("none" if (v := summary_of(load, name)) is None else f"{v:.1f} ms" for load in loads)
            for name in names]


def summary_of(load: Load, name: str) -> float | None:
    """p99 in ms of one endpoint of a run (None: no answers)."""
    xs = load.latencies.get(name) or []
    return quantile(xs, 0.99) * 1e3 if xs else None


def _phases(writers: int, reads: int, as_json: bool) -> None:
    """``--phases``: the build's CPU per phase over the writers' directory (service.build_phases)."""
    from .build_phases import measure
    from .build_phases import render as render_phases

    if not writers:
        raise typer.BadParameter("--phases reads the writers' directory: give --writers 1 or more",
                                 param_hint="--phases")
    progress = (lambda msg: None) if as_json else (lambda msg: typer.echo(f"bench serve: {msg}", err=True))
    with writing(writers, progress=progress) as directory:
        result = measure(directory, reads)
    result["writers"] = writers
    if as_json:
        typer.echo(json.dumps(result))
        return
    typer.echo(f"{writers} writer processes' directory")
    for line in render_phases(result):
        typer.echo(line)
