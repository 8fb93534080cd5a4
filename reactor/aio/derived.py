"""Derived values from asyncio (SPEC §15): ``AsyncDerived``, the same value as
``State.derive`` gives, with ``await d.wait_for(...)`` and ``async for v in
d.watch()``. No thread waits for a task: the published values reach the loop through
``DerivedValue.listen`` (``call_soon_threadsafe``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from reactor._base.results import Derived
from reactor._handles.derived import DerivedValue
from reactor.errors import ClosedError, InvalidArgumentError, OperationTimeout

__all__ = ["AsyncDerived"]

WATCH_BUFFER: Final = 1000  # values a watch holds before it skips the oldest


class AsyncDerived:
    """A derived value, for asyncio: ``value``, ``revision``, ``error`` as they are;
    ``await wait_for``, ``async for ... in watch()``."""

    def __init__(self, derived: DerivedValue) -> None:
        self._derived = derived

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncDerived {self._derived.name!r} = {self.value!r}>"

    @property
    def name(self) -> str:
        """What it is called."""
        return self._derived.name

    @property
    def value(self) -> Any:
        """The last result published."""
        return self._derived.value

    @property
    def revision(self) -> int:
        """The revision of the last result published."""
        return self._derived.revision

    @property
    def error(self) -> BaseException | None:
        """The last exception of the function; None again after a good run."""
        return self._derived.error

    @property
    def recomputations(self) -> int:
        """How many times its function ran (or it was built, for ``count``, ``sum``)."""
        return self._derived.recomputations

    def subscribe(self, callback: Callable[[Derived], Any]) -> Callable[[], None]:
        """``DerivedValue.subscribe``: ``callback`` on a thread of its own (a coroutine
        function's coroutine is run on the loop that subscribed)."""
        if not callable(callback):
            raise InvalidArgumentError(f"callback must be callable, not {callback!r}")
        if not asyncio.iscoroutinefunction(callback):
            return self._derived.subscribe(callback)
        loop = asyncio.get_running_loop()

        def on_loop(derived: Derived) -> None:
            asyncio.run_coroutine_threadsafe(callback(derived), loop)

        return self._derived.subscribe(on_loop)

    async def wait_for(self, predicate: Callable[[Any], bool], timeout: float | None = None) -> Any:
        """``DerivedValue.wait_for``, awaited: the first value (the current one first)
        for which ``predicate`` is true.

        Raises:
            OperationTimeout: none within ``timeout`` seconds.
            ClosedError: the value was closed meanwhile.
        """
        if not callable(predicate):
            raise InvalidArgumentError(f"predicate must be callable, not {predicate!r}")
        current = self._derived.current()
        if current is not None and predicate(current.value):
            return current.value  # the current value first, whatever the timeout
        try:
            return await asyncio.wait_for(self._first(predicate), timeout)
        except TimeoutError:
            raise OperationTimeout(f"derived value {self.name!r} did not match in time") from None

    async def _first(self, predicate: Callable[[Any], bool]) -> Any:
        async for derived in self._values(skip=False):
            if predicate(derived.value):
                return derived.value
        raise AssertionError("unreachable: the values end by raising")  # pragma: no cover

    async def watch(self) -> AsyncIterator[Derived]:
        """The published values, from the current one on (one that falls behind skips
        the oldest); it ends when the value or the engine is closed."""
        async for derived in self._values(skip=True):
            yield derived

    async def _values(self, *, skip: bool) -> AsyncIterator[Derived]:
        """The current value, then each one published; at the close: the end
        (``skip``: a watch's) or ``ClosedError``."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Derived | None] = asyncio.Queue()

        def hand(derived: Derived | None) -> None:
            loop.call_soon_threadsafe(_put, queue, derived, skip)

        stop = self._derived.listen(hand)
        try:
            current = self._derived.current()
            if current is not None:
                yield current
            while True:
                derived = await queue.get()
                if derived is None:
                    if skip:
                        return
                    raise ClosedError(f"derived value {self.name!r} is closed")
                if current is None or derived.revision > current.revision:
                    yield derived
        finally:
            stop()

    def close(self) -> None:
        """Stop keeping it current; idempotent."""
        self._derived.close()


def _put(queue: asyncio.Queue[Derived | None], derived: Derived | None, skip: bool) -> None:
    if skip and derived is not None and queue.qsize() >= WATCH_BUFFER:
        queue.get_nowait()  # the oldest goes
    queue.put_nowait(derived)
