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
import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._engine.engine import operation_timeout

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

__all__ = ["LoopBridge", "bridge", "in_thread"]

T = TypeVar("T")


class LoopBridge:
    """Hands results from other threads to one event loop, many per wake-up, and times
    the requests out with one timer for all (not one ``asyncio.timeout`` each).

    A request waiting for a scope that transactions take in turn is timed out only
    once the scope has not moved on for the engine's timeout (``Engine.moved``).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Not the loop itself: ``_bridges`` is keyed by it, weakly.
        self._loop_ref = weakref.ref(loop)
        self._lock = threading.Lock()
        self._ready: list[Callable[[], None]] = []
        # Requests in the order of their deadlines, per timeout.
        self._waiting: dict[float, collections.deque[_Waiting]] = {}
        self._timer: asyncio.TimerHandle | None = None

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        assert loop is not None  # used on the loop, alive then
        return loop

    def track(
        self,
        source: Future[T],
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
            deadline = self._loop.time() + timeout
            queue = self._waiting.get(timeout)
            if queue is None:
                queue = self._waiting[timeout] = collections.deque()
            queue.append(_Waiting(deadline, target, source, scope, timeout, engine))
            if self._timer is None or deadline < self._timer.when():
                self._arm(deadline)
        return target

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop; callable from any thread. What comes before
        the loop wakes up joins that one wake-up."""
        with self._lock:
            self._ready.append(callback)
            first = len(self._ready) == 1
        loop = self._loop_ref()
        if first and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._deliver)

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = self._loop.time()
        earliest: float | None = None
        for queue in self._waiting.values():
            while queue and (queue[0].target.done() or queue[0].deadline <= now):
                waiting = queue.popleft()
                if waiting.target.done():
                    continue
                later = waiting.later(now)
                if later is not None:  # the scope moved on meanwhile: wait on
                    waiting.deadline = later
                    bisect.insort(queue, waiting, key=_deadline)
                    continue
                waiting.target.set_exception(
                    operation_timeout(waiting.scope, waiting.timeout, waiting.source)
                )
            if queue and (earliest is None or queue[0].deadline < earliest):
                earliest = queue[0].deadline
        if earliest is not None:
            self._arm(earliest)

    def _deliver(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for callback in ready:
            callback()
        for queue in self._waiting.values():  # forget what is answered (mostly in order)
            while queue and queue[0].target.done():
                queue.popleft()


def _settle(source: Future[Any], target: asyncio.Future[Any]) -> None:
    if target.done():
        return  # its caller stopped waiting (a timeout, a cancellation)
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


@dataclasses.dataclass(slots=True)
class _Waiting:
    deadline: float
    target: asyncio.Future[Any]
    source: Future[Any]
    scope: str
    timeout: float
    engine: EnginePort | None

    def later(self, now: float) -> float | None:
        """A deadline after ``now`` if the scope was handed over since ``timeout``
        before it (the loop's clock may differ from ``time.monotonic``'s)."""
        moved = None if self.engine is None else self.engine.moved(self.scope)
        if moved is None:
            return None
        deadline = moved + self.timeout + (now - time.monotonic())
        return deadline if deadline > now else None


def _deadline(waiting: _Waiting) -> float:
    return waiting.deadline


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopBridge] = (
    weakref.WeakKeyDictionary()
)


def bridge() -> LoopBridge:
    """The bridge of the running loop (made on first use, gone with the loop)."""
    loop = asyncio.get_running_loop()
    found = _bridges.get(loop)
    if found is None:
        found = _bridges[loop] = LoopBridge(loop)
    return found


async def in_thread(call: Callable[[], None], name: str) -> None:
    """``call()`` in a thread of its own; on return that thread has ended."""
    done: Future[None] = Future()

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
