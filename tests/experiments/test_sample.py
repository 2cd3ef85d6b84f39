"""The bench's thinned stream (experiments/sample.py): which calls it keeps, and that it is one stream whatever
the machine's cores."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from experiments.sample import segment, stream, thinned
from workloads.traffic import traffic


def test_a_segment_keeps_every_call_in_the_range_and_one_in_thin_of_the_others():
    size = 150_000
    kept, generated = segment(11, 255, 32, 20, size, keep_below=64)
    assert generated == size
    every = [c for c in itertools.islice(traffic(11, glm_bug=True), size) if c.entry == "prefill" and c.rows <= 255]
    inside = [c for c in every if 32 <= c.rows < 64]
    outside = [c for c in every if not 32 <= c.rows < 64]
    assert [c for c in kept if 32 <= c.rows < 64] == inside
    assert [c for c in kept if not 32 <= c.rows < 64] == outside[::20]  # the first, the 20th after it, ...
    assert all(c.entry == "prefill" and c.rows <= 255 for c in kept)


def test_thinned_is_the_same_stream_on_one_worker_or_two_and_stops_at_calls():
    one, g1 = thinned(2500, seed=3, max_rows=255, keep_rows=32, thin=50, workers=1, size=100_000)
    two, g2 = thinned(2500, seed=3, max_rows=255, keep_rows=32, thin=50, workers=2, size=100_000)
    assert one == two and len(one) == 2500 and g1 == g2
    first, _ = segment(3, 255, 32, 50, 100_000)
    assert one[: len(first)] == first  # segment seeds in order from the given seed
    rows = Counter(c.rows >= 32 for c in one)
    assert rows[True] > rows[False] / 10  # 32+ rows hold 2-3% of the traffic; kept whole they are far more


def test_thin_one_is_the_plain_stream_and_bad_arguments_are_refused():
    assert stream(100, seed=7, max_rows=255) == list(itertools.islice(
        (c for c in traffic(7, glm_bug=True) if c.entry == "prefill" and c.rows <= 255), 100))
    with pytest.raises(ValueError, match="thin"):
        thinned(10, seed=1, max_rows=255, keep_rows=32, thin=0)
    with pytest.raises(ValueError, match="calls"):
        thinned(0, seed=1, max_rows=255, keep_rows=32, thin=2)


def test_bench_experiment_refuses_a_thinning_that_would_split_a_rows_bucket():
    import typer
    from typer.testing import CliRunner

    from experiments.bench import experiment_command

    app = typer.Typer()
    app.command()(experiment_command)
    runner = CliRunner()
    for argv, name in ((["--thin", "0"], "--thin"), (["--thin", "10", "--keep-rows", "33"], "--keep-rows"),
                       (["--thin", "10", "--keep-rows", "32", "--keep-below", "48"], "--keep-below"),
                       (["--thin", "10", "--keep-rows", "64", "--keep-below", "32"], "--keep-below")):
        res = runner.invoke(app, argv)
        assert res.exit_code == 2 and name in res.output, (argv, res.output)
