"""A progress bar on stderr for the command line's long runs (``export``, ``import``).

Drawn only on a terminal, and only for runs long enough to want one: a pipe, a log file
or a test sees nothing of it. rich is imported when a bar is first drawn.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = ["Bar", "terminal_progress"]

SHOW_FROM: Final = 5000  # steps (lines, keys): a shorter run ends before a bar helps


@contextlib.contextmanager
def terminal_progress(*, shown: bool = True) -> Iterator[Bar | None]:
    """A ``Bar`` when stderr is a terminal (and ``shown``), else None; the bar is
    cleared when the block ends, however it ends."""
    if not shown or not sys.stderr.isatty():
        yield None
        return
    bar = Bar()
    try:
        yield bar
    finally:
        bar.close()


class Bar:
    """An ``_exchange.Progress`` drawn with rich: one line per stage, on ``console``
    (stderr by default).

    A stage is drawn once it is known to be long: more than ``SHOW_FROM`` steps in all,
    or, if its total is not known, once it has done that many. After the first stage
    drawn, every later one is too, so the bar does not vanish halfway.
    """

    def __init__(self, console: Console | None = None) -> None:
        self._console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._stage = ""
        self._total: int | None = None
        self._done = 0

    def start(self, stage: str, total: int | None) -> None:
        self._finish_task()
        self._stage, self._total, self._done = stage, total, 0
        if self._progress is not None or (total is not None and total > SHOW_FROM):
            self._show()

    def advance(self, steps: int) -> None:
        self._done += steps
        if self._task is None and self._total is None and self._done > SHOW_FROM:
            self._show()
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self._done, count=self._count())

    def close(self) -> None:
        """Stop drawing, and clear the bar from the terminal."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _finish_task(self) -> None:
        if self._progress is not None and self._task is not None:
            # A stage of unknown length ends full, at what it did.
            total = self._done if self._total is None else self._total
            self._done = total
            self._progress.update(self._task, total=total, completed=total, count=self._count())
        self._task = None

    def _show(self) -> None:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[count]}"),
                TimeElapsedColumn(),
                console=self._console or Console(stderr=True),
                transient=True,
                # The command's own output (an export to stdout) must not go through
                # the bar's console to stderr.
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._progress.start()
        self._task = self._progress.add_task(
            self._stage, total=self._total, completed=self._done, count=self._count()
        )

    def _count(self) -> str:
        if self._total is not None:
            return f"{self._done:,}/{self._total:,}"
        return f"{self._done:,}" if self._done else ""  # a stage that counts nothing
