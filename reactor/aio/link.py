"""``Link``: what ties an asyncio handle, and every part taken from it (scopes,
transactions, locks, queues, watches), to its synchronous ``State`` and to the loop.

The ``State`` is opened in a worker thread on first use. Only short blocking calls
(reads, a transaction body's verbs, a lock's try, opening) run in threads: a few
workers of the link's own, not the loop's default executor, so the application's
``asyncio.to_thread`` work and reactor's never queue behind each other. Waits hold no
thread: an actor's answer is awaited through the loop's bridge (``bridge.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from reactor._engine.port import EnginePort
from reactor._engine.reply import ThreadReply
from reactor._handles import lock_lines
from reactor._handles.binding import Binding, binding_of
from reactor._handles.open import open as open_sync
from reactor._handles.state import State
from reactor.errors import ClosedError

from .bridge import bridge, in_thread

__all__ = ["Link"]

T = TypeVar("T")
# Worker threads per handle, for short blocking calls only: waits hold none.
_WORKERS: Final = min(8, (os.cpu_count() or 1) + 2)


class Link:
    """An asyncio handle's synchronous ``State``, its worker threads and its answers."""

    __slots__ = (
        "_closed",
        "_on_open",
        "_opening",
        "_options",
        "_owned",
        "_target",
        "_workers",
        "binding",
        "state",
    )

    def __init__(self, target: str | os.PathLike[str] | None, options: dict[str, Any]) -> None:
        self._target = target
        self._options = options
        self.state: State | None = None
        """The synchronous handle once opened (None before, and once closed)."""
        self.binding: Binding | None = None
        """The synchronous handle's binding, as ``state`` (a write's fast path)."""
        self._opening: asyncio.Future[State] | None = None
        self._on_open: list[weakref.WeakMethod[Callable[[int], None]]] = []
        self._closed = False
        self._workers: ThreadPoolExecutor | None = None
        self._owned = True  # closing the link closes ``state`` (see ``adopting``)

    @classmethod
    def adopting(cls, state: State) -> Link:
        """A link to ``state``, already open and the caller's: closing the link ends its
        worker threads and leaves ``state`` open.

        Raises:
            ClosedError: ``state`` is closed.
        """
        binding = binding_of(state)
        binding.check()
        link = cls(None, {})
        link.state, link.binding, link._owned = state, binding, False
        return link

    @property
    def closed(self) -> bool:
        """Whether the handle is closed (or its engine is)."""
        return self._closed or (self.state is not None and self.state.closed)

    def when_open(self, call: weakref.WeakMethod[Callable[[int], None]]) -> None:
        """Have ``call(revision)`` run (unless its object is gone) as the first task
        resumes from the open, told the last revision the engine published then: before
        anything this handle writes."""
        self._on_open.append(call)

    async def sync(self) -> State:
        """The synchronous handle, opened in a worker thread on first use.

        Raises:
            ClosedError: the handle is closed.
        """
        if self._closed:
            raise ClosedError("this reactor handle is closed")
        if self.state is None:
            if self._opening is None:
                self._opening = asyncio.ensure_future(
                    self.run(functools.partial(open_sync, self._target, **self._options))
                )
            state = await asyncio.shield(self._opening)
            if self.state is None:  # the first task to resume: before any other goes on
                self.state = state
                self.binding = binding_of(state)
                published = binding_of(state).engine.dispatcher.published
                calls, self._on_open = self._on_open, []
                for ref in calls:
                    if (call := ref()) is not None:
                        call(published)
        return self.state

    async def engine(self) -> EnginePort:
        """The engine, once open.

        Raises:
            ClosedError: the handle is closed.
        """
        return binding_of(await self.sync()).engine

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in the worker threads: short blocking calls only (a read, a
        transaction body's verb, a lock's try), never a wait for something else to
        happen, so a few threads serve any number of tasks.

        Raises:
            ClosedError: the handle is closed.
        """
        if self._closed:
            raise ClosedError("this reactor handle is closed")
        if self._workers is None:
            self._workers = ThreadPoolExecutor(_WORKERS, thread_name_prefix="reactor-aio")
        try:
            future = self._workers.submit(call, *args)
        except RuntimeError:  # shut down by close() meanwhile
            raise ClosedError("this reactor handle is closed") from None
        return await asyncio.wrap_future(future)

    def waker(self, callback: Callable[[], None]) -> Callable[[], None]:
        """(On the loop) a function that, called from any thread, runs ``callback`` on
        this loop soon, through its bridge (one wake-up for a burst)."""
        return functools.partial(bridge().call_soon, callback)

    def answer(self, engine: EnginePort, scope: str, future: ThreadReply[T]) -> asyncio.Future[T]:
        """The answer of ``scope``'s actor to a request, awaited on the loop with no
        thread waiting: ``OperationTimeout`` once the scope has not moved on for the
        engine's timeout (see ``Engine.wait``)."""
        return bridge().track(future, scope, engine.options.timeout, engine)

    async def close(self) -> None:
        """Close; idempotent. Lock waiters get ``ClosedError``. Closing waits for the
        actors and subscribers to finish, in a thread of its own, ended on return."""
        self._closed = True
        if self.state is not None and (engine := binding_of(self.state).current) is not None:
            lock_lines.wake_all(engine.hub)  # its lock waiters try again: the handle closed
        opening, self._opening = self._opening, None
        state, self.state = self.state, None
        self.binding = None
        if not self._owned:
            state = None  # the caller's, who closes it
        if state is None and opening is not None:
            # An open that failed has nothing to close; its error went to the calls
            # that waited for it (closing must not raise it again in a finally block).
            with contextlib.suppress(Exception):
                state = await asyncio.shield(opening)
        workers, self._workers = self._workers, None
        if state is not None or workers is not None:
            await in_thread(functools.partial(_close, state, workers), "reactor-aio-close")


def _close(state: State | None, workers: ThreadPoolExecutor | None) -> None:
    try:
        if state is not None:
            state.close()
    finally:
        if workers is not None:
            workers.shutdown(wait=True)  # what is running is short: reads, tries
