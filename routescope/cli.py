"""The `routescope` command: one typer app; each package contributes its subcommands."""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer import rich_utils
from typer.core import TyperCommand, TyperGroup

# The checkout this module sits in (routescope/cli.py -> the repository root), when it runs from one.
CHECKOUT = Path(__file__).resolve().parents[1]
PIPED_HELP_WIDTH = 120  # help written to a file or a pipe: wide enough that no option or env name is cut

# (name, "module:attribute", kind): a command function or a typer sub-app, imported lazily
# so `routescope explain` does not pay for FastAPI or matplotlib.
SUBCOMMANDS = (
    ("explain", "dispatcher.cli:explain_command", "command"),
    ("serve", "service.cli:serve_command", "command"),
    ("sweep", "dispatcher.sweep.cli:sweep_command", "command"),
    ("bench", "telemetry.bench.cli:bench_app", "group"),
    ("advise", "advise.cli:advise_command", "command"),
    ("experiment", "service.experiment_cli:experiment_app", "group"),
)
# Commands other packages add to a group above: (group, name, "module:attribute").
GROUP_COMMANDS = (("bench", "ab", "advise.ab_cli:ab_command"), ("bench", "live", "advise.live:live_command"),
                  ("bench", "serve", "service.bench:serve_bench_command"),
                  ("bench", "experiment", "experiments.bench:experiment_command"))


def _load(target: str) -> object | None:
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None  # that package has not shipped the command yet
        raise
    return getattr(mod, attr)


def version_text(root: Path = CHECKOUT) -> str:
    """"routescope 0.1.0", and the commit when this code runs from a git checkout ("-dirty": edited since)."""
    version = None
    pyproject = root / "pyproject.toml"
    if (root / ".git").exists() and pyproject.is_file():
        try:
            version = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            version = None
    if version is None:
        try:
            version = metadata.version("routescope")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed)"
    if not (root / ".git").exists():
        return f"routescope {version}"
    commit = checkout_commit(root)
    return f"routescope {version}" + (f" (commit {commit})" if commit else "")


def checkout_commit(root: Path) -> str | None:
    """The checkout's short commit, "-dirty" when tracked files differ; None if git cannot say (no torch imported,
    unlike dispatcher.sweep.provenance, which a sweep uses the same way)."""
    import subprocess

    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "--short=7", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    diff = git("diff", "--quiet", "HEAD", "--")
    return head.stdout.strip() + ("-dirty" if diff is not None and diff.returncode == 1 else "")


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


def _root(
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="print the version (and the commit, from a checkout) and exit")] = False,
) -> None:
    """See how sparse MLA prefill calls are routed to attention kernels."""


def _untag(cmd: click.Command, ctx: click.Context) -> None:
    """Drop typer's <str>/<bool>/<int> tags from help; keep choices (observe|reroute) and ranges."""
    for param in cmd.get_params(ctx):
        shown = getattr(param, "display_type_rich", None)
        if shown is None or getattr(shown, "untagged", False):
            continue
        tag = shown(ctx=ctx) or ""
        inner = tag[1:-1] if tag.startswith("<") and tag.endswith(">") else tag
        label = inner if "|" in inner or not tag.startswith("<") else None

        def untagged(ctx: click.Context | None = None, _label: str | None = label) -> str | None:
            return _label

        untagged.untagged = True  # type: ignore[attr-defined]
        param.display_type_rich = untagged  # this parameter's help only: typer's class is left alone


class HelpCommand(TyperCommand):
    """A command whose help shows no type tags."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _untag(self, ctx)
        super().format_help(ctx, formatter)


class HelpGroup(TyperGroup):
    """A group whose help shows no type tags."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        _untag(self, ctx)
        super().format_help(ctx, formatter)


def _plain_help(app: typer.Typer) -> None:
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's default; a command with its own class keeps it
            info.cls = HelpCommand


def build_app() -> typer.Typer:
    app = typer.Typer(
        cls=HelpGroup,
        name="routescope",
        help="See how sparse MLA prefill calls are routed to attention kernels.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    groups = {}
    for name, target, kind in SUBCOMMANDS:
        obj = _load(target)
        if obj is None:
            continue
        if kind == "group":
            app.add_typer(obj, name=name, cls=HelpGroup)
            groups[name] = obj
        else:
            app.command(name)(obj)
    for group, name, target in GROUP_COMMANDS:
        obj = _load(target)
        sub = groups.get(group)
        if obj is not None and sub is not None and all(c.name != name for c in sub.registered_commands):
            sub.command(name, cls=HelpCommand)(obj)
    _plain_help(app)
    for sub in groups.values():
        _plain_help(sub)
    return app


def help_width(stdout: Any = None, env: Any = None) -> int | None:
    """The help's width: typer's (the terminal's, or TERMINAL_WIDTH/COLUMNS) unless it goes to a pipe or a file."""
    stdout = sys.stdout if stdout is None else stdout
    env = os.environ if env is None else env
    if env.get("TERMINAL_WIDTH") or env.get("COLUMNS"):
        return None
    isatty = getattr(stdout, "isatty", None)
    return None if isatty is not None and isatty() else PIPED_HELP_WIDTH


def main() -> None:
    if sys.argv[1:] == ["--version"]:  # answered before the subcommands (and torch) are imported
        print(version_text())
        return
    width = help_width()
    if width is not None:
        rich_utils.MAX_WIDTH = width  # what TERMINAL_WIDTH sets; only for a pipe or a file
    build_app()()


if __name__ == "__main__":
    main()
