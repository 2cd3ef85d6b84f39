"""The sweep's kv pool dimension, its defaults and its provenance: every power of two of rows, three pools shared by
each point's inputs, one document with a summary per pool, and the commit of the tree it runs from or none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from advise.tables import table_from_sweep
from dispatcher.sweep import inputs
from dispatcher.sweep.grid import (
    GPU_POOLS, GPU_ROWS, GPU_TOPK, DEFAULT_LAYOUTS, KernelSpec, Layout, SweepArgError, parse_pools, pool_slots,
)
from dispatcher.sweep.cli import build_plan, replay_command
from dispatcher.sweep.inputs import make_pool, make_sets, topk_indices
from dispatcher.sweep.pooled import by_pool, pool_sentence, pooled_document, pooled_markdown
from dispatcher.sweep.provenance import COMMIT_ENV, check_commit, git_commit, sweep_commit
from dispatcher.sweep.runner import SweepPlan, run_sweep
from dispatcher.types import Kernel
from routescope.cli import build_app

ROOT = Path(__file__).resolve().parents[2]
H200_L2 = 60 << 20


def test_the_gpu_defaults_cover_what_advise_prices():
    assert GPU_ROWS == tuple(2 ** i for i in range(15))  # 1 ... 16384, no step over 2x
    assert GPU_TOPK == (128, 512, 2048) and DEFAULT_LAYOUTS == ("448+64", "512+0")
    l2, hbm, serving = GPU_POOLS
    assert l2 < H200_L2 and hbm >= 4 * H200_L2 and serving >= 1 << 30


def test_the_gpu_replay_command_spells_out_the_pools():
    plan = SweepPlan(kernels=(KernelSpec(Kernel.INTREE_RAGGED_PREFILL), KernelSpec(Kernel.INTREE_SPARSE_DECODE)),
                     rows=GPU_ROWS, topk=GPU_TOPK, layouts=(Layout(448, 64), Layout(512, 0)),
                     device=torch.device("cuda"), timer="cupti", pools=GPU_POOLS)
    cmd = replay_command(plan, Path("out/sweep"))
    assert "--kv-pool 8MiB,256MiB,4GiB --no-flush-l2" in cmd and "--rows 1,2,4,8,16,32,64,128" in cmd
    assert plan.points == 15 * 3 * 2 * 3 and not plan.flushes


def test_pool_sizes_parse_and_bad_ones_are_named():
    assert parse_pools("256MiB, 8MiB,8MiB") == (8 << 20, 256 << 20)
    for bad in ("", "8MB/s", "0"):
        with pytest.raises(SweepArgError, match="--kv-pool"):
            parse_pools(bad)
    with pytest.raises(SweepArgError, match="--kv-len and --kv-pool"):
        build_plan(kernels=None, rows="1", topk="8", layout="glm", device="cpu", dtype="float32", heads=2,
                   repeats=1, warmup=0, kv_len=64, kv_pool="1MiB")
    assert pool_slots(8 << 20, Layout(448, 64), 2) == 8192 and pool_slots(1, Layout(448, 64), 2) == 1


def test_sets_over_a_shared_pool_differ_in_indices_only():
    layout = Layout(48, 16)
    pool = make_pool(4096, layout.head_dim, dtype=torch.float32, device=torch.device("cpu"))
    sets = make_sets(4, 64, 2, layout, 4096, dtype=torch.float32, device=torch.device("cpu"), pool=pool)
    assert all(s.kv is pool for s in sets)
    n = inputs.shared_sets(2, 2048, 16, Layout(448, 64), 8192, 2, 2)
    assert 1 < n <= inputs.MAX_SHARED_SETS  # a 2-row call gathers little: many sets cycle before one comes back


def test_past_the_exact_limit_indices_are_strided_distinct_and_spread(monkeypatch):
    monkeypatch.setattr(inputs, "EXACT_SLOTS", 1000)
    gen = torch.Generator().manual_seed(1)
    idx = topk_indices(64, 128, 100_000, torch.device("cpu"), gen)
    assert idx.shape == (64, 128) and idx.dtype == torch.int32
    assert int(idx.min()) >= 0 and int(idx.max()) < 100_000
    for row in idx:
        assert len(set(row.tolist())) == 128  # distinct within a row
    assert int(idx.max()) > 90_000 and int(idx.min()) < 10_000  # over the whole pool
    assert not torch.equal(idx[0], idx[0].sort().values)  # in random order, as a top-k's would be


def test_a_pooled_sweep_summarises_each_pool_and_loads_as_a_table_keyed_by_pool(tmp_path):
    plan = build_plan(kernels=None, rows="1,2,4", topk="8", layout="glm", device="cpu", dtype="float32", heads=2,
                      repeats=2, warmup=0, kv_len=None, kv_pool="64KiB,1MiB")
    results = run_sweep(plan)
    groups = by_pool(results)
    assert list(groups) == [64 << 10, 1 << 20] and all(len(v) == 2 * 3 for v in groups.values())
    assert {r.kv_len for r in groups[1 << 20]} == {1 << 20 >> 11}  # 512 lanes x 4 bytes a slot
    a, b = results[0].label, results[1].label
    doc = pooled_document(results, pools=plan.pools, flush_l2=plan.flushes, a=a, b=b, layouts=["512+0"],
                          device="cpu (x86_64)", command="routescope sweep ...", date="2026-12-04", commit=None)
    assert [p["kv_pool_bytes"] for p in doc["pools"]] == [64 << 10, 1 << 20] and doc["recommendation_pool"] == 1 << 20
    assert {r["kv_pool_bytes"] for r in doc["results"]} == {64 << 10, 1 << 20}
    md = pooled_markdown(results, doc)
    assert "## kv pool 64 KiB" in md and "## kv pool 1 MiB" in md and md.count("### Layout 512+0") == 2
    t = table_from_sweep(json.loads(json.dumps(doc)), "pooled.json")
    assert t.meta.pools == (64 << 10, 1 << 20)
    assert {k[5] for k in t.series} == {64 << 10, 1 << 20}


def test_the_cli_writes_a_pooled_sweep_and_names_the_commit_given(tmp_path):
    out = tmp_path / "sweep"
    r = CliRunner().invoke(build_app(), ["sweep", "--rows", "1,2", "--topk", "8", "--layout", "glm", "--heads", "2",
                                         "--repeats", "1", "--warmup", "0", "--dtype", "float32", "--kv-pool",
                                         "64KiB,128KiB", "--commit", "abc1234", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["commit"] == "abc1234" and doc["kv_pools"] == [64 << 10, 128 << 10]
    assert "--kv-pool 64KiB,128KiB" in doc["command"]
    bad = CliRunner().invoke(build_app(), ["sweep", "--rows", "1", "--topk", "8", "--commit", "HEAD~1",
                                           "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--commit" in bad.output


def test_an_explicit_commit_wins_then_the_environment_then_the_checkout(tmp_path):
    assert sweep_commit("1234abc", env={COMMIT_ENV: "fedcba9"}) == "1234abc"
    assert sweep_commit(None, env={COMMIT_ENV: "fedcba9-dirty"}) == "fedcba9-dirty"
    assert sweep_commit(None, env={}, where=tmp_path) is None
    with pytest.raises(ValueError):
        check_commit("main")


def _git(where: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _recorded(tree: Path) -> str:
    """The commit a sweep run from ``tree`` records: the copy's own code, in a fresh interpreter."""
    code = "from dispatcher.sweep.provenance import sweep_commit; print(sweep_commit(env={}))"
    env = {k: v for k, v in os.environ.items() if k != COMMIT_ENV}
    env["PYTHONPATH"] = str(tree)
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_copy_inside_another_repository_records_no_commit_and_its_own_checkout_its_own(tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "README").write_text("another project\n")
    _git(outer, "add", "README")
    _git(outer, "commit", "-qm", "theirs")
    theirs = _git(outer, "rev-parse", "--short=7", "HEAD")
    tree = outer / "routescope-copy"  # the tree copied without its .git, inside their work tree
    shutil.copytree(ROOT / "dispatcher", tree / "dispatcher", ignore=shutil.ignore_patterns("__pycache__"))
    assert git_commit(tree) is None
    assert _recorded(tree) == "None"  # not their commit, which git would answer from inside the copy
    assert _git(tree, "rev-parse", "--short=7", "HEAD") == theirs
    _git(tree, "init", "-q")  # the copy becomes a checkout of its own
    _git(tree, "add", "dispatcher")
    _git(tree, "commit", "-qm", "ours")
    ours = _git(tree, "rev-parse", "--short=7", "HEAD")
    assert _recorded(tree) == ours != theirs


def test_the_json_says_which_pools_sit_in_l2():
    assert pool_sentence([8 << 20, 256 << 20, 4 << 30], H200_L2) == (
        "kv pools: 8 MiB inside this GPU's 60 MiB L2 (what a call gathers stays there); "
        "256 MiB, 4 GiB past it (gathers come from HBM, as in serving)")
    assert pool_sentence([8 << 20], None) is None  # the host reports no L2
