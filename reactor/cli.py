"""The ``reactor`` command line."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from . import open as open_state
from ._demo import DEMO_DATABASE, run_demo
from ._version import __version__
from .errors import ReactorError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reactor")
def cli() -> None:
    """reactor: persistent, reactive JSON state in named scopes."""


@cli.command()
@click.option(
    "--db",
    default=DEMO_DATABASE,
    show_default=True,
    help="Database file for the demo (in the current folder by default).",
)
def demo(db: str) -> None:
    """Run a short program on an embedded database, and show that state survives."""
    with open_state(db) as state:
        run_demo(state, Console())


def main() -> None:
    """Entry point: reactor errors become one line on stderr and exit status 1."""
    try:
        cli.main(standalone_mode=True)
    except ReactorError as exc:
        click.echo(f"reactor: {exc}", err=True)
        sys.exit(1)
