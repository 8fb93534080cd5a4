"""The takes waiting on a queue, in line: first come, first served, woken by the
engine's hub when a job of their queue becomes ready, or a taken one is done (acked,
nacked, dead, cancelled: a slot of the queue's or a group's concurrency frees) — only
the head: the others would only find it gone — the next one woken when the head leaves."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from reactor._work import jobs as _jobs

if TYPE_CHECKING:
    from reactor._engine.events import ChangeEvent
    from reactor._engine.port import EnginePort
    from reactor._storage.records import ChangeRecord

__all__ = ["Line", "Waiter", "join", "pause"]

# The longest a head sleeps before it looks again while a job is delayed or a lease
# runs: the time it read is on the engine's clock, which may jump (or be a test's).
_LOOK_AGAIN: Final = 2.0
_SOON: Final = 0.001  # the least it sleeps: a job due now that another took


class Waiter:
    """A take waiting in its queue's line; ``wake`` tells it to look (from any thread)."""

    __slots__ = ("_wake", "closing", "scope")

    def __init__(self, scope: str, wake: Callable[[], None]) -> None:
        self.scope = scope
        self.closing = False
        self._wake = wake

    def __repr__(self) -> str:
        return f"<reactor take waiting on {self.scope!r}>"

    def kick(self) -> None:
        self._wake()

    # -- from EnginePort.close, as for a subscription ------------------------------------
    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:  # noqa: ARG002 - same call as Subscription.finish
        self.closing = True
        self._wake()

    def join(self, timeout: float) -> None:
        """Nothing to wait for: the waiting thread is the taker's."""


class Line:
    """The takes waiting on one queue, first come first served: a listener of the
    queue's scope in the engine's hub while anyone waits. A job made ready wakes the
    head only (the others would only find it gone); a head that leaves wakes the next."""

    def __init__(self, engine: EnginePort, scope: str) -> None:
        self._engine = engine
        self.scope = scope
        self._lock = threading.Lock()
        self._waiters: deque[Waiter] = deque()
        self._over = False  # emptied and left the hub: a new take starts a new line

    def __repr__(self) -> str:
        return f"<reactor line of takes on {self.scope!r}>"

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiters)

    def add(self, waiter: Waiter) -> bool:
        """Put ``waiter`` at the end; False if this line is over (use a new one).

        Raises:
            ClosedError: the engine is closed.
        """
        with self._lock:
            if self._over:
                return False
            self._waiters.append(waiter)
            if len(self._waiters) == 1:
                # Under the line's lock: a take that empties it waits for this to end.
                try:
                    self._engine.hub.add(self, self.scope)
                except BaseException:
                    self._waiters.pop()
                    self._close()
                    raise
            return True

    def remove(self, waiter: Waiter) -> None:
        """Take ``waiter`` out; idempotent. A head hands the turn on."""
        following: Waiter | None = None
        with self._lock:
            if waiter not in self._waiters:
                return
            if self._waiters[0] is waiter:
                self._waiters.popleft()
                following = self._waiters[0] if self._waiters else None
            else:
                self._waiters.remove(waiter)
            if not self._waiters:
                self._close()
        if following is not None:
            following.kick()

    def _close(self) -> None:
        self._over = True
        self._engine.hub.forget_shared(_line_key(self.scope), self)
        self._engine.hub.remove(self)

    def first(self, waiter: Waiter) -> bool:
        """Whether ``waiter`` is the head of the line."""
        with self._lock:
            return bool(self._waiters) and self._waiters[0] is waiter

    # -- the hub's side (``Listener``) -----------------------------------------------
    def start(self, published: int) -> None:
        """A line needs no revision to start from: its takes look at the table."""

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:  # noqa: ARG002 - a Listener's call
        text, old = record.new_value, record.old_value
        freed = old is not None and old.startswith(_jobs.TAKEN)  # a slot of flow control
        if text is not None and text.startswith(_jobs.TAKEN):
            return  # a take, or a lease extended: nothing to take, no slot freed
        if not freed and (text is None or not text.startswith(_jobs.READY)):
            return  # no job became ready, and none that was taken is done
        with self._lock:
            head = self._waiters[0] if self._waiters else None
        if head is not None:
            head.kick()

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:
        """The engine is closing: every take in line ends with ``ClosedError``."""
        with self._lock:
            waiting = list(self._waiters)
        for waiter in waiting:
            waiter.finish(from_loop)

    def join(self, timeout: float) -> None:
        """Nothing to wait for: the waiting threads are the takers'."""


def _line_key(scope: str) -> tuple[str, str]:
    return ("queue line", scope)


def join(engine: EnginePort, waiter: Waiter) -> Line:
    """Put ``waiter`` in its queue's line: the line.

    Raises:
        ClosedError: the engine is closed.
    """
    scope = waiter.scope
    return engine.hub.join_shared(
        _line_key(scope), lambda: Line(engine, scope), lambda line: line.add(waiter)
    )


def pause(
    engine: EnginePort, line: Line, waiter: Waiter, next_at: float | None, left: float | None
) -> float | None:
    """How long to sleep before looking again, unless woken (None: until woken). The
    head sleeps until a job may be next (``next_at``, on the engine's clock); the
    others until woken, or out of time (``left``)."""
    pause = left
    if next_at is not None and line.first(waiter):
        until = min(max(next_at - engine.now(), _SOON), _LOOK_AGAIN)
        pause = until if pause is None else min(pause, until)
    return pause
