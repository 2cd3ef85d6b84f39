"""GET /routing/explain returns exactly what `routescope explain --json` prints, for the same options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from routescope.cli import build_app

EXE = shutil.which("routescope", path=str(Path(sys.executable).parent)) or "routescope"

# (CLI flags, query params): the same what-if call, spelled both ways.
CASES = [
    (["--rows", "512"], {"rows": 512}),
    (["--arch", "gfx950", "--rows", "4096", "--sink"], {"arch": "gfx950", "rows": 4096, "sink": "true"}),
    (["--arch", "gfx942", "--query-lens", "1,1,8000", "--q-dtype", "float16", "--kv-dtype", "float8_e4m3fnuz"],
     {"arch": "gfx942", "query_lens": "1,1,8000", "q_dtype": "float16", "kv_dtype": "float8_e4m3fnuz"}),
    (["--query-lens", "1,1,1,1", "--gfx942-min-rows", "0", "--guard", "reroute", "--layout", "glm"],
     {"query_lens": "1,1,1,1", "gfx942_min_rows": 0, "guard": "reroute", "layout": "glm"}),
    (["--rows", "700", "--no-aiter", "--spec-tokens", "3", "--heads", "8", "--topk", "512"],
     {"rows": 700, "aiter": "false", "spec_tokens": 3, "heads": 8, "topk": 512}),
]


def cli_json(args: list[str]) -> dict:
    """The CLI in process (typer's runner): the same command function the console script calls."""
    r = CliRunner().invoke(build_app(), ["explain", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("args, params", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_http_json_equals_cli_json(client, args, params):
    r = client.get("/routing/explain", params=params)
    assert r.status_code == 200, r.text
    assert r.json() == cli_json(args)


def test_http_json_equals_the_installed_console_script(client):
    args, params = CASES[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUTESCOPE_")}
    r = subprocess.run([EXE, "explain", "--json", *args], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert client.get("/routing/explain", params=params).json() == json.loads(r.stdout)
