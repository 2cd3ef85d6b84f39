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


# (CLI flags, query params, the field at fault): bad inputs, spelled both ways. Both faces must refuse
# each one (exit 2, HTTP 422), name the same field and say the same words (dispatcher/inputs.py's).
BAD = [
    (["--arch", "foo", "--rows", "8"], {"arch": "foo", "rows": 8}, "arch"),
    (["--arch", "gfx9 42", "--rows", "8", "--allow-unknown-arch"],
     {"arch": "gfx9 42", "rows": 8, "allow_unknown_arch": "true"}, "arch"),
    (["--rows", "0"], {"rows": 0}, "rows"),
    (["--rows", "-5"], {"rows": -5}, "rows"),
    (["--rows", "2147483648"], {"rows": 2147483648}, "rows"),
    (["--rows", "99999999999999999999"], {"rows": "99999999999999999999"}, "rows"),
    (["--query-lens", "1,0"], {"query_lens": "1,0"}, "query_lens"),
    (["--query-lens", "2147483647,1"], {"query_lens": "2147483647,1"}, "query_lens"),
    (["--query-lens", "1,x"], {"query_lens": "1,x"}, "query_lens"),
    (["--rows", "8", "--topk", "0"], {"rows": 8, "topk": 0}, "topk"),
    (["--rows", "8", "--gfx942-min-rows", "-1"], {"rows": 8, "gfx942_min_rows": -1}, "gfx942_min_rows"),
    (["--rows", "8", "--gfx950-min-rows", "2147483648"], {"rows": 8, "gfx950_min_rows": 2147483648}, "gfx950_min_rows"),
    (["--rows", "8", "--q-dtype", "int8"], {"rows": 8, "q_dtype": "int8"}, "q_dtype"),
    (["--rows", "8", "--kv-dtype", "float64"], {"rows": 8, "kv_dtype": "float64"}, "kv_dtype"),
]


@pytest.mark.parametrize("args, params, field", BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_cli_and_http_refuse_the_same_bad_inputs_in_the_same_words(client, args, params, field):
    r = client.get("/routing/explain", params=params)
    assert r.status_code == 422, r.text
    items = [item for item in r.json()["detail"] if item["parameter"] == field]
    assert items, r.json()
    cli = CliRunner().invoke(build_app(), ["explain", "--json", *args])
    assert cli.exit_code == 2, cli.output
    flag = "--" + field.replace("_", "-")
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"routescope explain: {flag}: "), cli.stderr
    assert lines[0].removeprefix(f"routescope explain: {flag}: ") == items[0]["msg"]
    assert "Traceback" not in cli.output


def test_an_unknown_arch_is_allowed_by_the_same_flag_in_both(client):
    cli = CliRunner().invoke(build_app(), ["explain", "--json", "--arch", "foo", "--rows", "600",
                                           "--allow-unknown-arch"])
    assert cli.exit_code == 0, cli.output
    r = client.get("/routing/explain", params={"arch": "foo", "rows": 600, "allow_unknown_arch": "true"})
    assert r.status_code == 200, r.text
    assert r.json() == json.loads(cli.stdout) and r.json()["platform"]["what_if"]
