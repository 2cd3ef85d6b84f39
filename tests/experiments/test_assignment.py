"""Assignment: the fraction lies within binomial bounds, and two processes with one config assign identically."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

from experiments.assignment import STREAM_ARM, Arm, assign, draw, group_base, mix64, stable_key, uniform

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
    assert 20 < first.count("b") < 75 and first.count("timed_a") > 20  # 5% of 900 eligible calls each
