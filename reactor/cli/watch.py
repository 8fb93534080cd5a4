"""``reactor watch``: the live change feed, printed as it comes."""

from __future__ import annotations

import signal
import threading
from typing import Final

import click

from .complete import complete_scope
from .group import Command
from .options import command_output, command_state, data_options

__all__ = ["COMMANDS"]

_WATCH_JOIN: Final = 5.0  # seconds for the printing thread to end once the watch closes


@click.command(cls=Command)
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="GLOB",
    shell_complete=complete_scope,
    help="Only scopes matching this glob (give it again for more: any one will do).",
)
@click.option(
    "--key",
    "keys",
    multiple=True,
    metavar="GLOB",
    help="Only keys matching this glob (give it again for more: any one will do).",
)
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
@data_options()
def watch(
    scopes: tuple[str, ...], keys: tuple[str, ...], since: int | None, count: int | None
) -> None:
    """Print changes live, from every process.

    One JSON line per change when piped, flushed as it comes. Runs until Ctrl-C (exit
    status 0) or --limit changes.
    """
    state = command_state()
    output = command_output()
    stop = threading.Event()
    failed: list[BaseException] = []

    def on_signal(*_: object) -> None:
        stop.set()  # no KeyboardInterrupt: it could land inside the engine, mid-lock

    # Ctrl-C and SIGTERM (kill, docker stop) end the watch cleanly, with status 0. The
    # events are printed by a thread of their own, so that the main thread, the one
    # signals reach, only waits.
    previous = {sent: signal.signal(sent, on_signal) for sent in (signal.SIGINT, signal.SIGTERM)}
    try:
        with state.watch(since=since, scope=scopes or None, key=keys or None) as feed:

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


COMMANDS: Final = (watch,)
