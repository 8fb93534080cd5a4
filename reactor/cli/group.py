"""The command classes of the ``reactor`` command line: how usage errors and reactor's
errors reach the user.

``Group.invoke`` is the one place where reactor's errors become click's: one line on
stderr, ``Error: ...``, no traceback, and an exit status by what went wrong
(``exit_status``): 0 done, 1 not found or refused, 2 usage, 3 storage. A misspelled
command or option gets a "did you mean" (exit status 2), also for the names redis-cli
and etcdctl use.
"""

from __future__ import annotations

import errno
import importlib
from collections.abc import Mapping
from typing import Any, Final

import click

from reactor.errors import (
    InvalidArgumentError,
    InvalidKeyError,
    InvalidOpError,
    InvalidValueError,
    ReactorError,
    SchemaError,
    StorageError,
)

__all__ = [
    "NOT_FOUND",
    "STORAGE",
    "USAGE",
    "Command",
    "Failure",
    "Group",
    "exit_status",
    "failure",
]

# The exit statuses (docs/guides/cli.md, "Errors and exit statuses"); 0 is done.
NOT_FOUND: Final = 1  # no such key, timer, job or run; or the data refused (a conflict, ...)
USAGE: Final = 2  # what the command was given: options, arguments, names, JSON
STORAGE: Final = 3  # the database: missing, unreadable, busy, read-only, too new


class Failure(click.ClickException):
    """An error of a command, one line on stderr: not found, or refused (exit status 1)."""

    exit_code = NOT_FOUND


class _UsageFailure(Failure):
    exit_code = USAGE


class _StorageFailure(Failure):
    exit_code = STORAGE


def failure(message: str, status: int = NOT_FOUND) -> Failure:
    """An error of a command, one line on stderr, ending it with exit status ``status``
    (``NOT_FOUND``, ``USAGE`` or ``STORAGE``)."""
    kind = {USAGE: _UsageFailure, STORAGE: _StorageFailure}.get(status, Failure)
    return kind(message)


def exit_status(exc: ReactorError) -> int:
    """The exit status for a reactor error: what it says about the command's input
    (``USAGE``), the database (``STORAGE``), or the data (``NOT_FOUND``)."""
    if isinstance(exc, StorageError | SchemaError):
        return STORAGE
    if isinstance(exc, InvalidArgumentError | InvalidKeyError | InvalidOpError | InvalidValueError):
        return USAGE
    return NOT_FOUND


# What users of redis-cli and etcdctl type, and reactor's name for it (difflib finds the
# rest: lsit, sett, delte).
_KNOWN_AS: Final = {
    "put": "set",
    "del": "delete",
    "rm": "delete",
    "ls": "list",
    "scan": "keys",
    "incrby": "incr",
    "info": "stats",
    "monitor": "watch",
    "dump": "export",
    "restore": "import",
}


class Command(click.Command):
    """A command that says "did you mean" for a misspelled option also when it takes
    unknown options as arguments (``ignore_unknown_options``, for values such as -1)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError:
            if not ctx.ignore_unknown_options:
                raise
            names = [
                name
                for param in self.get_params(ctx)
                if isinstance(param, click.Option)
                for name in (*param.opts, *param.secondary_opts)
            ]
            before = given[: given.index("--")] if "--" in given else given
            for arg in before:  # an extra argument that looks like an option is one
                name = arg.partition("=")[0]
                if name.startswith("--") and name not in names:
                    raise click.NoSuchOption(name, possibilities=names, ctx=ctx) from None
            raise


class Group(click.Group):
    """A command group whose commands' reactor errors end as click's: one line on
    stderr, ``Error: ...``, with ``exit_status``'s status; a misspelled command gets a
    "did you mean". ``lazy`` maps command names to the modules that define them (in
    their ``COMMANDS``), imported when one of their commands is asked for."""

    command_class = Command

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        module = self._lazy.get(cmd_name)
        if found is not None or module is None:
            return found
        for command in importlib.import_module(module).COMMANDS:  # its module's, all
            self.add_command(command)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        # click 8.2 suggests too, but not 8.1, and not the names of other tools.
        name = args[0] if args else ""
        if ctx.resilient_parsing or name.startswith("-") or self.get_command(ctx, name):
            return super().resolve_command(ctx, args)
        import difflib  # only on a miss: start-up stays short

        lower = name.lower()  # GET, as in Redis
        known = _KNOWN_AS.get(lower, lower if self.get_command(ctx, lower) else None)
        close = [known] if known else difflib.get_close_matches(name, self.list_commands(ctx))
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise click.UsageError(f"No such command {name!r}.{hint}", ctx)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReactorError as exc:
            # One line, as logs and supervisors keep them (libpq's messages add a
            # tab-indented hint on a line of its own).
            raise failure(" ".join(str(exc).split()), exit_status(exc)) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # the reader went away (| head): click exits quietly
            raise failure(str(exc)) from None
