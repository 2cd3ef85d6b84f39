"""Assignment: the fraction lies within binomial bounds, and two processes with one config assign identically."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

from experiments.assignment import (B, STREAM_ARM, TIMED_A, Arm, GroupPicks, Schedule, assign, draw, group_base, mix64,
                                    picks, stable_key, uniform)

ROOT = Path(__file__).resolve().parents[2]


def test_fraction_within_binomial_bounds_and_timed_a_matches_b():
    n = 200_000
    for f in (0.01, 0.05, 0.1):
        arms = [assign(7, f, stable_key("cell"), i) for i in range(n)]
        b, timed = arms.count(Arm.B), arms.count(Arm.TIMED_A)
        sd = math.sqrt(n * f * (1 - f))
        assert abs(b - n * f) < 4.5 * sd, (f, b)  # 4.5 sigma: a false alarm once in ~150,000 runs
        assert abs(timed - n * f) < 4.5 * sd, (f, timed)


def test_draw_is_pure_and_seed_sensitive():
    key = stable_key("m|2-3|...")
    assert [draw(3, key, i) for i in range(50)] == [draw(3, key, i) for i in range(50)]
    assert [draw(3, key, i) for i in range(50)] != [draw(4, key, i) for i in range(50)]
    assert mix64(group_base(3, key) ^ 17) / float(1 << 64) == draw(3, key, 17)  # the call path's shortcut
    assert uniform(3, STREAM_ARM, key, 17) == draw(3, key, 17)
    import zlib

    assert stable_key("cell") == zlib.crc32(b"cell")  # no per-process salt


KIND = {Arm.B: B, Arm.TIMED_A: TIMED_A, Arm.A: 0}


def _fractions(seed: int, key: int) -> list[float]:
    """The usual fractions, and two that equal a draw exactly (its call lies on a bound: the exact path decides)."""
    return [0.01, 0.05, 0.1, draw(seed, key, 123), draw(seed, key, 77) / 2.0]


def test_picks_in_a_batch_equal_the_per_call_draws_across_chunk_boundaries():
    for seed in (7, 11):
        key = stable_key("m|2-3|cell")
        base = group_base(seed, key)
        for f in _fractions(seed, key):
            expected = [(i, KIND[assign(seed, f, key, i)]) for i in range(6000) if assign(seed, f, key, i) is not Arm.A]
            indices, kinds = picks(base, f, 0, 6000)
            assert list(zip(indices, kinds)) == expected, f
            assert list(zip(*picks(base, f, 2500, 1000))) == [p for p in expected if 2500 <= p[0] < 3500]
            schedule, seen = Schedule(base, f, chunk=97), []  # 61 chunk boundaries
            for i in range(6000):
                if i == schedule.next:
                    kind = schedule.take(i)
                    if kind:
                        seen.append((i, kind))
            assert seen == expected, f


def test_group_picks_equal_the_per_call_draws_past_their_batch():
    for seed in (3, 8):
        for f in _fractions(seed, 5):
            groups = GroupPicks(seed, f, span=5, width=8)  # 5 groups a batch, 8 indices: both edges crossed
            for g in [*range(0, 23), 40, 41, 7]:  # on, then a jump, then back
                for i in range(20):
                    kinds = groups.group(g)
                    kind = kinds.get(i, 0) if i < groups.width else groups.kind(g, i)
                    assert kind == KIND[assign(seed, f, g, i)], (seed, f, g, i)
            assert groups.width >= 16  # indices past the first width widened the next batch


def test_the_experiment_picks_what_the_draws_say_at_every_count_and_position():
    from dispatcher import CallClass, CallShape, what_if
    from dispatcher.policy import DecisionCache, Policy
    from dispatcher.types import Batch
    from experiments import ExperimentConfig
    from experiments.runtime import Experiment

    platform, policy = what_if("cpu"), Policy()
    decision = DecisionCache(platform, policy).decide(CallShape(8), CallClass.PREFILL)
    for position in (False, True):
        exp = Experiment(ExperimentConfig(id="picks", candidate="split_below_64", fraction=0.05, seed=5,
                                          harm_bound=1.0, budget=1.0), platform, policy)
        calls = [(s, i) for s in range(3, 103) for i in range(0, 90, 1 + s % 3)] if position else range(9000)
        got = []
        for at in calls:
            arm = exp.choose(decision, CallShape(8), Batch(CallClass.PREFILL), "m", _CpuQ, at if position else None)
            got.append(0 if arm is None else B if arm.is_b else TIMED_A)
        (cell,) = exp.cells.values()
        want = [KIND[assign(5, 0.05, *(at if position else (cell.key, at)))] for at in calls]
        assert got == want  # 9,000 counts cross two of the cell's 4,096-call chunks
        assert cell.calls_b == got.count(B) and cell.calls_a == len(got) - got.count(B)


class _CpuQ:
    is_cuda = False


PROGRAM = textwrap.dedent("""
    import json, sys
    from experiments import ExperimentConfig, Registry
    from tests.experiments.helpers import call_args, cpu_dispatcher
    d = cpu_dispatcher()
    reg = Registry(d.platform, d.policy)
    reg.attach(d)
    exp = reg.start(ExperimentConfig(id="twin", candidate="split_below_64", fraction=0.05, seed=11,
                                     harm_bound=1.0, budget=1.0))
    seen = []
    choose = exp.choose
    def spy(decision, shape, batch, model, q, position=None):
        arm = choose(decision, shape, batch, model, q, position)
        seen.append(None if arm is None else ("b" if arm.is_b else "timed_a"))
        return arm
    exp.choose = spy
    for i in range(900):
        d(*call_args([2, 8, 40][i % 3], seed=0), model="m")
    exp.choose = choose  # and by position, as the vLLM plugin passes (step, call in step)
    from dispatcher.types import Batch, CallClass, CallShape
    shape, batch, q = CallShape(8), Batch(CallClass.PREFILL), call_args(8, seed=0)[0]
    decision = d.decide(shape, batch)
    for step in range(200):
        for index in range(70):
            arm = exp.choose(decision, shape, batch, "m", q, (step, index))
            seen.append(None if arm is None else ("b" if arm.is_b else "timed_a"))
    print(json.dumps(seen))
