"""``LockLine``: who waits for one lock in one engine, threads and tasks alike.

A lease lives in the database, so a waiter finds it free only by trying it. A line keeps
that cheap. It is shared under the lock's name in the engine's hub while anyone waits
(a quiet listener: a lease is no change of a key; it only finishes with the engine).
A release in this process wakes its waiters at once (``wake``); for releases and
expiries in other processes they try again, backing off from 2 ms to 50 ms
(``next_pause``). Threads each try; the tasks of one loop stand in order and only the
first of them tries, the others waiting on the loop with no thread and no query.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from reactor._engine.events import ChangeEvent
    from reactor._engine.hub import Hub
    from reactor._storage.records import ChangeRecord

__all__ = ["LockLine", "join", "next_pause", "wake", "wake_all"]

POLL_MIN: Final = 0.002
POLL_MAX: Final = 0.05


def next_pause(pause: float, woken: bool) -> float:
    """The pause before the next try: short again after a wake, else twice as long."""
    return POLL_MIN if woken else min(pause * 2, POLL_MAX)


class LockLine:
    """The threads and tasks of one engine waiting for the lock ``name``."""

    __slots__ = (
        "_hub",
        "_lock",
        "_members",
        "_over",
        "_pokes",
        "_released",
        "_turns",
        "name",
        "wakes",
    )

    def __init__(self, hub: Hub, name: str) -> None:
        self._hub = hub
        self.name = name
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self.wakes = 0
        """How many times it was woken: read before a try, given to ``wait`` after it."""
        self._members = 0  # threads and tasks in it
        self._over = False  # emptied and left the hub: a new waiter starts a new line
        self._turns: dict[asyncio.AbstractEventLoop, deque[asyncio.Future[None]]] = {}
        self._pokes: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}

    def __repr__(self) -> str:
        return f"<reactor line of lock waiters on {self.name!r}>"

    # -- joining and leaving ---------------------------------------------------------
    def enter(self) -> bool:
        """Count one waiter more; False if this line is over (use a new one).

        Raises:
            ClosedError: the engine is closed.
        """
        with self._lock:
            if self._over:
                return False
            self._members += 1
            if self._members == 1:
                try:
                    self._hub.add(self, quiet=True)
                except BaseException:
                    self._members = 0
                    self._close()
                    raise
            return True

    def leave(self) -> None:
        """Count one waiter fewer; the last one out takes the line out of the hub."""
        with self._lock:
            self._members -= 1
            if self._members == 0:
                self._close()

    def _close(self) -> None:
        self._over = True
        self._hub.forget_shared(_line_key(self.name), self)
        self._hub.remove(self)

    # -- a thread's wait -------------------------------------------------------------
    def wait(self, since: int, seconds: float) -> bool:
        """Sleep up to ``seconds`` unless woken since ``wakes`` was ``since``; whether
        it was."""
        with self._released:
            if self.wakes == since:
                self._released.wait(seconds)
            return self.wakes != since

    # -- a task's wait: in order, on its loop ----------------------------------------
    def queue(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A task's turn among those of its loop: done when it is first."""
        turn = loop.create_future()
        with self._lock:
            turns = self._turns.setdefault(loop, deque())
            if not turns:
                turn.set_result(None)
            turns.append(turn)
        return turn

    def step_out(self, loop: asyncio.AbstractEventLoop, turn: asyncio.Future[None]) -> None:
        """Take ``turn`` out of its loop's order (on that loop); the next gets its turn."""
        with self._lock:
            turns = self._turns[loop]
            if turns[0] is turn:
                turns.popleft()
                if turns and not turns[0].done():
                    turns[0].set_result(None)
            else:
                turns.remove(turn)
            if not turns:
                del self._turns[loop]
                self._pokes.pop(loop, None)

    def poke(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done at the next wake (made before a try: a release while it runs
        counts), for the first task of ``loop``."""
        poke = loop.create_future()
        with self._lock:
            self._pokes[loop] = poke
        return poke

    # -- waking ----------------------------------------------------------------------
    def wake(self) -> None:
        """Have every waiter try again now (from any thread)."""
        with self._released:
            self.wakes += 1
            self._released.notify_all()
            pokes, self._pokes = self._pokes, {}
        for loop, poke in pokes.items():
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, poke)

    # -- the hub's side (``Listener``) -----------------------------------------------
    def start(self, published: int) -> None:
        """A quiet listener is not started."""

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:
        """A quiet listener is offered nothing."""

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:  # noqa: ARG002 - a Listener's call
        """The engine is closing: its waiters try again, and find it closed."""
        self.wake()

    def join(self, timeout: float) -> None:
        """Nothing to wait for: the waiting threads and tasks are the callers'."""


def _settle(poke: asyncio.Future[None]) -> None:
    if not poke.done():
        poke.set_result(None)


def _line_key(name: str) -> tuple[str, str]:
    return ("lock line", name)


def join(hub: Hub, name: str) -> LockLine:
    """Stand in the line of lock ``name`` (``leave`` it when done waiting).

    Raises:
        ClosedError: the engine is closed.
    """
    return hub.join_shared(_line_key(name), lambda: LockLine(hub, name), LockLine.enter)


def wake(hub: Hub, name: str) -> None:
    """A holder in this process released ``name``: its waiters try at once."""
    line: LockLine | None = hub.find_shared(_line_key(name))
    if line is not None:
        line.wake()


def wake_all(hub: Hub) -> None:
    """Every lock waiter of the engine tries again now (a handle closed: its waiters
    find out)."""
    for listener in hub.listeners():
        if isinstance(listener, LockLine):
            listener.wake()
