"""The loop bridge: results from other threads handed to one event loop, many per
wake-up, and the requests waiting for them timed out with one timer for all.

``asyncio.wrap_future`` wakes the loop once per result; when an actor commits a batch
of 100 writes, the bridge wakes it once for the 100 (``call_soon``), and one loop timer
stands for the deadlines of every request waiting (``track``), not one
``asyncio.timeout`` each.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from reactor._engine.engine import operation_timeout
from reactor._engine.reply import ThreadReply

if TYPE_CHECKING:
    from reactor._engine.mailbox import Reply
    from reactor._engine.port import EnginePort
    from reactor._storage.txn import Work

__all__ = ["Answer", "LoopBridge", "bridge", "in_thread"]

T = TypeVar("T")


class LoopBridge:
    """Hands results from other threads to one event loop, many per wake-up, and times
    the requests out with one timer for all (not one ``asyncio.timeout`` each).

    A request waiting for a scope that transactions take in turn is timed out only
    once the scope has not moved on for the engine's timeout (``Engine.moved``).
    Deadlines count on ``time.monotonic``, whatever clock the loop keeps.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Not the loop itself: ``_bridges`` is keyed by it, weakly.
        self.loop_ref = weakref.ref(loop)
        self.lock = threading.Lock()  # the lists below, and the answers' states
        self._ready: list[Callable[[], None]] = []
        self._answers: list[tuple[asyncio.Future[Any], bool, Any]] = []
        # Requests in the order of their deadlines, per timeout.
        self._waiting: dict[float, collections.deque[_Waiting]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed = 0.0  # the deadline the timer is set for

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self.loop_ref()
        assert loop is not None  # used on the loop, alive then
        return loop

    def send(self, engine: EnginePort, scope: str, work: Work[T]) -> Answer[T]:
        """Queue ``work`` on ``scope``'s actor; its answer, whose ``target`` (an asyncio
        future on this loop) gets the result, or fails with ``OperationTimeout`` once
        the scope has not moved on for the engine's timeout. No
        ``concurrent.futures.Future`` stands between.

        Raises:
            ClosedError: the engine is closed.
        """
        loop = self.loop_ref()
        assert loop is not None  # called on the loop, alive then
        target: asyncio.Future[T] = loop.create_future()
        answer: Answer[T] = Answer(self, target)
        engine.send(scope, work, answer)
        self._time_out(target, answer, scope, engine.options.timeout, engine)
        return answer

    def track(
        self,
        source: ThreadReply[T],
        scope: str,
        timeout: float | None,
        engine: EnginePort | None = None,
    ) -> asyncio.Future[T]:
        """An asyncio future, on this loop, that settles as ``source`` does, or fails
        with ``OperationTimeout`` after ``timeout`` seconds (counted from the scope's
        last hand-over in ``engine``, if later)."""
        target: asyncio.Future[T] = self._loop.create_future()
        source.add_done_callback(
            lambda done: self.call_soon(functools.partial(_settle, done, target))
        )
        if timeout is not None:
            self._time_out(target, source, scope, timeout, engine)
        return target

    def _time_out(
        self,
        target: asyncio.Future[Any],
        source: Reply,
        scope: str,
        timeout: float,
        engine: EnginePort | None,
    ) -> None:
        deadline = time.monotonic() + timeout
        queue = self._waiting.get(timeout)
        if queue is None:
            queue = self._waiting[timeout] = collections.deque()
        queue.append((deadline, target, source, scope, timeout, engine))
        if self._timer is None or deadline < self._armed:
            self._arm(deadline)

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop; callable from any thread. What comes before
        the loop wakes up joins that one wake-up."""
        with self.lock:
            self._ready.append(callback)
            first = len(self._ready) + len(self._answers) == 1
        if first:
            self._wake()

    def settle(self, target: asyncio.Future[Any], ok: bool, value: Any) -> None:
        """Set ``target``'s result (``ok``) or exception on the loop; callable from
        any thread, one wake-up for a burst."""
        with self.lock:
            self._answers.append((target, ok, value))
            first = len(self._ready) + len(self._answers) == 1
        if first:
            self._wake()

    def _wake(self) -> None:
        loop = self.loop_ref()
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._deliver)

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = deadline
        self._timer = self._loop.call_later(max(0.0, deadline - time.monotonic()), self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        earliest: float | None = None
        for queue in self._waiting.values():
            while queue and (queue[0][1].done() or queue[0][0] <= now):
                waiting = queue.popleft()
                _, target, source, scope, timeout, engine = waiting
                if target.done():
                    continue
                later = _later(engine, scope, timeout, now)
                if later is not None:  # the scope moved on meanwhile: wait on
                    bisect.insort(queue, (later, *waiting[1:]), key=_deadline)
                    continue
                target.set_exception(operation_timeout(scope, timeout, source))
            if queue and (earliest is None or queue[0][0] < earliest):
                earliest = queue[0][0]
        if earliest is not None:
            self._arm(earliest)

    def _deliver(self) -> None:
        with self.lock:
            ready, self._ready = self._ready, []
            answers, self._answers = self._answers, []
        for target, ok, value in answers:
            if not target.done():  # else its caller stopped waiting (a timeout)
                if ok:
                    target.set_result(value)
                else:
                    target.set_exception(value)
        for callback in ready:
            callback()
        for queue in self._waiting.values():  # forget what is answered (mostly in order)
            while queue and queue[0][1].done():
                queue.popleft()


_PENDING: Final = 0
_RUNNING: Final = 1
_CANCELLED: Final = 2


class Answer(Generic[T]):
    """The reply to one asyncio caller's request (``Reply``): the actor settles its
    ``target`` on the caller's loop through the bridge. It does what the actor and a
    timeout ask of a ``concurrent.futures.Future`` (run unless withdrawn, withdraw
    unless running), under the bridge's lock, with no ``Condition`` and no callback
    list."""

    __slots__ = ("_bridge", "_state", "target")

    def __init__(self, bridge: LoopBridge, target: asyncio.Future[T]) -> None:
        self._bridge = bridge
        self.target = target
        self._state = _PENDING

    def set_running_or_notify_cancel(self) -> bool:
        with self._bridge.lock:
            if self._state == _CANCELLED:
                return False
            self._state = _RUNNING
            return True

    def cancel(self) -> bool:
        with self._bridge.lock:
            if self._state != _PENDING:
                return False
            self._state = _CANCELLED
            return True

    def set_result(self, result: Any) -> None:
        self._bridge.settle(self.target, True, result)

    def set_exception(self, exception: BaseException | None) -> None:
        self._bridge.settle(self.target, False, exception)


def _settle(source: ThreadReply[Any], target: asyncio.Future[Any]) -> None:
    if target.done():
        return  # its caller stopped waiting (a timeout, a cancellation)
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


# A request waiting for its answer: (deadline, target, source, scope, timeout, engine);
# a tuple, not an object, since every asyncio write makes one.
_Waiting = tuple[float, "asyncio.Future[Any]", "Reply", str, float, "EnginePort | None"]


def _later(engine: EnginePort | None, scope: str, timeout: float, now: float) -> float | None:
    """A deadline after ``now`` if ``scope`` was handed over since ``timeout`` before
    it."""
    moved = None if engine is None else engine.moved(scope)
    if moved is None:
        return None
    deadline = moved + timeout
    return deadline if deadline > now else None


def _deadline(waiting: _Waiting) -> float:
    return waiting[0]


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopBridge] = (
    weakref.WeakKeyDictionary()
)


_last: LoopBridge | None = None  # the bridge asked for last: most programs run one loop


def bridge() -> LoopBridge:
    """The bridge of the running loop (made on first use, gone with the loop)."""
    global _last  # noqa: PLW0603 - a cache of one, read without a lock
    loop = asyncio.get_running_loop()
    last = _last
    if last is not None and last.loop_ref() is loop:
        return last
    found = _bridges.get(loop)
    if found is None:
        found = _bridges[loop] = LoopBridge(loop)
    _last = found
    return found


async def in_thread(call: Callable[[], None], name: str) -> None:
    """``call()`` in a thread of its own; on return that thread has ended."""
    done: ThreadReply[None] = ThreadReply()

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - raised to the awaiting task
            done.set_exception(exc)
        else:
            done.set_result(None)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    await bridge().track(done, "", None)
    while thread.is_alive():  # it is returning: a join that does not block the loop
        await asyncio.sleep(0.001)