""")


def test_two_processes_with_one_config_assign_identically():
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": str(seed), "PATH": "/usr/bin:/bin"})
             for seed in (1, 2)]  # at once, with different string-hash salts: the assignment must not use them
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    first, second = (json.loads(out) for out, _ in outs)
    assert first == second
    by_position = first[900:]
    assert 20 < first[:900].count("b") < 75 and first[:900].count("timed_a") > 20  # 5% of 900 eligible calls each
    assert by_position == [{Arm.A: None, Arm.B: "b", Arm.TIMED_A: "timed_a"}[assign(11, 0.05, step, index)]
                           for step in range(200) for index in range(70)]


def test_a_route_is_worked_out_once_per_decision_rows_bucket_and_model():
    """The call path looks a call up by its exact rows; a rows value first seen reuses its bucket's route, and calls
    the arms route alike are kept as such (not worked out again per call)."""
    from dispatcher import CallClass, CallShape, what_if
    from dispatcher.policy import DecisionCache, Policy
    from dispatcher.types import Batch
    from experiments import ExperimentConfig
    from experiments.runtime import Experiment

    platform, policy = what_if("cpu"), Policy()
    cache = DecisionCache(platform, policy)
    exp = Experiment(ExperimentConfig(id="routes", candidate="split_below_64", fraction=0.05), platform, policy)
    worked = []
    new_route = exp._new_route
    exp._new_route = lambda *a: worked.append(a[3]) or new_route(*a)
    for rows in (8, 9, 8, 9, 100, 101, 100, 200, 8):  # 8-15 eligible; 64-127 and 128-255 not (split below 64)
        exp.choose(cache.decide(CallShape(rows), CallClass.PREFILL), CallShape(rows), Batch(CallClass.PREFILL), "m",
                   _CpuQ)
    assert len(worked) == 3  # one per rows bucket
    assert exp.ineligible == 4 and sum(c.seen for c in exp.cells.values()) == 5
