"""`python -m dispatcher.sweep`: the same command as `routescope sweep`, without the other subcommands' imports."""

import typer

from .cli import sweep_command

if __name__ == "__main__":
    typer.run(sweep_command)
