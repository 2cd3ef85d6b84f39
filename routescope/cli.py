"""The `routescope` command: one typer app; each package contributes its subcommands."""

from __future__ import annotations

import importlib

import typer

# (name, "module:attribute", kind): a command function or a typer sub-app, imported lazily
# so `routescope explain` does not pay for FastAPI or matplotlib.
SUBCOMMANDS = (
    ("explain", "dispatcher.cli:explain_command", "command"),
    ("serve", "service.cli:serve_command", "command"),
    ("sweep", "dispatcher.sweep.cli:sweep_command", "command"),
    ("bench", "telemetry.bench.cli:bench_app", "group"),
    ("advise", "advise.cli:advise_command", "command"),
)
# Commands other packages add to a group above: (group, name, "module:attribute").
GROUP_COMMANDS = (("bench", "ab", "advise.ab_cli:ab_command"), ("bench", "serve", "service.bench:serve_bench_command"))


def _load(target: str) -> object | None:
    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None  # that package has not shipped the command yet
        raise
    return getattr(mod, attr)


def _root() -> None:
    """See how sparse MLA prefill calls are routed to attention kernels."""


def build_app() -> typer.Typer:
    app = typer.Typer(
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
            app.add_typer(obj, name=name)
            groups[name] = obj
        else:
            app.command(name)(obj)
    for group, name, target in GROUP_COMMANDS:
        obj = _load(target)
        sub = groups.get(group)
        if obj is not None and sub is not None and all(c.name != name for c in sub.registered_commands):
            sub.command(name)(obj)
    return app


def main() -> None:
    build_app()()


if __name__ == "__main__":
    main()
