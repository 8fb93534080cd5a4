"""``reactor export`` and ``reactor import``: a backup as JSON Lines, and its restore.

The work is ``reactor._backup.exchange``'s; here are the file handling, the progress
bar on a terminal, the summary, and the import's guard against a Ctrl-C that comes
once its commit may have happened.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Final

import click

from reactor._backup import exchange as _exchange
from reactor._base.keys import compile_pattern

from .group import Command
from .options import command_output, command_state, data_options

__all__ = ["COMMANDS"]


@click.command(cls=Command)
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
@data_options()
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
    state = command_state()
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

    command_output().show(
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


@click.command("import", cls=Command)
@click.argument("file", type=click.Path(dir_okay=False, exists=True, allow_dash=True), default="-")
@data_options()
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
        tally = _exchange.write(command_state(create=True), found, progress, staged=shield.raise_up)
    command_output().show(
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
        if self._previous is not None:
            if not self.shielded:
                signal.signal(signal.SIGINT, self._previous)
            else:
                # Once the commit may have happened, Ctrl-C is ignored to the process's
                # end: a handler of Python's own is reset as the interpreter shuts down,
                # and a Ctrl-C then killed a successful import (exit -2).
                signal.signal(signal.SIGINT, signal.SIG_IGN)
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


COMMANDS: Final = (export, import_lines)
