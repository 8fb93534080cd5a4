"""The commands on what the database records besides values: a key's ``history``,
``clear`` (keys by pattern), the held ``locks`` and the durable ``subscribers``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import click

from reactor._base.keys import compile_pattern
from reactor._handles.binding import engine_of

from .complete import complete_key, complete_scope
from .group import Command
from .options import command_output, command_state, data_options, limit_option, writable_scope
from .output import duration, event_line, value_view

if TYPE_CHECKING:
    from rich.console import RenderableType

    from reactor._engine.events import ChangeEvent

__all__ = ["COMMANDS"]

_LOCKS_MAX: Final = 100_000  # what `locks` reads at most (a lock is a row: few are held)


@click.command(cls=Command)
@click.argument("scope", shell_complete=complete_scope)
@click.argument("key", shell_complete=complete_key)
@click.option("--since", type=click.IntRange(min=0), metavar="REV", help="Only after revision REV.")
@limit_option("At most the N latest changes.")
@data_options()
def history(scope: str, key: str, since: int | None, limit: int | None) -> None:
    """Print the changes of KEY in SCOPE that the change log retains, oldest first.

    Each is a change event as watch prints it (revision, type, old and new value,
    ops, timestamp). Exit status 1 if the log no longer holds what follows --since.
    """
    found = command_state().scope(scope).history(key, since=since)[-limit if limit else 0 :]
    command_output().show([event.as_dict() for event in found], lambda _: _history_view(found))


@click.command(cls=Command)
@click.argument("scope", callback=writable_scope, shell_complete=complete_scope)
@click.argument("pattern")
@data_options(raw=True)
def clear(scope: str, pattern: str) -> None:
    """Delete the keys of SCOPE matching the glob PATTERN ('*': every key); print
    how many.

    PATTERN is required, and nothing asks for confirmation (as redis-cli's DEL).
    """
    removed = command_state(create=True).scope(scope).clear(pattern)
    command_output().value(removed, value_view)


@click.command(cls=Command)
@click.argument("pattern", default="*")
@limit_option("At most N locks, by name.")
@data_options()
def locks(pattern: str, limit: int | None) -> None:
    """List the locks held now (of names matching the glob PATTERN): holder, fencing
    token, and the seconds until the lease ends."""
    engine = engine_of(command_state())
    now = engine.now()
    match = compile_pattern(pattern)
    held = [
        {
            "name": name,
            "holder": row.owner,
            "token": row.token,
            "expires_in": round(max(0.0, (row.expires_at or now) - now), 3),
        }
        for name, row in engine.store.held_locks(now, _LOCKS_MAX)
        if match.matches(name)
    ]
    command_output().show(held[:limit], _locks_view)


@click.command(cls=Command)
@data_options()
def subscribers() -> None:
    """List the durable subscribers the database records: position in the change log,
    lag behind its revision, events delivered, events given up on, and the last of
    those (its revision, error and time)."""
    store = engine_of(command_state()).store
    revision = store.revision()
    failures = store.last_failures()
    listed = []
    for name, (position, delivered, failed) in sorted(store.subscribers().items()):
        last = failures.get(name)
        listed.append(
            {
                "name": name,
                "position": position,
                "lag": max(0, revision - position),
                "delivered": delivered,
                "failed": failed,
                "last_failure": None
                if last is None
                else {"revision": last[0], "error": last[1], "at": last[2]},
            }
        )
    command_output().show(listed, _subscribers_view)


def _history_view(events: list[ChangeEvent]) -> RenderableType:
    from rich.console import Group

    if not events:
        return _none("no changes recorded")
    return Group(*(event_line(event) for event in events))


def _locks_view(held: list[Mapping[str, Any]]) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    if not held:
        return _none("no locks held")
    table = Table("name", "holder", "token", "expires in")
    table.columns[2].justify = table.columns[3].justify = "right"
    for lock in held:
        table.add_row(
            Text(lock["name"]), lock["holder"], f"{lock['token']:,}", duration(lock["expires_in"])
        )
    return table


def _subscribers_view(listed: list[Mapping[str, Any]]) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    if not listed:
        return _none("no durable subscribers")
    table = Table("name", "position", "lag", "delivered", "failed", "last failure")
    for column in table.columns[1:5]:
        column.justify = "right"
    now = time.time()
    for info in listed:
        last = info["last_failure"]
        failure = Text("")
        if last is not None:
            lines = (last["error"] or "").strip().splitlines() or [""]
            ago = duration(now - last["at"])
            failure = Text(f"#{last['revision']}, {ago} ago: {lines[-1]}", "red")
        figures = (f"{info[field]:,}" for field in ("position", "lag", "delivered", "failed"))
        table.add_row(Text(info["name"]), *figures, failure)
    return table


def _none(what: str) -> RenderableType:
    from rich.text import Text

    return Text(f"({what})", style="dim")


COMMANDS: Final = (history, clear, locks, subscribers)
