"""``reactor timers``: list the pending timers, add one, cancel one."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Final

import click

from . import options
from .complete import complete_key, complete_scope
from .group import USAGE, Group, failure
from .output import short_ids, timers_view, value_view

if TYPE_CHECKING:
    from reactor._base.results import Timer

__all__ = ["COMMANDS"]

_PREFIX_MIN: Final = 4  # a shorter id is taken whole: "" or "0" names no timer


@click.group(cls=Group, invoke_without_command=True)
@click.option(
    "--scope",
    "pattern",
    default="*",
    metavar="GLOB",
    shell_complete=complete_scope,
    help="Only these scopes' timers.",
)
@options.limit_option("At most N timers: the N due first.")
@options.data_options()
@click.pass_context
def timers(ctx: click.Context, pattern: str, limit: int | None) -> None:
    """List the pending timers, earliest first (add, cancel: see below).

    A table shows each id by its shortest unique prefix (8 characters at least), which
    cancel takes; JSON has the whole ids.
    """
    if ctx.invoked_subcommand is None:
        state = options.command_state()
        found = state.timers(pattern)
        short = short_ids([timer.id for timer in state.timers()])
        view = functools.partial(timers_view, short=short)
        options.command_output().show([timer._asdict() for timer in found[:limit]], view)


@timers.command("add", context_settings={"ignore_unknown_options": True})
@click.argument("scope", callback=options.writable_scope, shell_complete=complete_scope)
@click.argument("key", shell_complete=complete_key)
@click.argument("value")
@click.option("--after", type=float, metavar="SECONDS", help="Due this many seconds from now.")
@click.option("--at", type=float, metavar="EPOCH", help="Due at this time (epoch seconds).")
@click.option(
    "--every",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Again every SECONDS.",
)
@click.option(
    "--cron",
    metavar="EXPR",
    help="At each time the cron expression names (five fields: '0 9 * * MON-FRI').",
)
@click.option("--tz", metavar="ZONE", help="The IANA time zone of --cron (default UTC).")
@click.option("--ops", is_flag=True, help="VALUE is a list of update ops (as update takes).")
@options.string_option()
@options.data_options()
def add_timer(
    scope: str,
    key: str,
    value: str,
    after: float | None,
    at: float | None,
    every: float | None,
    cron: str | None,
    tz: str | None,
    ops: bool,
) -> None:
    """Schedule a write of VALUE (JSON) to KEY in SCOPE; print the timer."""
    target = options.command_state(create=True).scope(scope)
    schedule = functools.partial(target.schedule, after=after, at=at, every=every, cron=cron, tz=tz)
    if ops:
        if click.get_current_context().meta.get("reactor.string"):
            raise click.UsageError("--ops and --string exclude each other")
        timer = schedule(key, ops=options.parse_json(value, "OPS"))
    else:
        timer = schedule(key, options.parse_json(value, "VALUE", value=True))
    options.command_output().show(timer._asdict(), value_view)


@timers.command("cancel")
@click.argument("timer_id", metavar="ID")
@options.data_options()
def cancel_timer(timer_id: str) -> None:
    """Cancel the pending timer ID (or the one whose id begins with ID, as git takes a
    commit's; exit status 2 if several do)."""
    state = options.command_state(create=True)
    whole = _whole_id(state.timers(), timer_id)
    if not state.cancel_timer(whole):
        raise failure(f"no pending timer {timer_id!r}")
    options.command_output().show({"cancelled": whole}, value_view)


def _whole_id(pending: list[Timer], given: str) -> str:
    """The id of the pending timer ``given`` names, whole or by a unique prefix (of
    ``_PREFIX_MIN`` characters at least, as git's); ``given`` itself if none does."""
    if len(given) < _PREFIX_MIN:
        return given
    ids = [timer.id for timer in pending if timer.id.startswith(given)]
    if given in ids or len(ids) <= 1:
        return given if given in ids or not ids else ids[0]
    shown = ", ".join(sorted(ids)[:5]) + (", ..." if len(ids) > 5 else "")
    raise failure(f"{len(ids)} pending timers begin with {given!r}: {shown}", USAGE)


COMMANDS: Final = (timers,)
