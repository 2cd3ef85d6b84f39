"""The `routescope` command's conventions: --version names the commit in a checkout; help has no type tags
and is not cut when it goes to a pipe or a file."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer import rich_utils
from typer.testing import CliRunner

from routescope.cli import PIPED_HELP_WIDTH, build_app, help_width, version_text

ROOT = Path(__file__).resolve().parents[2]
TAG = re.compile(r"<(str|bool|int|float|path|text|int range|float range)>")


def _commands() -> list[list[str]]:
    """Every command's path, from the built click tree (groups and their commands)."""
    out: list[list[str]] = [[]]

    def walk(cmd: click.Command, path: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            out.append([*path, name])
            walk(sub, [*path, name])

    walk(typer.main.get_command(build_app()), [])
    return out


@pytest.fixture(autouse=True)
def wide_help(monkeypatch):
    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 200)  # as main() sets it for a pipe; CliRunner has no terminal


def test_version_names_the_checkouts_commit():
    r = CliRunner().invoke(build_app(), ["--version"])
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert r.exit_code == 0
    assert re.fullmatch(rf"routescope \d+\.\d+\.\d+ \(commit {head}(-dirty)?\)\n", r.stdout), r.stdout


def test_version_outside_a_checkout_has_no_commit(tmp_path):
    assert re.fullmatch(r"routescope (\d+\.\d+\.\d+|unknown \(not installed\))", version_text(tmp_path))


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "routescope")
def test_help_has_no_type_tags(path):
    r = CliRunner().invoke(build_app(), [*path, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.output and not TAG.search(r.output), TAG.search(r.output)


def test_choices_and_ranges_stay():
    out = CliRunner().invoke(build_app(), ["explain", "--help"]).output
    assert "observe|reroute|raise" in out
    assert "[x>=2]" in CliRunner().invoke(build_app(), ["bench", "ab", "--help"]).output


def test_help_width_is_wide_for_a_pipe_and_left_alone_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert help_width(io.StringIO(), {}) == PIPED_HELP_WIDTH
    assert help_width(Tty(), {}) is None
    assert help_width(io.StringIO(), {"COLUMNS": "60"}) is None  # the user's width wins


def test_piped_help_is_not_cut():
    r = subprocess.run([sys.executable, "-m", "routescope.cli", "explain", "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and "ROUTESCOPE_GFX942_MIN_ROWS" in r.stdout and "--allow-unknown-arch" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) == PIPED_HELP_WIDTH


def test_the_console_scripts_version_needs_no_subcommand():
    r = subprocess.run([sys.executable, "-c", "import sys; from routescope.cli import main; main(); "
                        "print('torch' in sys.modules)", "--version"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    version, loaded = r.stdout.splitlines()
    assert version == version_text() and loaded == "False"  # nothing heavy imported to answer it
