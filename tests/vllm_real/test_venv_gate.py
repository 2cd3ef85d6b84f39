"""When the real-vLLM venv is missing or wrong: skip on a user's machine, fail under CI, and CI says it is CI.

These run in the main venv, without .venv-vllm (this module names no ``SCRIPT``): they test the decisions
conftest.py makes, not vLLM.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import ROOT, VLLM_VERSION, pinned_vllm, version_problem, when_the_venv_is_missing


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "True", "github-actions"])
def test_under_ci_a_missing_venv_fails(value):
    assert when_the_venv_is_missing({"CI": value}) == "fail"


@pytest.mark.parametrize("env", [{}, {"CI": ""}, {"CI": "0"}, {"CI": "false"}, {"CI": " no "}, {"CI": "off"}])
def test_elsewhere_a_missing_venv_skips(env):
    assert when_the_venv_is_missing(env) == "skip"


def _commands(script: Path) -> list[str]:
    """The script's lines that run something (comments and blank lines dropped)."""
    lines = (line.strip() for line in script.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_ci_entry_exports_ci_before_it_runs_the_suite():
    """.ci/run is CI's entry: without CI=1 a venv that failed to build would pass CI as skipped tests."""
    lines = _commands(ROOT / ".ci" / "run")
    assert "export CI=1" in lines
    assert lines.index("export CI=1") < lines.index("bash scripts/test.sh")


def test_the_readme_command_leaves_ci_to_the_caller():
    """scripts/test.sh is also a user's command: it must not set CI (a loud skip is right there)."""
    assert not [line for line in _commands(ROOT / "scripts" / "test.sh") if re.search(r"\bCI=", line)]


def test_the_pinned_version_is_read_from_the_requirements(tmp_path):
    assert VLLM_VERSION == "0.33.0"
    req = tmp_path / "requirements.txt"
    req.write_text("# a comment naming vllm==9.9\nregex==2024.1.1\nvLLM == 0.34.1  # pinned\n")
    assert pinned_vllm(req) == "0.34.1"
    req.write_text("regex==2024.1.1\n")
    with pytest.raises(LookupError):
        pinned_vllm(req)


def test_the_pinned_version_passes_and_anything_else_is_named():
    assert version_problem("0.33.0") is None
    for found in ("0.33.1", "dev", None):
        problem = version_problem(found)
        assert problem is not None and repr(found) in problem and "'0.33.0'" in problem
