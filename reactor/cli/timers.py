"""``reactor timers``: list the pending timers, add one, cancel one."""

from __future__ import annotations

import functools
from typing import Final

import click

from . import options
from .group import Group
from .output import timers_view, value_view

__all__ = ["COMMANDS"]


@click.group(cls=Group, invoke_without_command=True)
@click.option("--scope", "pattern", default="*", metavar="GLOB", help="Only these scopes' timers.")
@options.limit_option("At most N timers: the N due first.")
@options.data_options()
@click.pass_context
def timers(ctx: click.Context, pattern: str, limit: int | None) -> None:
    """List the pending timers, earliest first (add, cancel: see below)."""
    if ctx.invoked_subcommand is None:
        found = options.command_state().timers(pattern)
        options.command_output().show([timer._asdict() for timer in found[:limit]], timers_view)


@timers.command("add", context_settings={"ignore_unknown_options": True})
@click.argument("scope", callback=options.writable_scope)
@click.argument("key")
@click.argument("value")
@click.option("--after", type=float, metavar="SECONDS", help="Due this many seconds from now.")
@click.option("--at", type=float, metavar="EPOCH", help="Due at this time (epoch seconds).")
@click.option("--every", type=float, metavar="SECONDS", help="Again every SECONDS.")
@click.option(
    "--cron",
    metavar="EXPR",
    help="At each time the cron expression names (five fields: '0 9 * * MON-FRI').",
)
@click.option("--tz", metavar="ZONE", help="The IANA time zone of --cron (default UTC).")
@click.option("--ops", is_flag=True, help="VALUE is a list of update ops (as update takes).")
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
        timer = schedule(key, ops=options.parse_json(value, "OPS"))
    else:
        timer = schedule(key, options.parse_json(value, "VALUE", value=True))
    options.command_output().show(timer._asdict(), value_view)


@timers.command("cancel")
@click.argument("timer_id", metavar="ID")
@options.data_options()
def cancel_timer(timer_id: str) -> None:
    """Cancel the pending timer ID."""
    if not options.command_state(create=True).cancel_timer(timer_id):
        raise click.ClickException(f"no pending timer {timer_id!r}")
    options.command_output().show({"cancelled": timer_id}, value_view)


COMMANDS: Final = (timers,)
