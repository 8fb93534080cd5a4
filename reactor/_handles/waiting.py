"""Waiting for a key to take a value: ``scope.wait_for`` and its asyncio twin (SPEC §13).

A waiter wakes on change events, never by reading the value again. It listens to its
one key in the engine's hub (``_engine.hub``), which finds the waiters of a change by a
dict lookup, so a thousand waiters cost the dispatcher one call per event, not a
thousand (and keeps the dispatcher reading other processes' changes, which it does only
while someone listens).

No race between reading the current value and the first change: the waiter joins the
hub, and the dispatcher tells it the last revision it published, *before* the row is
read. A change committed in between is then both in the row and offered as an event;
events at or below the row's revision (with no row: the revision published when the
waiter joined) are older than what was read, and ignored.

Only the raw change record crosses threads: the predicate runs in the waiter's own
thread (``wait``) or on its event loop (``wait_async``), so a slow predicate holds up no
other subscriber. The hub ends a waiter as it does a subscription: ``close()``
first delivers what is pending, then finishes it, and the wait ends with
``ClosedError`` unless what was delivered satisfied it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from reactor._base.checks import check_timeout
from reactor._base.keys import check_key
from reactor._base.values import decode
from reactor.errors import ClosedError, InvalidArgumentError, OperationTimeout, ReentrancyError

if TYPE_CHECKING:
    from reactor._engine.events import ChangeEvent
    from reactor._engine.port import EnginePort
    from reactor._storage.records import ChangeRecord

__all__ = ["OnLoop", "Predicate", "Waiter", "check_wait", "wait", "wait_async"]

T = TypeVar("T")
Predicate = Callable[[Any], object]
_VALUES: Final = frozenset({"created", "updated"})  # the changes after which the key exists


def check_wait(key: object, predicate: object, timeout: object) -> tuple[str, float | None]:
    """The key, and the timeout in seconds (None: no limit), of a ``wait_for`` call.

    Raises:
        InvalidKeyError: a bad key.
        InvalidArgumentError: ``predicate`` is not None or callable, or ``timeout`` not
            None or a number >= 0.
    """
    checked = check_key(key)
    if predicate is not None and not callable(predicate):
        raise InvalidArgumentError("predicate must be None or a callable taking the value")
    return checked, check_timeout(timeout)


def _satisfies(text: str, predicate: Predicate | None) -> bool:
    # The predicate gets a copy of its own: what it does to it is not what wait_for returns.
    return predicate is None or bool(predicate(decode(text)))


class Waiter:
    """One wait: the changes of its key that have arrived and not been looked at yet.

    ``wake`` is called (from the dispatcher's thread, or the closer's) when the waiter
    has something new to look at; once until it looks.
    """

    __slots__ = ("_pending", "_signalled", "_wake", "closing", "floor", "key", "scope")

    def __init__(self, scope: str, key: str, wake: Callable[[], None]) -> None:
        self.scope = scope
        self.key = key
        self.floor = 0  # changes up to this revision are older than the value read
        self.closing = False
        self._pending: deque[ChangeRecord] = deque()
        self._signalled = False
        self._wake = wake

    def __repr__(self) -> str:
        return f"<reactor waiter for {self.key!r} of scope {self.scope!r}>"

    # -- from the dispatcher -------------------------------------------------------
    def start(self, published: int) -> None:
        """Told by the hub as it joins: every change after ``published`` is offered."""
        self.floor = published

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:  # noqa: ARG002 - a Listener's call
        self._pending.append(record)
        if not self._signalled:  # appended first: a look that resets the flag sees it
            self._signalled = True
            self._wake()

    # -- from the hub, as the engine closes ------------------------------------------
    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:  # noqa: ARG002 - same call as Subscription.finish
        """The engine is closing; what it had to deliver has been offered."""
        self.closing = True
        self._signalled = True
        self._wake()

    def join(self, timeout: float) -> None:
        """Nothing to wait for: the waiting thread is the caller's."""

    # -- in the waiter's thread, or on its loop ------------------------------------
    def match(self, predicate: Predicate | None) -> str | None:
        """The JSON text of the first change that arrived, is newer than the value read
        and satisfies ``predicate``; None if none does (they are all used up then).

        Raises:
            Exception: what the predicate raised.
        """
        self._signalled = False  # before looking: an offer from now on wakes again
        pending = self._pending
        while pending:
            record = pending.popleft()
            if record.revision <= self.floor or record.type not in _VALUES:
                continue  # already seen, or the key is gone: never satisfies
            text = record.new_value
            if text is not None and _satisfies(text, predicate):
                return text
        return None


