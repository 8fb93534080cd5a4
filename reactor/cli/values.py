"""The commands on keys and values: get, set, update, delete, incr, ttl, exists, mget,
expire, persist, and the listings (keys, list, scopes, stats)."""

from __future__ import annotations

from typing import Final

import click

from reactor._base.keys import compile_pattern

from .group import Command
from .options import (
    command_output,
    command_state,
    data_options,
    limit_option,
    parse_json,
    writable_scope,
)
from .output import (
    change_view,
    deleted_view,
    items_view,
    keys_view,
    scopes_view,
    stats_view,
    ttl_view,
    update_view,
    value_view,
)

__all__ = ["COMMANDS"]

_ABSENT: Final = object()


@click.command(cls=Command, context_settings={"ignore_unknown_options": True})  # --default -1
@click.argument("scope")
@click.argument("key")
@click.option("--default", metavar="JSON", help="Print this when the key is absent, not an error.")
@data_options(raw=True)
def get(scope: str, key: str, default: str | None) -> None:
    """Print the value of KEY in SCOPE.

    JSON when piped (--raw: a string as its plain text); exit status 1 if there is no
    such key (unless --default).
    """
    fallback = _ABSENT if default is None else parse_json(default, "--default", value=True)
    value = command_state().scope(scope).get(key, _ABSENT)
    if value is _ABSENT:
        if fallback is _ABSENT:
            raise click.ClickException(f"no key {key!r} in scope {scope!r}")
        value = fallback
    command_output().value(value, value_view)


# ignore_unknown_options: for a value of -1
@click.command("set", cls=Command, context_settings={"ignore_unknown_options": True})
@click.argument("scope", callback=writable_scope)
@click.argument("key")
@click.argument("value", metavar="JSON")
@click.option(
    "--ttl",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Expire the key after this many seconds (no expiry without it).",
)
@click.option("--keep-ttl", is_flag=True, help="Keep the expiry the key had.")
@data_options()
def set_value(scope: str, key: str, value: str, ttl: float | None, keep_ttl: bool) -> None:
    """Set KEY in SCOPE to a JSON value.

    The value is JSON (- reads it from stdin): quote strings, '"text"'. Prints the old
    value and the new one.
    """
    if ttl is not None and keep_ttl:
        raise click.UsageError("--ttl and --keep-ttl exclude each other")
    data = parse_json(value, "the value", value=True)
    change = command_state(create=True).scope(scope).set(key, data, ttl=ttl, keep_ttl=keep_ttl)
    command_output().show(
        {"old_value": change.old_value, "new_value": change.new_value}, change_view
    )


@click.command(cls=Command)
@click.argument("scope", callback=writable_scope)
@click.argument("key")
@click.argument("ops", metavar="OPS_JSON")
@click.option("--atomic", is_flag=True, help="All the update ops or none (a JSON Patch always).")
@data_options()
def update(scope: str, key: str, ops: str, atomic: bool) -> None:
    """Apply update ops or a JSON Patch to KEY.

    OPS_JSON is a list of update ops ({"type": ...}) or a JSON Patch ({"op": ...}), or
    one op alone. Prints the old value, the new one and the ops that did not apply;
    exit status 1 if any did not.
    """
    parsed = parse_json(ops, "OPS_JSON")
    if isinstance(parsed, dict):
        parsed = [parsed]
    result = command_state(create=True).scope(scope).update(key, parsed, atomic=atomic or None)
    data = {"old_value": result.old_value, "new_value": result.new_value, "errors": result.errors}
    command_output().show(data, update_view)
    if result.errors:
        failed = len(result.errors)
        click.echo(f"Error: {failed} of {len(parsed)} ops did not apply", err=True)
        click.get_current_context().exit(1)


@click.command(cls=Command)
@click.argument("scope", callback=writable_scope)
@click.argument("key")
@data_options()
def delete(scope: str, key: str) -> None:
    """Delete KEY from SCOPE.

    Prints whether it existed and the value it had.
    """
    handle = command_state(create=True).scope(scope)
    existed = handle.exists(key)
    old = handle.delete(key)
    command_output().show({"deleted": existed or old is not None, "old_value": old}, deleted_view)


