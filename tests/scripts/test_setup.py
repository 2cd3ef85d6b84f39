"""scripts/setup.sh is quiet when all is well and shows what went wrong when a step fails.

A real install cannot run here (it would reinstall into the shared .venv), so the script runs in a copy of
the repository whose .venv holds a pip and a python that are test doubles (shell scripts) printing what the
local index prints: nine "Location ... is ignored" warnings, and on request another warning or a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORED = "WARNING: Location '/wheels/x' is ignored: it is either a non-existing path or lacks a specific scheme."


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    pip = "\n".join(["#!/bin/sh", *[f"echo \"{IGNORED}\" >&2" for _ in range(9)],
                     'if [ -n "$PIP_SAYS" ]; then echo "$PIP_SAYS" >&2; fi',
                     'if [ -n "$PIP_FAILS" ]; then echo "ERROR: No matching distribution found for torch" >&2; exit 1; fi',
                     "echo \"$@\" >> \"$(dirname \"$0\")/pip.calls\""])
    (venv / "pip").write_text(pip + "\n")
    (venv / "python").write_text("#!/bin/sh\nexit 0\n")  # `import torch` and the final import succeed
    for f in ("pip", "python"):
        os.chmod(venv / f, 0o755)
    return tmp_path


def setup(repo: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_quiet_when_all_is_well(repo):
    r = setup(repo)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    assert "-e .[dev]" in (repo / ".venv" / "bin" / "pip.calls").read_text()  # it did install


def test_another_warning_is_shown(repo):
    r = setup(repo, PIP_SAYS="WARNING: the wheel cache is not writable")
    assert r.returncode == 0 and r.stderr.strip() == "WARNING: the wheel cache is not writable"


def test_a_failed_step_says_which_and_shows_pips_output_without_the_noise(repo):
    r = setup(repo, PIP_FAILS="1")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("setup: installing routescope failed (exit 1): .venv/bin/pip install")
    assert lines[-1] == "ERROR: No matching distribution found for torch" and "is ignored" not in r.stderr