def begin(engine: EnginePort, waiter: Waiter) -> str | None:
    """Start ``waiter``, then read the key: its JSON text if it is live, else None.

    Raises:
        ClosedError: the engine is closed.
        ReentrancyError: called on the dispatcher's thread (a ``signals.changed``
            receiver), which would have to deliver the change it waits for.
        StorageError: the read failed (the waiter is ended then).
    """
    if engine.dispatcher.delivering():
        raise ReentrancyError(
            "wait_for cannot wait on the thread that delivers changes (in a receiver of "
            "reactor.signals.changed): subscribe, or wait in another thread"
        )
    try:
        # Before the read: no change can fall in between; from now on, close()
        # finishes it.
        engine.hub.add(waiter, waiter.scope, waiter.key)
        row = engine.store.reader().fetch_row(waiter.scope, waiter.key)
    except BaseException:
        end(engine, waiter)
        raise
    if row is None:
        return None
    waiter.floor = row.revision  # the key's last change: what the read saw
    return row.value if row.live(engine.now()) else None


def end(engine: EnginePort, waiter: Waiter) -> None:
    """Take ``waiter`` out of the hub; idempotent."""
    engine.hub.remove(waiter)


def _look(waiter: Waiter, predicate: Predicate | None, clear: Callable[[], None]) -> str | None:
    """One look at what arrived for ``waiter``: the loop body ``wait`` and ``wait_async``
    share. The JSON text of the first change that satisfies ``predicate``, or None: wait
    for the next wake-up. ``clear`` resets the wake-up flag first, so that an offer made
    during the look wakes the waiter again.

    Raises:
        ClosedError: the engine closed, and nothing it delivered satisfies.
        Exception: what the predicate raised.
    """
    clear()
    # Read before looking: a close noted after the look may follow an offer the look
    # missed, which the next look sees.
    closing = waiter.closing
    text = waiter.match(predicate)
    if text is None and closing:
        raise _closed(waiter)
    return text


def _closed(waiter: Waiter) -> ClosedError:
    return ClosedError(f"the engine closed while waiting for {waiter.key!r}")


def _timed_out(waiter: Waiter, timeout: float) -> OperationTimeout:
    return OperationTimeout(
        f"wait_for({waiter.key!r}) on scope {waiter.scope!r} timed out after {timeout} s"
    )


def wait(
    engine: EnginePort, scope: str, key: str, predicate: Predicate | None, timeout: float | None
) -> Any:
    """Block until ``key`` holds a value that satisfies ``predicate``; return a copy.

    The arguments are checked already (``check_wait``).

    Raises:
        OperationTimeout: not within ``timeout`` seconds.
        ClosedError: the engine closed first.
        Exception: what the predicate raised.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    ready = threading.Event()
    waiter = Waiter(scope, key, ready.set)
    text = begin(engine, waiter)
    try:
        if text is not None and _satisfies(text, predicate):
            return decode(text)
        while (text := _look(waiter, predicate, ready.clear)) is None:
            if deadline is None:
                ready.wait()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                assert timeout is not None
                raise _timed_out(waiter, timeout)
            ready.wait(min(left, threading.TIMEOUT_MAX))
        return decode(text)
    finally:
        end(engine, waiter)


class OnLoop(Protocol):
    """How a wait on an event loop reaches the loop and the blocking world."""

    def waker(self, callback: Callable[[], None]) -> Callable[[], None]:
        """(On the loop) a function that, called from any thread, runs ``callback`` on
        the loop soon."""
        ...

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)``, a short blocking call, in a worker thread."""
        ...


async def wait_async(
    engine: EnginePort,
    scope: str,
    key: str,
    predicate: Predicate | None,
    timeout: float | None,
    on_loop: OnLoop,
) -> Any:
    """``wait`` on the running event loop, holding no thread while it waits (``on_loop``
    runs its start, the dispatcher's lock and the read, in a worker thread). Cancelling
    the task ends the waiter."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    arrived = asyncio.Event()
    waiter = Waiter(scope, key, on_loop.waker(arrived.set))
    starting = asyncio.ensure_future(on_loop.run(begin, engine, waiter))
    try:
        text = await asyncio.shield(starting)
    except asyncio.CancelledError:
        # The start goes on in its thread: end the waiter once it is done.
        starting.add_done_callback(functools.partial(_end_started, engine, waiter))
        raise
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        arrived.set()

    timer = None if deadline is None else loop.call_at(deadline, expire)
    try:
        if text is not None and _satisfies(text, predicate):
            return decode(text)
        while (text := _look(waiter, predicate, arrived.clear)) is None:
            if expired:
                assert timeout is not None
                raise _timed_out(waiter, timeout)
            await arrived.wait()
        return decode(text)
    finally:
        if timer is not None:
            timer.cancel()
        end(engine, waiter)


def _end_started(engine: EnginePort, waiter: Waiter, starting: asyncio.Future[Any]) -> None:
    if not starting.cancelled():
        starting.exception()  # retrieved: a failed start already ended the waiter
    end(engine, waiter)
