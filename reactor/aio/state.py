"""``AsyncState``, the asyncio handle ``reactor.aio.open`` returns, and its worker
threads.

Only short blocking calls (reads, a transaction body's verbs, a lock's try, opening)
run in threads: a few workers of the handle's own, not the loop's default executor, so
the application's ``asyncio.to_thread`` work and reactor's never queue behind each
other. Waits hold none (``bridge.py``). Closing runs in a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, TypeVar

from reactor._base.clock import Clock
from reactor._base.keys import check_key
from reactor._base.results import Timer
from reactor._engine.events import ChangeEvent
from reactor._engine.options import Durability
from reactor._engine.port import EnginePort
from reactor._handles.binding import engine_of
from reactor._handles.open import open as open_sync
from reactor._handles.state import Events, State, Where, cancelling
from reactor._handles.subscriptions import DEFAULT_BUFFER, Subscription
from reactor.errors import ClosedError

from .bridge import bridge, in_thread
from .exclusive import AsyncLock, AsyncMultiTransaction, check_not_held, wake_lock_lines
from .queue import AsyncQueue
from .scope import AsyncScope
from .watch import AsyncWatch

__all__ = ["AsyncState", "open"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[[ChangeEvent], Any])  # a callback of one event
# Worker threads per handle, for short blocking calls only: waits hold none.
_WORKERS: Final = min(8, (os.cpu_count() or 1) + 2)


def open(  # noqa: A001 - reactor.aio.open, as reactor.open
    target: str | os.PathLike[str] | None = None,
    *,
    durability: Durability | None = None,
    max_value_bytes: int | None = None,
    max_depth: int | None = None,
    max_actors: int | None = None,
    log_retention: int | None = None,
    log_retention_seconds: float | None = None,
    sweep_interval: float | None = None,
    clock: Clock | None = None,
    timeout: float | None = None,
    readonly: bool | None = None,
) -> AsyncState:
    """An asyncio handle to the database ``target``; the targets and options are
    ``reactor.open``'s. It returns at once: the database opens, in a worker thread, on
    ``async with`` or the first call, which raise what ``reactor.open`` would."""
    options: dict[str, Any] = {
        "durability": durability,
        "max_value_bytes": max_value_bytes,
        "max_depth": max_depth,
        "max_actors": max_actors,
        "log_retention": log_retention,
        "log_retention_seconds": log_retention_seconds,
        "sweep_interval": sweep_interval,
        "clock": clock,
        "timeout": timeout,
        "readonly": readonly,
    }
    return AsyncState(target, options)


class AsyncState:
    """The asyncio handle: ``scope()``, and coroutines for what spans scopes."""

    def __init__(self, target: str | os.PathLike[str] | None, options: dict[str, Any]) -> None:
        self._target = target
        self._options = options
        self._state: State | None = None
        self._opening: asyncio.Future[State] | None = None
        self._unstarted: weakref.WeakSet[AsyncWatch] = weakref.WeakSet()
        self._closed = False
        self._workers: ThreadPoolExecutor | None = None

    async def _sync(self) -> State:
        """The synchronous handle, opened in a worker thread on first use."""
        if self._closed:
            raise ClosedError("this reactor handle is closed")
        if self._state is None:
            if self._opening is None:
                self._opening = asyncio.ensure_future(
                    self._run(functools.partial(open_sync, self._target, **self._options))
                )
            state = await asyncio.shield(self._opening)
            if self._state is None:  # the first task to resume: before any other goes on
                self._state = state
                # Watches made before the open start now: before this handle's first
                # write, which waits for the open.
                published = engine_of(state).dispatcher.published
                for watch in self._unstarted:
                    watch._begin_at(published)
                self._unstarted.clear()
        return self._state

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in this handle's worker threads: short blocking calls only
        (a read, a transaction body's verb, a lock's try), never a wait for something
        else to happen, so a few threads serve any number of tasks. They are the
        handle's own, not the loop's default executor: the application's
        ``asyncio.to_thread`` work and reactor's never queue behind each other.

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

    def _answer(self, engine: EnginePort, scope: str, future: Future[T]) -> asyncio.Future[T]:
        """The answer of ``scope``'s actor to a request, awaited on the loop with no
        thread waiting: ``OperationTimeout`` once the scope has not moved on for the
        engine's timeout (see ``Engine.wait``)."""
        return bridge().track(future, scope, engine.options.timeout, engine)

    async def __aenter__(self) -> AsyncState:
        await self._sync()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether this handle is closed (or its engine is)."""
        return self._closed or (self._state is not None and self._state.closed)

    def transaction(self, *scopes: str) -> AsyncMultiTransaction:
        """``async with state.transaction("orders", "ledger") as tx:``: the task owns
        every scope named until the block ends (taken in one order, sorted by name, with
        no thread waiting); ``tx["orders"]``'s verbs (coroutines) commit together, or not
        at all. See ``State.transaction``.

        Raises:
            InvalidArgumentError: no scope named.
            InvalidKeyError: a name that is not a valid scope name, or a scope of events
                (``queue:NAME``, ``run:NAME``), which no transaction writes.
            ReentrancyError: (on entry) this task holds a transaction on one of them.
            ConflictError: (at the end of the block) another process changed one of the
                scopes meanwhile; nothing was applied.
        """
        return AsyncMultiTransaction(self, scopes)

    def lock(self, name: str, ttl: float, timeout: float | None = None) -> AsyncLock:
        """A lease on ``name`` for ``ttl`` seconds, shared by every process on this
        database: ``async with state.lock("deploy", ttl=30, timeout=60):``.

        Raises:
            InvalidKeyError: ``name`` is not a valid name.
            InvalidArgumentError: ``ttl`` is not a number > 0.
        """
        return AsyncLock(self, name, ttl, timeout)

    def queue(self, name: str, max_attempts: int | None = None) -> AsyncQueue:
        """A durable work queue (see ``State.queue``), its verbs as coroutines.

        Raises:
            InvalidKeyError: ``name`` is not a valid name (at most 1,018 characters).
            InvalidArgumentError: ``max_attempts`` is not None or an int >= 1.
        """
        return AsyncQueue(self, name, max_attempts)

    async def queues(self) -> list[str]:
        """``State.queues``: the names of the queues in the database, sorted."""
        return await self._run((await self._sync()).queues)

    def on(
        self,
        scope: str | None = None,
        key: str | None = None,
        events: Events | None = None,
        where: Where | None = None,
        since: int | None = None,
        durable: str | None = None,
    ) -> Callable[[F], F]:
        """``subscribe`` as a decorator, on a handle already open (inside ``async with``,
        or after any awaited call): ``@state.on("orders")`` over ``async def`` or ``def``.

        Raises:
            ClosedError: the handle is not open yet, or closed.
        """
        if self._state is None or self._closed:
            raise ClosedError(
                "this handle is not open: use @state.on inside 'async with reactor.aio.open()'"
            )
        return self._state.on(scope, key, events, where, since, durable)

    def scope(self, name: str) -> AsyncScope:
        """The handle to scope ``name``.

        Raises:
            InvalidKeyError: ``name`` is not a valid scope name.
        """
        return AsyncScope(self, check_key(name, "scope name"))

    async def scopes(self) -> list[str]:
        """The names of the scopes holding at least one live key, sorted."""
        return await self._run((await self._sync()).scopes)

    async def stats(self) -> dict[str, Any]:
        """The same figures as ``State.stats()``."""
        return await self._run((await self._sync()).stats)

    async def timers(self, scope: str = "*") -> list[Timer]:
        """``State.timers``: the pending timers of the matching scopes, earliest first."""
        state = await self._sync()
        return await self._run(state.timers, scope)

    async def cancel_timer(self, timer_id: str) -> bool:
        """``State.cancel_timer``: cancel a pending timer; whether it was pending.

        Raises:
            InvalidArgumentError: ``timer_id`` is not a str.
            ReentrancyError: this task holds a transaction on the timer's scope (use
                the transaction's ``cancel_timer``).
        """
        engine = engine_of(await self._sync())
        found = await self._run(cancelling, engine, timer_id)
        if found is None:
            return False
        scope, work = found
        check_not_held(id(engine), scope)  # its own transaction would hold it up
        return await self._answer(engine, scope, engine.submit(scope, work))

    async def changes(
        self,
        since: int | None = None,
        scope: str | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[ChangeEvent]:
        """The recorded changes after ``since`` (see ``State.changes``)."""
        state = await self._sync()
        return await self._run(state.changes, since, scope, key, limit)

    async def subscribe(
        self,
        callback: Callable[[ChangeEvent], Any],
        scope: str | None = None,
        key: str | None = None,
        events: Events | None = None,
        where: Where | None = None,
        since: int | None = None,
        durable: str | None = None,
        *,
        max_retries: int = 3,
        buffer_size: int = DEFAULT_BUFFER,
    ) -> Subscription:
        """``State.subscribe``; an ``async def`` callback runs on this loop."""
        state = await self._sync()
        # Subscribed here, on the loop, so that an async callback is bound to it; the
        # few reads it makes (a durable position) are quick and never wait on a lock.
        return state.subscribe(
            callback,
            scope,
            key,
            events,
            where,
            since,
            durable,
            max_retries=max_retries,
            buffer_size=buffer_size,
        )

    def watch(
        self, since: int | None = None, scope: str | None = None, key: str | None = None
    ) -> AsyncWatch:
        """An async iterator over changes: those after ``since``, then live ones.

        Without ``since`` it starts now, at this call: the changes committed after it
        returns are all yielded, also those committed before the first iteration. On a
        handle not open yet (``reactor.aio.open`` returns at once and opens on first
        use), "now" is when the first iteration opens it: this handle wrote nothing
        before that.

        Raises:
            ClosedError: the handle is closed.
        """
        if self._closed:
            raise ClosedError("this reactor handle is closed")
        if since is None and self._state is not None:
            # Where "now" is, read on the loop: the last revision this engine published
            # (no lock, no thread), where a sync watch starts too. The first iteration
            # replays the log from there, so the changes committed between this call
            # and that one are not missed.
            since = engine_of(self._state).dispatcher.published
        watch = AsyncWatch(self, since, scope, key)
        if since is None:
            self._unstarted.add(watch)  # it starts when the handle opens (``_sync``)
        return watch

    async def close(self) -> None:
        """Close this handle; idempotent. Lock waiters get ``ClosedError``; watches end
        when the engine closes (with its last handle). Closing waits for the actors and
        subscribers to finish: it runs in a thread of its own, ended on return."""
        self._closed = True
        wake_lock_lines()  # waiters look again, and find the handle closed
        opening, self._opening = self._opening, None
        state, self._state = self._state, None
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
