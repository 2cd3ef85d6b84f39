"""`routescope bench serve`'s lines add up: requests over the run's seconds is the printed rate, p50 <= p99 <= max,
and the p99 over runs is each run's printed p99, in run order, a run with no answer named as such."""

from __future__ import annotations

import random
import re

from service.bench import Load, over_runs, render

LINE = re.compile(r"^  (.+?)\s+(\d+) requests  p50\s+([\d.]+) ms  p99\s+([\d.]+) ms  max\s+([\d.]+) ms\s+([\d.]+) req/s$")


def _load(seconds: float, seed: int, **counts: int) -> Load:
    rng = random.Random(seed)
    return Load(seconds=seconds, latencies={name.replace("_", "/", 1): [rng.lognormvariate(-5, 1) for _ in range(n)]
                                            for name, n in counts.items()})


def test_each_endpoint_line_adds_up():
    load = _load(3.004, 1, _routing=1220, _metrics=210)
    lines = render(load, 4, None)
    assert lines[0] == "4 clients for 3.0 s; no demo"
    parsed = [LINE.match(line) for line in lines[1:]]
    assert all(parsed), lines
    for m in parsed:
        n, p50, p99, top, rate = int(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6])
        assert n == len(load.latencies[m[1]]) and p50 <= p99 <= top
        assert abs(rate - n / load.seconds) <= 0.05
        assert top == round(max(load.latencies[m[1]]) * 1e3, 1)


def test_the_p99_over_runs_is_each_runs_printed_p99():
    runs = [_load(2.0, 2, _routing=300, _metrics=40), _load(2.0, 3, _routing=250, _metrics=0)]
    printed = [{m[1]: m[4] for line in render(load, 2, None)[1:] if (m := LINE.match(line))} for load in runs]
    lines = {line.split(" p99 over runs: ")[0].strip(): line.split(" p99 over runs: ")[1] for line in over_runs(runs)}
    assert lines["/routing"] == f"{printed[0]['/routing']} ms, {printed[1]['/routing']} ms"
    assert lines["/metrics"] == f"{printed[0]['/metrics']} ms, none"  # run 2 had no /metrics answer: said, not dropped


def test_a_url_that_cannot_be_loaded_is_refused_before_any_load():
    import socket

    from typer.testing import CliRunner

    from routescope.cli import build_app

    with socket.socket() as s:  # a free loopback port, nothing listening on it once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url, said in ((f"http://127.0.0.1:{port}", "no answer ("), ("https://127.0.0.1:9475", "give the http URL"),
                      ("localhost:9475", "give the http URL")):
        res = CliRunner().invoke(build_app(), ["bench", "serve", "--url", url, "--seconds", "1"])
        assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
        assert res.output.startswith(f"routescope bench serve: --url {url}: {said}"), res.output
