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


@cli.command()
@click.option("--quick", is_flag=True, help="A smoke run: 200 ops per worker, 1 round.")
@click.option(
    "--rounds", type=click.IntRange(min=1), default=None, help="Rounds to take medians of [3]."
)
@click.option(
    "--json",
    "json_file",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Also write every figure, with the machine's details, to this JSON file.",
)
@click.option(
    "--scale",
    is_flag=True,
    help="Instead: reactor with 10,000 to 1,000,000 keys in 100 scopes (slow).",
)
@click.option(
    "--db-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the databases go (default: a temporary directory, removed afterwards).",
)
@click.option("--threads", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--processes", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["sqlite", "postgresql"]),
    default="sqlite",
    show_default=True,
    help="Where reactor keeps its database (a fresh schema per mode on PostgreSQL); "
    "the peers stay as they are.",
)
@click.option(
    "--url",
    envvar=["REACTOR_BENCH_POSTGRES_URL", "REACTOR_TEST_POSTGRES_URL"],
    show_envvar=True,
    default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
    show_default=True,
    help="The PostgreSQL server for --backend postgresql.",
)
def bench(
    quick: bool,
    rounds: int | None,
    json_file: str | None,
    scale: bool,
    db_dir: str | None,
    threads: int,
    processes: int,
    backend: str,
    url: str,
) -> None:
    """Measure reactor against dict+lock, sqlite3, diskcache, sqlitedict and Redis."""
    from ._bench import BackendUnavailable, Options, run
    from ._bench.report import render, write_json

    if scale and backend != "sqlite":
        raise click.UsageError("--scale runs on SQLite only: leave out --backend postgresql")
    given = click.get_current_context().get_parameter_source("url")
    if backend == "sqlite" and given is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--url goes with --backend postgresql")
    console = Console()
    try:
        with console.status("reactor bench") as status:
            result = run(
                Options(
                    quick=quick,
                    rounds=rounds,
                    scale=scale,
                    db_dir=db_dir,
                    threads=threads,
                    processes=processes,
                    backend=backend,
                    url=url,
                    progress=lambda message: status.update(f"reactor bench: {message}"),
                )
            )
    except BackendUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    render(result, console)
    if json_file is not None:
        write_json(result, json_file)
        console.print(f"figures written to {json_file}")


def main() -> None:
    """Entry point: reactor errors become one line on stderr and exit status 1."""
    try:
        cli.main(standalone_mode=True)
    except ReactorError as exc:
        click.echo(f"reactor: {exc}", err=True)
        sys.exit(1)
