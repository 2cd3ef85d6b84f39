"""The `routescope` command: one typer app; each package contributes its subcommands."""

from __future__ import annotations

import typer

from dispatcher.cli import explain_command


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="routescope",
        help="See how sparse MLA prefill calls are routed to attention kernels.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    app.command("explain")(explain_command)
    return app


def _root() -> None:
    """See how sparse MLA prefill calls are routed to attention kernels."""


def main() -> None:
    build_app()()
