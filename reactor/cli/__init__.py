"""The ``reactor`` command line: a scope's verbs, the live change feed, export and import,
a web dashboard (``reactor ui``) and the upkeep of a deployment (``reactor serve``).

Every data command works on ``--db`` (else ``$REACTOR_DB``, else ``~/.reactor/state.db``).
A command's result is JSON when stdout is piped, a table on a terminal (``--json`` and
``--table`` choose instead; ``--raw`` prints a string value as its text, as
``redis-cli --raw`` does). Errors are one line on stderr, ``Error: ...``, with no
traceback and one exit-status convention: 0 done; 1 not found (a key, timer, job or
run) or refused by the data (a value of the wrong type, a conflict, an op that did not
apply); 2 usage (an unknown command or option, with a "did you mean"; a bad option
value, name or JSON argument); 3 storage (no database at the path, one that cannot be
opened, read or written). reactor's errors are turned into click's in one place,
``Group.invoke`` (``group.exit_status``).

Start-up is kept short (a command is often one call in a shell loop): a command's
module is imported when the command runs (``COMMANDS`` below names each command's), and
what only some commands use (the engine, rich, the dashboard, the bench) is imported in
those commands; ``get`` and the other quick reads open a SQLite file's store alone
(``reading``).

The commands live by group: ``values`` (keys and values, listings), ``records``
(history, clear, locks, subscribers), ``timers``,
``queues``, ``watch``, ``backup`` (export, import), ``programs`` (ui, demo, bench) and
``serve`` (the upkeep's long-running process); what
they share in ``group`` (errors, "did you mean"), ``options`` and ``output``. This
module builds the group from them.
"""

from __future__ import annotations

import sys

import click

from reactor.errors import ReactorError

from .group import Group, exit_status
from .logs import show_warnings
from .options import data_options

__all__ = ["cli", "main"]


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # click.version_option, but importing importlib.metadata only when asked.
    if value and not ctx.resilient_parsing:
        from reactor._version import __version__

        click.echo(f"reactor, version {__version__}")
        ctx.exit()


# Each command's module (in this package): a new command goes into its group's module,
# into that module's COMMANDS, and here (tests/test_cli.py checks the two agree).
COMMANDS: dict[str, str] = {
    **dict.fromkeys(
        [
            "get",
            "set",
            "update",
            "delete",
            "incr",
            "ttl",
            "exists",
            "mget",
            "expire",
            "persist",
            "keys",
            "list",
            "scopes",
            "stats",
        ],
        "values",
    ),
    **dict.fromkeys(("history", "clear", "locks", "subscribers"), "records"),
    "timers": "timers",
    "queue": "queues",
    **dict.fromkeys(("runs", "run", "cancel", "send"), "runs"),
    "watch": "watch",
    "export": "backup",
    "import": "backup",
    **dict.fromkeys(("ui", "demo", "bench"), "programs"),
    "serve": "serve",
}


@click.group(
    cls=Group,
    lazy={name: f"{__name__}.{module}" for name, module in COMMANDS.items()},
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@data_options(envvar="REACTOR_DB", raw=True)
def cli() -> None:
    """reactor: persistent, reactive JSON state in named scopes.

    Values and ops are JSON ('{"total": 120}', '"text"', 42). Results print as JSON when
    piped and as tables on a terminal (--raw: strings as plain text); errors go to
    stderr, with exit status 1 (not found), 2 (usage) or 3 (storage).
    """


def main() -> None:
    """Entry point of the ``reactor`` console script (and ``python -m reactor``)."""
    show_warnings()
    try:
        # One variable for the console script and python -m reactor alike.
        cli.main(standalone_mode=True, complete_var="_REACTOR_COMPLETE")
    except ReactorError as exc:  # raised outside a command: closing the database, say
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exit_status(exc))
