"""What every data command shares: its options (``--db``, ``--json/--table``,
``--raw``, ``--limit``), its JSON arguments, and the database and output of the
running command.

``--db`` and ``--json/--table`` are taken by the group and again by each command (the
command's, parsed last, wins); what they said is kept in ``ctx.meta``, where
``command_state`` and ``command_output`` read it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

from reactor._base.keys import check_writable
from reactor._storage.locate import locate
from reactor.errors import ReactorError, ReadOnlyError

from .group import STORAGE, USAGE, failure
from .output import Output

if TYPE_CHECKING:
    from reactor._handles.state import State

__all__ = [
    "AS_JSON",
    "DB",
    "DB_HELP",
    "F",
    "command_output",
    "command_state",
    "data_options",
    "format_option",
    "limit_option",
    "parse_json",
    "remember",
    "string_option",
    "writable_scope",
]

F = TypeVar("F", bound=Callable[..., Any])

DB: Final = "reactor.db"  # ctx.meta keys: what --db and --json/--table said, if anything
AS_JSON: Final = "reactor.as_json"
_RAW: Final = "reactor.raw"
_STRING: Final = "reactor.string"
DB_HELP: Final = (
    "The database: a file path, sqlite:///PATH or postgresql+psycopg://USER@HOST/DB "
    "[default: $REACTOR_DB, else ~/.reactor/state.db]."
)
_RAW_HELP: Final = (
    "Print a string value as its plain text, without quotes or escapes, and keys one per "
    "line (get, incr, ttl, keys; other values as JSON)."
)


def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """An option's callback that keeps what it said in ``ctx.meta``."""
    # Given to the group or to the command: the command's, parsed last, wins.
    if value is not None:
        ctx.meta[f"reactor.{param.name}"] = value
    return value


def _remember_flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    # A flag is False when not given: only a given one may win over the group's.
    if value:
        ctx.meta[f"reactor.{param.name}"] = True
    return value


def data_options(*, envvar: str | None = None, raw: bool = False) -> Callable[[F], F]:
    """``--db`` and ``--json/--table``, for the group and again for each data command;
    ``--raw`` too where ``raw`` (the group, and the commands that print single values)."""

    def decorate(command: F) -> F:
        if raw:
            command = click.option(
                "--raw", is_flag=True, expose_value=False, callback=_remember_flag, help=_RAW_HELP
            )(command)
        command = format_option()(command)
        return click.option(
            "--db",
            metavar="PATH|URL",
            envvar=envvar,
            expose_value=False,
            callback=remember,
            help=DB_HELP,
        )(command)

    return decorate


def format_option() -> Callable[[F], F]:
    """``--json/--table``: how ``command_output`` prints."""
    return click.option(
        "--json/--table",
        "as_json",
        default=None,
        expose_value=False,
        callback=remember,
        help="Print JSON, or tables [default: JSON when piped, tables on a terminal].",
    )


def limit_option(help_text: str) -> Callable[[F], F]:
    """``--limit N``, for the commands that list."""
    return click.option("--limit", type=click.IntRange(min=1), metavar="N", help=help_text)


def string_option() -> Callable[[F], F]:
    """``-s/--string``: the command's value is a plain string, not JSON (``parse_json``
    with ``value=True`` then returns the text as given)."""
    return click.option(
        "-s",
        "--string",
        is_flag=True,
        expose_value=False,
        callback=_remember_flag,
        help='Take the value as a plain string, not JSON: -s hello stores "hello".',
    )


def writable_scope(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """The SCOPE of a write command: a scope of events (``queue:NAME``) is a usage
    error, caught before any database is opened or created."""
    try:
        return check_writable(value)
    except ReactorError as exc:
        raise click.BadParameter(str(exc)) from None


def command_state(*, create: bool = False) -> State:
    """Open the database for the running command; it closes when the command ends.

    Only writes create a database: a read on a file that does not exist is an error.
    Reads open it read-only, so that they work on a database the user may read but not
    write; one that cannot be read without a write first (a migration to this version,
    a new PostgreSQL schema) is opened read-write, as it always was, where it can be.
    """
    from reactor._handles.open import open as open_state  # the engine: only when used

    ctx = click.get_current_context()
    target: str | None = ctx.meta.get(DB)
    if not create:
        _, location = locate(target, "normal")
        if isinstance(location, Path) and not location.exists():
            raise failure(f"no database at {location}", STORAGE)
        if location is not None:  # a file or a server: in memory, nothing to read
            try:
                return ctx.with_resource(open_state(target, readonly=True))
            except ReadOnlyError as refused:
                try:
                    return ctx.with_resource(open_state(target))
                except ReadOnlyError:
                    raise refused from None  # why it could not be read, not written
    return ctx.with_resource(open_state(target))


def command_output() -> Output:
    """How the running command prints: as ``--json/--table`` and ``--raw`` said."""
    meta = click.get_current_context().meta
    return Output(meta.get(AS_JSON), raw=meta.get(_RAW, False))


def parse_json(text: str, what: str, *, value: bool = False) -> Any:
    """Parse a JSON argument (``-`` reads it from stdin); ``value``: one to store, which
    may be a bare word meant as a string, and is the text itself under ``--string``
    (from stdin: without its last newline)."""
    if text == "-":
        text = sys.stdin.read()
        if value and click.get_current_context().meta.get(_STRING):
            return text.removesuffix("\n")
    if value and click.get_current_context().meta.get(_STRING):
        return text
    try:
        from reactor._backup.lines import parse_json as parse  # only JSON given

        return parse(text)
    except ValueError as exc:
        shown = text if len(text) <= 40 else text[:37] + "..."
        hint = (
            " (a string goes in double quotes, '\"text\"', or use --string)"
            if value and text[:1].isalpha()
            else ""
        )
        raise failure(f"{what} is not JSON: {shown!r}: {exc}{hint}", USAGE) from None
