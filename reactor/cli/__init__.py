"""The ``reactor`` command line: a scope's verbs, the live change feed, export and import,
and a web dashboard (``reactor ui``).

Every data command works on ``--db`` (else ``$REACTOR_DB``, else ``~/.reactor/state.db``).
A command's result is JSON when stdout is piped, a table on a terminal (``--json`` and
``--table`` choose instead; ``--raw`` prints a string value as its text, as
``redis-cli --raw`` does). Errors are one line on stderr, ``Error: ...``, with exit
status 1 (2 for usage errors, with a "did you mean" for a misspelled command or option)
and no traceback: reactor's errors are turned into click's in one place, ``_Group.invoke``.

Start-up is kept short (a command is often one call in a shell loop): what only some
commands use (rich, the demo, the dashboard, the bench) is imported in those commands.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from reactor import open as open_state
from reactor._backup import exchange as _exchange
from reactor._base.keys import check_writable, compile_pattern
from reactor._handles.state import State
from reactor._storage.locate import locate
from reactor.errors import ReactorError, ReadOnlyError

from .output import (
    Output,
    change_view,
    deleted_view,
    items_view,
    job_id_view,
    job_view,
    jobs_view,
    keys_view,
    queue_stats_view,
    scopes_view,
    stats_view,
    timers_view,
    ttl_view,
    update_view,
    value_view,
)

F = TypeVar("F", bound=Callable[..., Any])

_DB: Final = "reactor.db"  # ctx.meta keys: what --db and --json/--table said, if anything
_AS_JSON: Final = "reactor.as_json"
_RAW: Final = "reactor.raw"
_ABSENT: Final = object()
_DEMO_DATABASE: Final = "reactor-demo.db"  # _demo.DEMO_DATABASE (_demo imports rich)
_UI_PACKAGES: Final = frozenset({"starlette", "uvicorn", "sse_starlette", "anyio", "h11"})
_WATCH_JOIN: Final = 5.0  # seconds for the printing thread to end once the watch closes
_DB_HELP: Final = (
    "The database: a file path, sqlite:///PATH or postgresql+psycopg://USER@HOST/DB "
    "[default: $REACTOR_DB, else ~/.reactor/state.db]."
)
_RAW_HELP: Final = (
    "Print a string value as its plain text, without quotes or escapes, and keys one per "
    "line (get, incr, ttl, keys; other values as JSON)."
)
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


class _Command(click.Command):
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


class _Group(click.Group):
    """A command group whose commands' reactor errors end as click's: one line on
    stderr, ``Error: ...``, exit status 1; a misspelled command gets a "did you mean"."""

    command_class = _Command

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
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # the reader went away (| head): click exits quietly
            raise click.ClickException(str(exc)) from None


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    # Given to the group or to the command: the command's, parsed last, wins.
    if value is not None:
        ctx.meta[f"reactor.{param.name}"] = value
    return value


def _remember_flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    # A flag is False when not given: only a given one may win over the group's.
    if value:
        ctx.meta[f"reactor.{param.name}"] = True
    return value


def _options(*, envvar: str | None = None, raw: bool = False) -> Callable[[F], F]:
    """``--db`` and ``--json/--table``, for the group and again for each data command;
    ``--raw`` too where ``raw`` (the group, and the commands that print single values)."""

    def decorate(command: F) -> F:
        if raw:
            command = click.option(
                "--raw", is_flag=True, expose_value=False, callback=_remember_flag, help=_RAW_HELP
            )(command)
        command = click.option(
            "--json/--table",
            "as_json",
            default=None,
            expose_value=False,
            callback=_remember,
            help="Print JSON, or tables [default: JSON when piped, tables on a terminal].",
        )(command)
        return click.option(
            "--db",
            metavar="PATH|URL",
            envvar=envvar,
            expose_value=False,
            callback=_remember,
            help=_DB_HELP,
        )(command)

    return decorate


def _state(*, create: bool = False) -> State:
    """Open the database for the running command; it closes when the command ends.

    Only writes create a database: a read on a file that does not exist is an error.
    Reads open it read-only, so that they work on a database the user may read but not
    write; one that cannot be read without a write first (a migration to this version,
    a new PostgreSQL schema) is opened read-write, as it always was, where it can be.
    """
    ctx = click.get_current_context()
    target: str | None = ctx.meta.get(_DB)
    if not create:
        _, location = locate(target, "normal")
        if isinstance(location, Path) and not location.exists():
            raise click.ClickException(f"no database at {location}")
        if location is not None:  # a file or a server: in memory, nothing to read
            try:
                return ctx.with_resource(open_state(target, readonly=True))
            except ReadOnlyError as refused:
                try:
                    return ctx.with_resource(open_state(target))
                except ReadOnlyError:
                    raise refused from None  # why it could not be read, not written
    return ctx.with_resource(open_state(target))


def _writable_scope(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """The SCOPE of a write command: a scope of events (``queue:NAME``) is a usage
    error, caught before any database is opened or created."""
    try:
        return check_writable(value)
    except ReactorError as exc:
        raise click.BadParameter(str(exc)) from None


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # click.version_option, but importing importlib.metadata only when asked.
    if value and not ctx.resilient_parsing:
        from reactor._version import __version__

        click.echo(f"reactor, version {__version__}")
        ctx.exit()


def _output() -> Output:
    meta = click.get_current_context().meta
    return Output(meta.get(_AS_JSON), raw=meta.get(_RAW, False))


def _json(text: str, what: str, *, value: bool = False) -> Any:
    """Parse a JSON argument (``-`` reads it from stdin); ``value``: one to store, which
    may be a bare word meant as a string."""
    if text == "-":
        text = sys.stdin.read()
    try:
        return _exchange.parse_json(text)
    except ValueError as exc:
        shown = text if len(text) <= 40 else text[:37] + "..."
        hint = (
            " (a string goes in double quotes: '\"text\"')" if value and text[:1].isalpha() else ""
        )
        raise click.ClickException(f"{what} is not JSON: {shown!r}: {exc}{hint}") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@_options(envvar="REACTOR_DB", raw=True)
def cli() -> None:
    """reactor: persistent, reactive JSON state in named scopes.

    Values and ops are JSON ('{"total": 120}', '"text"', 42). Results print as JSON when
    piped and as tables on a terminal (--raw: strings as plain text); errors go to
    stderr with exit status 1.
    """


# -- values ----------------------------------------------------------------------
@cli.command(context_settings={"ignore_unknown_options": True})  # --default -1
@click.argument("scope")
@click.argument("key")
@click.option("--default", metavar="JSON", help="Print this when the key is absent, not an error.")
@_options(raw=True)
def get(scope: str, key: str, default: str | None) -> None:
    """Print the value of KEY in SCOPE.

    JSON when piped (--raw: a string as its plain text); exit status 1 if there is no
    such key (unless --default).
    """
    fallback = _ABSENT if default is None else _json(default, "--default", value=True)
    value = _state().scope(scope).get(key, _ABSENT)
    if value is _ABSENT:
        if fallback is _ABSENT:
            raise click.ClickException(f"no key {key!r} in scope {scope!r}")
        value = fallback
    _output().value(value, value_view)


@cli.command("set", context_settings={"ignore_unknown_options": True})  # a value of -1
@click.argument("scope", callback=_writable_scope)
@click.argument("key")
@click.argument("value", metavar="JSON")
@click.option(
    "--ttl",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Expire the key after this many seconds (no expiry without it).",
)
@click.option("--keep-ttl", is_flag=True, help="Keep the expiry the key had.")
@_options()
def set_value(scope: str, key: str, value: str, ttl: float | None, keep_ttl: bool) -> None:
    """Set KEY in SCOPE to a JSON value.

    The value is JSON (- reads it from stdin): quote strings, '"text"'. Prints the old
    value and the new one.
    """
    if ttl is not None and keep_ttl:
        raise click.UsageError("--ttl and --keep-ttl exclude each other")
    data = _json(value, "the value", value=True)
    change = _state(create=True).scope(scope).set(key, data, ttl=ttl, keep_ttl=keep_ttl)
    _output().show({"old_value": change.old_value, "new_value": change.new_value}, change_view)


@cli.command()
@click.argument("scope", callback=_writable_scope)
@click.argument("key")
@click.argument("ops", metavar="OPS_JSON")
@click.option("--atomic", is_flag=True, help="All the update ops or none (a JSON Patch always).")
@_options()
def update(scope: str, key: str, ops: str, atomic: bool) -> None:
    """Apply update ops or a JSON Patch to KEY.

    OPS_JSON is a list of update ops ({"type": ...}) or a JSON Patch ({"op": ...}), or
    one op alone. Prints the old value, the new one and the ops that did not apply;
    exit status 1 if any did not.
    """
    parsed = _json(ops, "OPS_JSON")
    if isinstance(parsed, dict):
        parsed = [parsed]
    result = _state(create=True).scope(scope).update(key, parsed, atomic=atomic or None)
    data = {"old_value": result.old_value, "new_value": result.new_value, "errors": result.errors}
    _output().show(data, update_view)
    if result.errors:
        failed = len(result.errors)
        click.echo(f"Error: {failed} of {len(parsed)} ops did not apply", err=True)
        click.get_current_context().exit(1)


@cli.command()
@click.argument("scope", callback=_writable_scope)
@click.argument("key")
@_options()
def delete(scope: str, key: str) -> None:
    """Delete KEY from SCOPE.

    Prints whether it existed and the value it had.
    """
    handle = _state(create=True).scope(scope)
    existed = handle.exists(key)
    old = handle.delete(key)
    _output().show({"deleted": existed or old is not None, "old_value": old}, deleted_view)


@cli.command(context_settings={"ignore_unknown_options": True})  # a step of -1
@click.argument("scope", callback=_writable_scope)
@click.argument("key")
@click.argument("by", metavar="[BY]", default="1")
@_options(raw=True)
def incr(scope: str, key: str, by: str) -> None:
    """Add BY (default 1) to the number at KEY.

    BY may be negative or a float; a missing key starts at 0. Prints the new number.
    """
    step = _json(by, "BY")
    total = _state(create=True).scope(scope).increment(key, step)
    _output().value(total, value_view)


@cli.command()
@click.argument("scope")
@click.argument("key")
@_options(raw=True)
def ttl(scope: str, key: str) -> None:
    """Print the seconds KEY has left.

    -1 if it has no expiry, -2 if it does not exist (as Redis TTL).
    """
    left = _state().scope(scope).ttl(key)
    _output().value(int(left) if left in (-1, -2) else round(left, 3), ttl_view)


# -- listings --------------------------------------------------------------------
def _limit(help_text: str) -> Callable[[F], F]:
    return click.option("--limit", type=click.IntRange(min=1), metavar="N", help=help_text)


@cli.command()
@click.argument("scope")
@click.argument("pattern", default="*")
@_limit("At most N keys: the first N, in sorted order.")
@_options(raw=True)
def keys(scope: str, pattern: str, limit: int | None) -> None:
    """List the keys of SCOPE, sorted.

    PATTERN is a glob as in Redis KEYS: * ? [abc] [a-z] [!a], \\ to escape. --raw
    prints one key per line.
    """
    found = _state().scope(scope).keys(pattern)
    _output().lines(found[:limit], keys_view)


@cli.command("list")
@click.argument("scope")
@click.argument("pattern", default="*")
@_limit("At most N keys with their values: the first N, in sorted order.")
@_options()
def list_items(scope: str, pattern: str, limit: int | None) -> None:
    """Print the keys of SCOPE with their values.

    Only the keys matching the glob PATTERN, if given; sorted by key.
    """
    match = compile_pattern(pattern)
    items = _state().scope(scope).list()
    found = [(key, value) for key, value in items.items() if match.matches(key)]
    _output().show(dict(found[:limit]), items_view)


@cli.command()
@_options()
def scopes() -> None:
    """List the scopes, with their key counts."""
    counts = _state().stats()["scopes"]
    _output().show(dict(sorted(counts.items())), scopes_view)


@cli.command()
@_options()
def stats() -> None:
    """Print the database's figures.

    Keys per scope, size and revision, with this process's own counters.
    """
    _output().show(_state().stats(), stats_view)


# -- timers ----------------------------------------------------------------------
@cli.group(cls=_Group, invoke_without_command=True)
@click.option("--scope", "pattern", default="*", metavar="GLOB", help="Only these scopes' timers.")
@_limit("At most N timers: the N due first.")
@_options()
@click.pass_context
def timers(ctx: click.Context, pattern: str, limit: int | None) -> None:
    """List the pending timers, earliest first (add, cancel: see below)."""
    if ctx.invoked_subcommand is None:
        found = _state().timers(pattern)
        _output().show([timer._asdict() for timer in found[:limit]], timers_view)


@timers.command("add", context_settings={"ignore_unknown_options": True})
@click.argument("scope", callback=_writable_scope)
@click.argument("key")
@click.argument("value")
@click.option("--after", type=float, metavar="SECONDS", help="Due this many seconds from now.")
@click.option("--at", type=float, metavar="EPOCH", help="Due at this time (epoch seconds).")
@click.option("--every", type=float, metavar="SECONDS", help="Again every SECONDS.")
@click.option("--ops", is_flag=True, help="VALUE is a list of update ops (as update takes).")
@_options()
def add_timer(
    scope: str,
    key: str,
    value: str,
    after: float | None,
    at: float | None,
    every: float | None,
    ops: bool,
) -> None:
    """Schedule a write of VALUE (JSON) to KEY in SCOPE; print the timer."""
    target = _state(create=True).scope(scope)
    if ops:
        given = _json(value, "OPS")
        timer = target.schedule(key, after=after, at=at, every=every, ops=given)
    else:
        timer = target.schedule(
            key, _json(value, "VALUE", value=True), after=after, at=at, every=every
        )
    _output().show(timer._asdict(), value_view)


@timers.command("cancel")
@click.argument("timer_id", metavar="ID")
@_options()
def cancel_timer(timer_id: str) -> None:
    """Cancel the pending timer ID."""
    if not _state(create=True).cancel_timer(timer_id):
        raise click.ClickException(f"no pending timer {timer_id!r}")
    _output().show({"cancelled": timer_id}, value_view)


# -- the change feed -------------------------------------------------------------
@cli.command()
@click.option("--scope", metavar="GLOB", help="Only scopes matching this glob.")
@click.option("--key", metavar="GLOB", help="Only keys matching this glob.")
@click.option(
    "--since",
    type=click.IntRange(min=0),
    metavar="REV",
    help="First replay the recorded changes after this revision.",
)
@click.option(
    "--limit",
    "--count",
    "count",
    type=click.IntRange(min=1),
    metavar="N",
    help="Stop after N changes (replayed ones included).",
)
@_options()
def watch(scope: str | None, key: str | None, since: int | None, count: int | None) -> None:
    """Print changes live, from every process.

    One JSON line per change when piped, flushed as it comes. Runs until Ctrl-C (exit
    status 0) or --limit changes.
    """
    state = _state()
    output = _output()
    stop = threading.Event()
    failed: list[BaseException] = []

    def on_signal(*_: object) -> None:
        stop.set()  # no KeyboardInterrupt: it could land inside the engine, mid-lock

    # Ctrl-C and SIGTERM (kill, docker stop) end the watch cleanly, with status 0. The
    # events are printed by a thread of their own, so that the main thread, the one
    # signals reach, only waits.
    previous = {sent: signal.signal(sent, on_signal) for sent in (signal.SIGINT, signal.SIGTERM)}
    try:
        with state.watch(since=since, scope=scope, key=key) as feed:

            def pump() -> None:
                try:
                    for seen, event in enumerate(feed, 1):
                        output.event(event)
                        if count is not None and seen >= count:
                            break
                except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
                    failed.append(exc)
                finally:
                    stop.set()

            click.echo(f"watching {state.location} (Ctrl-C to stop)", err=True)
            printer = threading.Thread(target=pump, name="reactor-watch", daemon=True)
            printer.start()
            while not stop.wait(0.25):
                pass
        printer.join(_WATCH_JOIN)  # the watch is closed: its iteration has ended
    finally:
        for sent, handler in previous.items():
            signal.signal(sent, handler)
    if failed:
        raise failed[0]


# -- backup ----------------------------------------------------------------------
@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True), default="-")
@click.option(
    "--scope", "pattern", metavar="GLOB", default="*", help="Only scopes matching this glob."
)
@click.option(
    "--only",
    "kinds",
    type=click.Choice(_exchange.KINDS),
    multiple=True,
    help="Export only keys, timers or queues (repeat for more; default: all).",
)
@_options()
def export(file: str, pattern: str, kinds: tuple[str, ...]) -> None:
    """Write keys, timers and queues as JSON Lines (a backup).

    One line per key: {"scope", "key", "value", "ttl"}, ttl being the seconds left
    (null: no expiry); per pending timer: {"timer", "scope", "key", "value" or "ops",
    "due_in", "every"}; per queue: {"queue", "max_attempts"}, then per job: {"queue",
    "item", "attempts", "state", "ready_in", "key"}. With --scope, timers of the
    matching scopes go too, queues do not. To FILE or stdout. A regular FILE is
    replaced once the export is complete; anything else (a symlink, a FIFO, a device)
    is written through and stays what it was. On a terminal, a long export shows its
    progress on stderr.
    """
    from .progress import terminal_progress

    if "queues" in kinds and not compile_pattern(pattern).matches_all:
        raise click.UsageError("queues belong to no scope: export them without --scope")
    chosen = kinds or _exchange.KINDS
    state = _state()
    if file == "-" or _is_stdout(file):  # /dev/stdout too: no summary among the lines
        # Lines going to the terminal would be mixed with the bar: drawn only when piped.
        with (
            terminal_progress(shown=not sys.stdout.isatty()) as progress,
            click.open_file("-", "w", encoding="utf-8") as stdout,
        ):
            _exchange.dump(state, stdout, pattern, progress, chosen)
        return
    with terminal_progress() as progress:
        tally = _exchange.dump_file(state, file, pattern, progress, chosen)
    from rich.text import Text

    _output().show(
        {"exported": tally.total, **_counted(tally), "file": file},
        lambda data: Text(f"{_summary(data)} written to {data['file']}"),
    )


def _is_stdout(path: str) -> bool:
    """Whether ``path`` leads to this process's standard output (``/dev/stdout``, or
    the file or pipe it is redirected to)."""
    try:
        there, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):
        return False
    return (there.st_dev, there.st_ino) == (out.st_dev, out.st_ino)


@cli.command("import")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, allow_dash=True), default="-")
@_options()
def import_lines(file: str) -> None:
    """Restore an export (JSON Lines): keys, timers, queues and jobs.

    Reads FILE or stdin. Every line is checked first: if one is bad, nothing is
    imported. Then everything is written in one transaction: a failure, or Ctrl-C,
    leaves the database as it was. Keys take the TTL they had left when exported,
    timers the time they had until due. Jobs are added to their queues (with new ids),
    but for one whose idempotency key a job of the queue holds: it is skipped. On a
    terminal, a long import shows its progress on stderr.
    """
    from rich.text import Text

    from .progress import terminal_progress

    # Entered before the database opens, so that it is left after it closes.
    shield = click.get_current_context().with_resource(_CommitShield())
    with terminal_progress() as progress:
        with click.open_file(file, "rb") as lines:
            found = _exchange.read(lines, progress)
        tally = _exchange.write(_state(create=True), found, progress, staged=shield.raise_up)
    _output().show(
        {"imported": tally.total, **_counted(tally), "skipped": tally.skipped},
        lambda data: Text(f"{_summary(data)} imported{_skipped(data['skipped'])}"),
    )


class _CommitShield:
    """Ctrl-C aborts an import until its writes are staged, and not after: from then
    on the commit may happen at any moment, and once it has, the import has succeeded
    (a rerun would add its jobs again). ``raise_up`` marks that moment; a Ctrl-C
    after it is noted (``interrupted``) and the command ends as it would have.

    The handler is the process's own (the CLI's main thread), so a Ctrl-C never lands
    between the commit and what reports it."""

    def __init__(self) -> None:
        self.shielded = False
        self.interrupted = False
        self._previous: Any = None

    def raise_up(self) -> None:
        self.shielded = True

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.shielded:
            self.interrupted = True
            return
        signal.default_int_handler(signum, frame)

    def __enter__(self) -> _CommitShield:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *_: object) -> None:
        # Once the commit may have happened, the handler stays to the process's end:
        # a Ctrl-C between here and the exit would still turn success into "Aborted!".
        if self._previous is not None and not self.shielded:
            signal.signal(signal.SIGINT, self._previous)
        if self.interrupted:
            click.echo("Ctrl-C came after the commit: everything was imported.", err=True)


def _counted(tally: _exchange.Tally) -> dict[str, int]:
    return {"keys": tally.keys, "timers": tally.timers, "queues": tally.queues, "jobs": tally.jobs}


def _summary(data: dict[str, Any]) -> str:
    """'12 keys', or '12 keys, 2 timers, 1 queue and 3 jobs': the kinds there are."""
    parts = [_plural(data["keys"], "key")]
    parts += [_plural(data[kind], kind[:-1]) for kind in ("timers", "queues", "jobs") if data[kind]]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _skipped(count: int) -> str:
    if not count:
        return ""
    their = "its" if count == 1 else "their"
    return f" ({_plural(count, 'job')} skipped: already queued under {their} idempotency key)"


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


# -- work queues -----------------------------------------------------------------
@cli.group(cls=_Group)
@_options()
def queue() -> None:
    """Work queues: put jobs, take and acknowledge them, see and retry dead ones.

    A job taken here is yours for its lease: finish it with 'reactor queue ack NAME ID
    TOKEN' (or nack) before the lease runs out, or it is ready again. 'take --ack'
    takes and acknowledges at once.
    """


@queue.command("put", context_settings={"ignore_unknown_options": True})  # an item of -1
@click.argument("name")
@click.argument("item", metavar="JSON")
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Ready only this many seconds from now.",
)
@click.option(
    "--key",
    metavar="KEY",
    help="An idempotency key: while a job of the queue holds it, a put with it adds nothing.",
)
@_options()
def queue_put(name: str, item: str, delay: float | None, key: str | None) -> None:
    """Add a job to queue NAME; print its id.

    JSON is the job's item (- reads it from stdin): quote strings, '"text"'. With
    --key, a job the queue holds already under that key keeps it: its id is printed.
    """
    data = _json(item, "the item", value=True)
    job_id = _state(create=True).queue(name).put(data, delay=delay, key=key)
    _output().show({"id": job_id}, job_id_view)


@queue.command("take")
@click.argument("name")
@click.option(
    "--lease",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the job is yours: ack it before, or it is ready again.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0.0,
    metavar="SECONDS",
    help="Wait up to this long for a job ('inf': until one comes) [default: 0, look once].",
)
@click.option("--ack", "ack", is_flag=True, help="Acknowledge the job at once: done when printed.")
@_options()
def queue_take(name: str, lease: float, timeout: float, ack: bool) -> None:
    """Take the next ready job of queue NAME; print it.

    Prints {"id", "item", "attempts", "token"}: give ID and TOKEN to 'reactor queue ack'
    (or nack) within the lease. With --ack, the job is acknowledged as it is printed (at
    most once: if this command fails after, the job is gone). Exit status 1 if no job
    came within --timeout.
    """
    job = _state(create=True).queue(name).take(timeout=timeout, lease=lease)
    if job is None:
        waited = f" within {timeout:g} s" if timeout else ""
        raise click.ClickException(f"no job ready in queue {name!r}{waited}")
    data: dict[str, Any] = {"id": job.id, "item": job.item, "attempts": job.attempts}
    if ack:
        job.ack()
    else:
        data["token"] = job._token
    _output().show(data, job_view)


def _job_arguments(command: F) -> F:
    command = click.argument("token")(command)
    command = click.argument("job_id", metavar="ID", type=click.IntRange(min=1))(command)
    return click.argument("name")(command)


@queue.command("ack")
@_job_arguments
@_options()
def queue_ack(name: str, job_id: int, token: str) -> None:
    """Acknowledge job ID of queue NAME: it is done, and removed.

    TOKEN is what 'reactor queue take' printed. Exit status 1 if that take's lease ran
    out (the job may be someone else's now): nothing changes then.
    """
    _state(create=True).queue(name)._job(job_id, token).ack()
    _output().show({"id": job_id, "acked": True}, lambda data: _said(f"job {data['id']} done"))


@queue.command("nack")
@_job_arguments
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Ready again only this many seconds from now.",
)
@_options()
def queue_nack(name: str, job_id: int, token: str, delay: float | None) -> None:
    """Give job ID of queue NAME back: ready again (after --delay), or dead after its
    last attempt.

    TOKEN is what 'reactor queue take' printed. Exit status 1 if that take's lease ran
    out: nothing changes then.
    """
    _state(create=True).queue(name)._job(job_id, token).nack(delay)
    _output().show(
        {"id": job_id, "nacked": True}, lambda data: _said(f"job {data['id']} given back")
    )


@queue.command("stats")
@click.argument("name", required=False)
@_options()
def queue_stats(name: str | None) -> None:
    """Print how many jobs are ready, delayed, taken and dead: in queue NAME, or in
    every queue."""
    state = _state()
    if name is not None:
        _output().show(state.queue(name).stats(), lambda data: queue_stats_view({name: data}))
        return
    counts = {found: state.queue(found).stats() for found in state.queues()}
    _output().show(counts, queue_stats_view)


@queue.command("dead")
@click.argument("name")
@_limit("At most N jobs: the first N to die.")
@_options()
def queue_dead(name: str, limit: int | None) -> None:
    """List the dead jobs of queue NAME, in the order they died."""
    found = _state().queue(name).dead(limit)
    data = [{"id": job.id, "item": job.item, "attempts": job.attempts} for job in found]
    _output().show(data, jobs_view)


@queue.command("retry")
@click.argument("name")
@_options()
def queue_retry(name: str) -> None:
    """Make every dead job of queue NAME ready again, attempts back to 0; print how
    many."""
    count = _state(create=True).queue(name).retry_dead()
    _output().show({"retried": count}, lambda data: _said(f"{data['retried']:,} jobs retried"))


def _said(text: str) -> Any:
    from rich.text import Text

    return Text(text)


# -- programs --------------------------------------------------------------------
@cli.command()
@click.option("--db", metavar="PATH|URL", expose_value=False, callback=_remember, help=_DB_HELP)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDRESS",
    help="The address to listen on; anything but loopback opens the page to the network.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    metavar="N",
    show_default=True,
    help="The port to listen on (0: any free port).",
)
@click.option(
    "--write",
    is_flag=True,
    help=("Allow set, update, delete, cancelling timers and retrying dead letters from the page."),
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help=(
        "Another host name (or address) the page may be reached by; any other is refused "
        "with 400 'Invalid host header' (the loopback names are always allowed; * allows any)."
    ),
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a web browser.")
def ui(host: str, port: int, write: bool, allow_hosts: tuple[str, ...], open_browser: bool) -> None:
    """Serve a web dashboard: scopes, keys, values, stats and the live change feed.

    Read-only unless --write. Listens on 127.0.0.1 until Ctrl-C.
    """
    try:
        from reactor._ui import server
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] not in _UI_PACKAGES:
            raise
        raise click.ClickException("reactor ui needs: pip install 'reactor-state[ui]'") from None
    # Opened here, so that a bad --db is one line on stderr; the app shares the engine.
    state = _state(create=write)
    try:
        listener = server.listen(host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    url = server.url_of(listener)
    mode = "read-write" if write else "read-only"
    hosts = server.allowed_hosts(host, allow_hosts)
    # SIGTERM (kill, docker stop) ends the server as Ctrl-C does: cleanly, status 0.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with listener:
            if not server.is_loopback(host):
                click.echo(
                    f"Warning: listening on {host}, beyond this machine: whoever reaches "
                    f"{url} can read every value" + (" and change it" if write else "") + " "
                    "(no login).",
                    err=True,
                )
                # Reached by an address or a name not among these, the page is refused
                # ("Invalid host header"): say how to allow one.
                click.echo(
                    f"It answers to the host names {', '.join(hosts)} and to the "
                    "address a request reaches it on; to reach it by another name, add "
                    "--allow-host NAME.",
                    err=True,
                )
            click.echo(f"reactor ui: {state.location} at {url} ({mode}; Ctrl-C to stop)", err=True)
            if open_browser:
                import webbrowser

                webbrowser.open(url)
            server.serve(
                listener,
                click.get_current_context().meta.get(_DB),
                write=write,
                hosts=hosts,
            )
    except KeyboardInterrupt:
        pass  # how the server is meant to end
    finally:
        signal.signal(signal.SIGTERM, previous)


@cli.command()
@click.option(
    "--db",
    metavar="PATH|URL",
    default=None,
    help=f"The demo's database [default: the --db given to reactor, else {_DEMO_DATABASE} "
    "in the current folder].",
)
def demo(db: str | None) -> None:
    """Run a short program on an embedded database, and show that state survives."""
    from rich.console import Console

    from .demo import run_demo

    group = click.get_current_context().parent
    again = "reactor demo"
    # Only a --db on the command line: $REACTOR_DB names the user's own database, which
    # the demo's orders have no business in.
    if (
        db is None
        and group is not None
        and group.get_parameter_source("db") is click.core.ParameterSource.COMMANDLINE
    ):
        db = group.meta.get(_DB)
    if db is not None:
        import re
        import shlex

        shown = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", db)  # a URL's password
        again = f"reactor --db {shlex.quote(shown)} demo"
    with open_state(db or _DEMO_DATABASE) as state:
        run_demo(state, Console(), again=again)


@cli.command()
@click.option(
    "--quick",
    is_flag=True,
    help="A smoke run (CI): 200 ops per worker, 1 round, 1 and 2 writers for 0.3 s.",
)
@click.option(
    "--rounds", type=click.IntRange(min=1), default=None, help="Rounds to take medians of [3]."
)
@click.option(
    "--only",
    type=click.Choice(["peers", "writers", "workflow"]),
    default=None,
    help="One section: reactor against its peers, how its writes scale with writers, "
    "or its timers and work queue (against a Redis list and a SQLite table) "
    "[default: all].",
)
@click.option(
    "--json/--table",
    "as_json",
    default=None,
    expose_value=False,
    callback=_remember,
    help="Print JSON, or tables [default: JSON when piped, tables on a terminal].",
)
@click.option(
    "--output",
    "-o",
    "output_file",
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
    "--postgres-url",
    "--url",
    "url",
    envvar=["REACTOR_BENCH_POSTGRES_URL", "REACTOR_TEST_POSTGRES_URL"],
    show_envvar=True,
    default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
    show_default=True,
    help="The PostgreSQL server for --backend postgresql (pgbench runs there too).",
)
def bench(
    quick: bool,
    rounds: int | None,
    only: str | None,
    output_file: str | None,
    scale: bool,
    db_dir: str | None,
    threads: int,
    processes: int,
    backend: str,
    url: str,
) -> None:
    """Measure reactor against dict+lock, sqlite3, diskcache, sqlitedict and Redis,
    and how its writes scale with threads and processes (beside pgbench on PostgreSQL).

    Tables on a terminal (80 columns suffice), JSON when piped or with --json.
    """
    from rich.console import Console

    from reactor._bench import BackendUnavailable, Options, run
    from reactor._bench.report import dumps, render, write_json

    if scale and backend != "sqlite":
        raise click.UsageError("--scale runs on SQLite only: leave out --backend postgresql")
    if scale and only is not None:
        raise click.UsageError("--scale is a section of its own: leave out --only")
    ctx = click.get_current_context()
    given = ctx.get_parameter_source("url")
    if backend == "sqlite" and given is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--postgres-url goes with --backend postgresql")
    as_json = ctx.meta.get(_AS_JSON)
    if as_json is None:
        as_json = not sys.stdout.isatty()
    progress = Console(stderr=True)  # shown on a terminal only, never in the JSON
    try:
        with progress.status("reactor bench") as status:
            result = run(
                Options(
                    quick=quick,
                    rounds=rounds,
                    scale=scale,
                    only=only,
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
    if output_file is not None:
        write_json(result, output_file)
    if as_json:
        click.echo(dumps(result), nl=False)
        return
    console = Console()
    render(result, console)
    if output_file is not None:
        console.print(f"figures written to {output_file}")


def main() -> None:
    """Entry point of the ``reactor`` console script (and ``python -m reactor``)."""
    try:
        # One variable for the console script and python -m reactor alike.
        cli.main(standalone_mode=True, complete_var="_REACTOR_COMPLETE")
    except ReactorError as exc:  # raised outside a command: closing the database, say
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