@click.command(cls=Command, context_settings={"ignore_unknown_options": True})  # a step of -1
@click.argument("scope", callback=writable_scope)
@click.argument("key")
@click.argument("by", metavar="[BY]", default="1")
@data_options(raw=True)
def incr(scope: str, key: str, by: str) -> None:
    """Add BY (default 1) to the number at KEY.

    BY may be negative or a float; a missing key starts at 0. Prints the new number.
    """
    step = parse_json(by, "BY")
    total = command_state(create=True).scope(scope).increment(key, step)
    command_output().value(total, value_view)


@click.command(cls=Command)
@click.argument("scope")
@click.argument("key")
@data_options(raw=True)
def ttl(scope: str, key: str) -> None:
    """Print the seconds KEY has left.

    -1 if it has no expiry, -2 if it does not exist (as Redis TTL).
    """
    left = command_state().scope(scope).ttl(key)
    command_output().value(int(left) if left in (-1, -2) else round(left, 3), ttl_view)


@click.command(cls=Command)
@click.argument("scope")
@click.argument("names", metavar="KEY...", nargs=-1, required=True)
@data_options(raw=True)
def exists(scope: str, names: tuple[str, ...]) -> None:
    """Print how many of the KEYs exist in SCOPE (a key named twice counts twice, as
    Redis EXISTS)."""
    handle = command_state().scope(scope)
    command_output().value(sum(1 for key in names if handle.exists(key)), value_view)


@click.command(cls=Command)
@click.argument("scope")
@click.argument("names", metavar="KEY...", nargs=-1, required=True)
@data_options()
def mget(scope: str, names: tuple[str, ...]) -> None:
    """Print the values of the KEYs in SCOPE, in order: a JSON list, null for a key
    that does not exist (as Redis MGET)."""
    found = command_state().scope(scope).get_many(names)
    command_output().value([found.get(key) for key in names], value_view)


@click.command(cls=Command)
@click.argument("scope", callback=writable_scope)
@click.argument("key")
@click.argument("seconds", type=click.FloatRange(min=0, min_open=True))
@data_options(raw=True)
def expire(scope: str, key: str, seconds: float) -> None:
    """Expire KEY in SECONDS from now; print whether it exists (and so got it)."""
    done = command_state(create=True).scope(scope).expire(key, seconds)
    command_output().value(done, value_view)


@click.command(cls=Command)
@click.argument("scope", callback=writable_scope)
@click.argument("key")
@data_options(raw=True)
def persist(scope: str, key: str) -> None:
    """Take KEY's expiry off; print whether it exists."""
    done = command_state(create=True).scope(scope).expire(key, None)
    command_output().value(done, value_view)


@click.command(cls=Command)
@click.argument("scope")
@click.argument("pattern", default="*")
@limit_option("At most N keys: the first N, in sorted order.")
@data_options(raw=True)
def keys(scope: str, pattern: str, limit: int | None) -> None:
    """List the keys of SCOPE, sorted.

    PATTERN is a glob as in Redis KEYS: * ? [abc] [a-z] [!a], \\ to escape. --raw
    prints one key per line.
    """
    found = command_state().scope(scope).keys(pattern)
    command_output().lines(found[:limit], keys_view)


@click.command("list", cls=Command)
@click.argument("scope")
@click.argument("pattern", default="*")
@limit_option("At most N keys with their values: the first N, in sorted order.")
@data_options()
def list_items(scope: str, pattern: str, limit: int | None) -> None:
    """Print the keys of SCOPE with their values.

    Only the keys matching the glob PATTERN, if given; sorted by key.
    """
    match = compile_pattern(pattern)
    items = command_state().scope(scope).list()
    found = [(key, value) for key, value in items.items() if match.matches(key)]
    command_output().show(dict(found[:limit]), items_view)


@click.command(cls=Command)
@data_options()
def scopes() -> None:
    """List the scopes, with their key counts."""
    counts = command_state().stats()["scopes"]
    command_output().show(dict(sorted(counts.items())), scopes_view)


@click.command(cls=Command)
@data_options()
def stats() -> None:
    """Print the database's figures, as every process sees them.

    Keys (in all and by scope), the change log, jobs by queue and state, timers and the
    oldest due one's lag, locks held, durable subscribers' lag, size and revision.
    """
    from reactor.metrics import figures

    command_output().show(figures(command_state()), stats_view)


COMMANDS: Final = (
    get,
    set_value,
    update,
    delete,
    incr,
    ttl,
    exists,
    mget,
    expire,
    persist,
    keys,
    list_items,
    scopes,
    stats,
)
