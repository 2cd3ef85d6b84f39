"""`routescope bench serve --phases`: the CPU of each build phase over a real directory, printed and as JSON; and
`--against`'s refusals. The figures are not asserted against bounds (a shared machine), only that each phase was
measured and each format wrote what a scrape of that format holds."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from routescope.cli import build_app
from service.build_phases import measure, render
from telemetry.exposition.protobuf import decode_delimited

from ..reliability.test_liveness import eight_processes


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    path = tmp_path_factory.mktemp("phases")
    eight_processes(path)
    return path


def test_each_phase_is_measured_over_a_real_directory(directory):
    tmp_path = directory
    slept: list[float] = []
    result = measure(str(tmp_path), 3, pause_s=0.25, sleep=slept.append)
    phases = result["phases"]
    assert list(phases) == ["read and merge", "text 0.0.4", "protobuf", "OpenMetrics 2.0"]
    assert slept == [0.25] * 3 and result["reads"] == 3
    for p in phases.values():
        assert 0 < p["median_ms"] <= p["max_ms"] and p["first_ms"] > 0
    assert phases["text 0.0.4"]["bytes"] > phases["protobuf"]["bytes"] > 10_000
    lines = render(result)
    assert len(lines) == 5 and all(name in "\n".join(lines) for name in phases)


def test_the_measured_encodings_are_what_a_scrape_gets(directory):
    """The phases encode with the service's encoders: the protobuf one decodes to the directory's families."""
    tmp_path = directory
    from service.build_phases import FORMATS, _Read
    from telemetry.exposition import negotiate
    from telemetry.multiproc.reader import ReaderCache, multiprocess_registry

    families = list(multiprocess_registry(str(tmp_path), cache=ReaderCache()).collect())
    proto = negotiate(FORMATS["protobuf"])[0](_Read(families))
    assert {f.name for f in decode_delimited(proto)} >= {"routescope_calls_total", "routescope_call_duration_seconds"}


@pytest.mark.parametrize("args, words", [
    (["--phases", "2", "--writers", "0"], "--writers 1 or more"),
    (["--url", "http://127.0.0.1:1", "--against", "."], "leave out --url"),
])
def test_bench_serve_refuses_what_it_cannot_measure(args, words):
    res = CliRunner().invoke(build_app(), ["bench", "serve", *args])
    flat = " ".join(res.output.replace("│", " ").split())  # rich wraps the message in a box
    assert res.exit_code == 2 and words in flat, res.output
