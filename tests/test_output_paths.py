"""Every command that writes checks its output path before any work, and keeps its results when a late write fails.

Each is run in process (typer's runner, or the argparse ``main``) with: a file where a folder goes (or a file's
parent that is a file), a missing parent (made, and the run writes there), an unwritable place (/proc, which
even root cannot write, and a read-only tmpfs where mounting is allowed) and, for the late failure, a real full
tmpfs: the start check passes, the write fails, and the results land in a temporary file the message names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dashboards import build as dashboards_build
from dashboards import fleet as dashboards_fleet
from dashboards import rules as dashboards_rules
from dispatcher.outputs import OutputPathError, check_file, check_folder, write_folder_or_keep, write_or_keep
from routescope.cli import build_app
from telemetry.bench import gpu_replay

APP = build_app()
SWEEP = ["sweep", "--rows", "1", "--topk", "64", "--layout", "512+0", "--repeats", "1", "--warmup", "0", "--json"]
AB = ["bench", "ab", "--calls", "2", "--repeats", "1", "--max-rows", "64", "--gate", "16", "--device", "cpu",
      "--json"]
LIVE = ["bench", "live", "--rows", "2", "--layout", "512+0", "--kv-pool", "1MiB", "--calls", "1", "--rounds", "1",
        "--topk", "16", "--device", "cpu"]


def typer_cmd(args: list[str], option: str) -> Callable[[Path], tuple[int, str]]:
    def run(path: Path) -> tuple[int, str]:
        r = CliRunner().invoke(APP, [*args, option, str(path)])
        return r.exit_code, r.stderr

    return run


def argparse_cmd(main: Callable[[list[str]], int], args: list[str], option: str) -> Callable[..., tuple[int, str]]:
    def run(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
        try:
            code = main([*args, option, str(path)])
        except SystemExit as exc:
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    return run


# (name, kind of output, the runner, the files a good run makes under/at the path, the message's prefix)
COMMANDS = {
    "sweep": ("folder", typer_cmd(SWEEP, "--out"), ("sweep.json", "sweep.csv", "sweep.md"), "routescope sweep:"),
    "bench ab": ("file", typer_cmd(AB, "--out"), (), "routescope bench ab:"),
    "bench live": ("file", typer_cmd(LIVE, "--out"), (), "routescope bench live:"),
    "dashboards.build": ("file", argparse_cmd(dashboards_build.main, [], "--output"), (),
                         "python -m dashboards.build:"),
    "dashboards.rules": ("folder", argparse_cmd(dashboards_rules.main, ["--runbook-base", "https://x.example/r.md"],
                                                "--out"), ("alerts.yml", "recording.yml"), "python -m dashboards.rules:"),
    "dashboards.fleet": ("file", argparse_cmd(dashboards_fleet.main, ["agent", "--central-url", "http://c:9090/api/v1/write",
                                                                      "--cluster", "c", "--node", "n", "--target",
                                                                      "localhost:9475"], "--out"), (),
                         "python -m dashboards.fleet:"),
    "bench gpu_replay": ("file", argparse_cmd(gpu_replay.main, [], "--out"), None, "python -m telemetry.bench.gpu_replay:"),
}
OPTION = {"sweep": "--out", "bench ab": "--out", "bench live": "--out", "dashboards.build": "--output", "dashboards.rules": "--out",
          "dashboards.fleet": "--out", "bench gpu_replay": "--out"}


def call(name: str, path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    kind, run, _, _ = COMMANDS[name]
    return run(path) if run.__code__.co_argcount == 1 else run(path, capsys)


def assert_refused(name: str, code: int, err: str, path: Path) -> None:
    prefix = COMMANDS[name][3]
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"{prefix} {OPTION[name]} {path}: "), err
    assert "Traceback" not in err


def _mount(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}); /proc covers unwritable")


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "ro"
    _mount(mnt, "size=64k,ro")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs with no free block left (an empty file still fits: it needs an inode, not a block)."""
    mnt = tmp_path / "full"
    _mount(mnt, "size=64k")
    try:
        fd = os.open(mnt / "filler", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_file_in_the_way_is_refused_at_start(name, tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("keep me")
    kind = COMMANDS[name][0]
    path = blocker if kind == "folder" else blocker / "out.json"
    code, err = call(name, path, capsys)
    assert_refused(name, code, err, path)
    assert ("is a file" in err) and blocker.read_text() == "keep me"


@pytest.mark.parametrize("name", [n for n, c in COMMANDS.items() if c[0] == "file"])
def test_a_folder_where_a_file_goes_is_refused_at_start(name, tmp_path, capsys):
    code, err = call(name, tmp_path, capsys)
    assert_refused(name, code, err, tmp_path)
    assert "is a folder; give a file name" in err


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unwritable_place_is_refused_at_start(name, capsys):
    path = Path("/proc/routescope-nope/out") if COMMANDS[name][0] == "folder" else Path("/proc/routescope-nope/o.json")
    code, err = call(name, path, capsys)
    assert_refused(name, code, err, path)
    assert "cannot create folder /proc/routescope-nope" in err


@pytest.mark.needs_mount
@pytest.mark.parametrize("name", COMMANDS)
def test_a_read_only_folder_is_refused_at_start(name, read_only_dir, capsys):
    path = read_only_dir / ("out" if COMMANDS[name][0] == "folder" else "o.json")
    code, err = call(name, path, capsys)
    assert_refused(name, code, err, path)
    assert "Read-only file system" in err


@pytest.mark.parametrize("name", [n for n, c in COMMANDS.items() if c[2] is not None])
def test_a_missing_parent_is_made_and_written(name, tmp_path, capsys):
    kind, _, made, _ = COMMANDS[name]
    path = tmp_path / "new" / "deeper" / ("out" if kind == "folder" else "o.json")
    code, err = call(name, path, capsys)
    assert code == 0, err
    if kind == "folder":
        assert sorted(p.name for p in path.iterdir() if p.name in made) == sorted(made)
    else:
        assert path.stat().st_size > 0
        if path.suffix == ".json" and name not in ("dashboards.build", "dashboards.fleet"):  # their outputs are checked by their own tests
            assert json.loads(path.read_text())  # the result itself, not a placeholder
    assert not [p for p in path.parent.rglob(".routescope-probe-*")]  # the start check leaves nothing behind


@pytest.mark.needs_mount
@pytest.mark.parametrize("name", ["sweep", "bench ab", "bench live", "dashboards.build", "dashboards.rules"])
def test_a_write_that_fails_at_the_end_keeps_the_results_in_a_temp_file(name, full_dir, capsys):
    kind = COMMANDS[name][0]
    path = full_dir / ("out" if kind == "folder" else "o.json")
    code, err = call(name, path, capsys)
    assert code == 1, err
    line = err.strip().splitlines()[-1]
    assert "the write failed (No space left on device); the results are in " in line and "Traceback" not in err
    kept = Path(line.rsplit("the results are in ", 1)[1])
    try:
        if kind == "folder":
            assert kept.is_dir() and all((kept / n).stat().st_size > 0 for n in COMMANDS[name][2])
        else:
            assert kept.is_file() and json.loads(kept.read_text())  # the whole result, parsed back
    finally:
        subprocess.run(["rm", "-rf", str(kept)], check=False)


def test_the_checks_alone(tmp_path):
    assert check_folder(tmp_path / "a" / "b", "--out").is_dir()
    assert check_file(tmp_path / "c" / "x.json", "--out") == tmp_path / "c" / "x.json"
    assert not (tmp_path / "c" / "x.json").exists()  # checked, not created
    with pytest.raises(OutputPathError, match="^--out .*: is a folder"):
        check_file(tmp_path, "--out")
    path, why = write_or_keep(tmp_path / "ok.json", "{}", "--out")
    assert (path, why) == (tmp_path / "ok.json", None) and path.read_text() == "{}"
    def write(folder: Path) -> Path:
        (folder / "a.txt").write_text("a")
        return folder

    assert write_folder_or_keep(tmp_path, write, "--out") == (tmp_path, None)
    kept, why = write_folder_or_keep(Path("/proc/routescope-nope"), write, "--out")
    try:
        assert (kept / "a.txt").read_text() == "a" and why == (
            f"--out /proc/routescope-nope: the write failed (No such file or directory); the results are in {kept}")
    finally:
        subprocess.run(["rm", "-rf", str(kept)], check=False)


def test_the_builders_check_their_paths_without_importing_torch(tmp_path):
    """dashboards.rules and .build load dispatcher/outputs.py alone: its checks, not the dispatcher's torch."""
    code = ("import sys; from dashboards import rules, build; "
            f"rules.main(['--runbook-base', 'https://x.example/r.md', '--out', {str(tmp_path / 'r')!r}]); "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "False" and (tmp_path / "r" / "alerts.yml").is_file()
