"""`routescope explain` end to end through the installed console script: output, JSON, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.explain import ExplainRequest, explain

EXE = shutil.which("routescope", path=str(Path(sys.executable).parent)) or "routescope"


def cli(*args, env=None):
    e = dict(os.environ)
    e.pop("ROUTESCOPE_GFX942_MIN_ROWS", None)
    e.pop("ROUTESCOPE_GFX950_MIN_ROWS", None)
    e.update(env or {})
    return subprocess.run([EXE, "explain", *args], capture_output=True, text=True, timeout=120, env=e)


def test_done_when_512_goes_to_aiter_and_511_stays_in_tree():
    base = ["--arch", "gfx942", "--q-dtype", "bfloat16", "--kv-dtype", "bfloat16", "--aiter", "--json"]
    r = cli(*base, "--rows", "512")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kernel"] == "aiter.pa_prefill_sparse"
    assert {"kernel", "reason", "gates", "call_class", "decode_rows"} <= out.keys()
    assert all({"name", "passed", "detail"} == g.keys() for g in out["gates"])
    r = cli(*base, "--rows", "511")
    assert json.loads(r.stdout)["kernel"] == "intree.ragged_prefill"


def test_env_threshold_and_flag_override():
    r = cli("--rows", "700", "--json", env={"ROUTESCOPE_GFX942_MIN_ROWS": "1024"})
    assert json.loads(r.stdout)["kernel"] == "intree.ragged_prefill"
    r = cli("--rows", "700", "--json", "--gfx942-min-rows", "600", env={"ROUTESCOPE_GFX942_MIN_ROWS": "1024"})
    assert json.loads(r.stdout)["kernel"] == "aiter.pa_prefill_sparse"


def test_query_lens_classify_the_glm_bug():
    r = cli("--query-lens", "1,1,1,1", "--gfx942-min-rows", "0", "--json")
    out = json.loads(r.stdout)
    assert out["call_class"] == "pure_decode" and out["decode_rows"] == 4
    assert out["kernel"] == "aiter.pa_prefill_sparse" and out["decode_in_prefill"] is True
    r = cli("--query-lens", "1,1,1,1", "--gfx942-min-rows", "0", "--guard", "reroute", "--json")
    assert json.loads(r.stdout)["kernel"] == "intree.sparse_decode"


def test_table_output():
    r = cli("--rows", "511")
    assert r.returncode == 0
    assert "intree.ragged_prefill" in r.stdout and "gfx942.min_rows" in r.stdout and "rows < 512" in r.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--rows", "511", "--q-dtype", "int8"], "--q-dtype"),
        (["--query-lens", "1,x"], "--query-lens"),
        (["--rows", "3", "--query-lens", "1,1"], "rows 3 != sum(query_lens) 2"),
        (["--rows", "-1"], "--rows"),
        ([], "give rows or query_lens"),
        (["--rows", "abc"], "--rows"),
        (["--arch", "gfx 942", "--rows", "1"], "--arch"),
        (["--rows", "1", "--guard", "sometimes"], "--guard"),
    ],
)
def test_bad_arguments_exit_2_without_traceback(args, msg):
    r = cli(*args)
    assert r.returncode == 2
    assert msg in r.stderr
    assert "Traceback" not in r.stderr


def test_explain_function_echoes_request():
    out = explain(ExplainRequest(arch="gfx950", rows=2048, sink=True))
    assert out["kernel"] == "aiter.pa_sparse_prefill_opus"
    assert out["request"]["arch"] == "gfx950" and out["policy"]["gfx950_min_rows"] == 1024
