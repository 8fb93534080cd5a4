"""reactor for asyncio: the same engine, with verbs as coroutines.

```python
import reactor.aio

async with reactor.aio.open("state.db") as state:
    orders = state.scope("orders")
    await orders.set("o-1", {"total": 120})
    async for event in state.watch(scope="orders"):
        ...
```

No call blocks the event loop. Writes are validated and encoded on the loop (CPU only),
then queued for the scope's actor, so 100 tasks writing at once give the actor 100
requests to commit together. The answers come back to the loop together too: a
``_LoopBridge`` wakes the loop once for all the results a batch produced, instead of
once per result as ``asyncio.wrap_future`` would.

Nothing waits in a thread. A request waiting for its answer (a write, a transaction's
turn at its scope, a commit) is an asyncio future the bridge settles; an idle watch is
an asyncio event its feed sets through the bridge; a task waiting for a lock sleeps on
the loop (``_aio_exclusive``). Only short blocking calls (reads, a transaction body's
verbs, a lock's try, opening) run in threads: a few workers of the handle's own, not the
loop's default executor, so the application's ``asyncio.to_thread`` work and reactor's
never queue behind each other. Closing runs in a thread of its own.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import collections
import contextlib
import dataclasses
import functools
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from time import perf_counter
from types import TracebackType
from typing import Any, Final, TypeVar

from reactor._base.clock import Clock
from reactor._base.keys import check_key, check_writable
from reactor._base.results import Change, Snapshot, Timer, UpdateResult
from reactor._base.values import MISSING
from reactor._engine.engine import operation_timeout
from reactor._engine.events import ChangeEvent
from reactor._engine.options import Durability
from reactor._engine.port import EnginePort
from reactor._handles import queues as _queues
from reactor._handles import waiting as _waiting
from reactor._handles.binding import binding_of, engine_of
from reactor._handles.open import open as open_sync
from reactor._handles.scope import Scope
from reactor._handles.state import Events, State, Where
from reactor._handles.subscriptions import _PAGE, DEFAULT_BUFFER, Subscription, Watch
from reactor._handles.verbs import ScopeVerbs
from reactor._work import jobs as _jobs
from reactor._work import timers as _timers
from reactor._work import writes as _writes
from reactor._work.timers import check_timer_id, drop_timer
from reactor._work.writes import Work
from reactor.errors import ClosedError

from .exclusive import (
    AsyncLock,
    AsyncMultiTransaction,
    AsyncTransaction,
    check_not_held,
    wake_lock_lines,
)
from .reads import AsyncReads

__all__ = [
    "AsyncJob",
    "AsyncLock",
    "AsyncMultiTransaction",
    "AsyncQueue",
    "AsyncScope",
    "AsyncState",
    "AsyncTransaction",
    "AsyncWatch",
    "open",
]

# Where users find them (repr, help, pickle), as in reactor/__init__.py.
AsyncLock.__module__ = AsyncMultiTransaction.__module__ = AsyncTransaction.__module__ = __name__

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
        "clock": clock,
        "timeout": timeout,
        "readonly": readonly,
    }
    return AsyncState(target, options)


class _LoopBridge:
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


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBridge] = (
    weakref.WeakKeyDictionary()
)


def _bridge() -> _LoopBridge:
    loop = asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _bridges[loop] = _LoopBridge(loop)
    return bridge


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
        return _bridge().track(future, scope, engine.options.timeout, engine)

    async def __aenter__(self) -> AsyncState:
        await self._sync()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
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
        """``State.cancel_timer``: cancel a pending timer; whether it was pending."""
        state = await self._sync()
        check_timer_id(timer_id)
        engine = engine_of(state)
        row = await self._run(engine.store.timer, timer_id)
        if row is None:
            return False
        check_not_held(id(engine), row.scope)  # its own transaction would hold it up
        future = engine.submit(row.scope, drop_timer(timer_id))
        cancelled: bool = await self._answer(engine, row.scope, future)
        return cancelled

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
            await _in_thread(functools.partial(_close, state, workers), "reactor-aio-close")


def _close(state: State | None, workers: ThreadPoolExecutor | None) -> None:
    try:
        if state is not None:
            state.close()
    finally:
        if workers is not None:
            workers.shutdown(wait=True)  # what is running is short: reads, tries


async def _in_thread(call: Callable[[], None], name: str) -> None:
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
    await _bridge().track(done, "", None)
    while thread.is_alive():  # it is returning: a join that does not block the loop
        await asyncio.sleep(0.001)


class AsyncScope(AsyncReads):
    """A scope's verbs as coroutines; the same results and errors as ``Scope``'s."""

    __slots__ = ("_handle", "_scope", "name")

    def __init__(self, handle: AsyncState, name: str) -> None:
        self._handle = handle
        self.name = name
        self._scope: Scope | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncScope {self.name!r}>"

    async def _reader(self) -> Scope:
        if self._scope is None:
            self._scope = (await self._handle._sync()).scope(self.name)
        return self._scope

    async def _engine(self) -> EnginePort:
        """The engine, once this task may wait on the scope.

        Raises:
            ClosedError: the handle is closed.
            ReentrancyError: this task holds a transaction on the scope.
        """
        engine = engine_of(await self._handle._sync())
        check_not_held(id(engine), self.name)
        return engine

    async def _writer(self) -> EnginePort:
        """The engine, once this task may write to the scope.

        Raises:
            InvalidKeyError: a scope of events (``queue:NAME``, ``run:NAME``).
            ClosedError: the handle is closed.
            ReentrancyError: this task holds a transaction on the scope.
        """
        check_writable(self.name)
        return await self._engine()

    async def _submit(self, verb: str, engine: EnginePort, work: Work[T]) -> T:
        """Queue ``work`` for the scope's actor and await its result (no thread waits);
        timed for ``stats()`` from the request to the answer."""
        start = perf_counter()
        try:
            future = engine.submit(self.name, work)
            return await self._handle._answer(engine, self.name, future)
        finally:
            engine.stats.record(verb, perf_counter() - start)

    def transaction(self) -> AsyncTransaction:
        """``async with scope.transaction() as tx:``: the scope is this task's until the
        block ends; ``tx``'s verbs (coroutines) commit together, or not at all.

        Raises:
            InvalidKeyError: a scope of events (``queue:NAME``, ``run:NAME``), which
                no transaction writes.
            ConflictError: (at the end of the block) another process changed the scope
                meanwhile; nothing was applied.
        """
        return AsyncTransaction(self._handle, check_writable(self.name))

    async def _read(self, read: Callable[[ScopeVerbs], T]) -> T:
        scope = await self._reader()
        return await self._handle._run(read, scope)

    # -- reads: AsyncReads' --------------------------------------------------------
    async def snapshot(self) -> Snapshot:
        """``Scope.snapshot``: every live key-value and the revision they are current at."""
        return await self._handle._run(Scope.snapshot, await self._reader())

    # -- waiting -------------------------------------------------------------------
    async def wait_for(
        self,
        key: str,
        predicate: _waiting.Predicate | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``Scope.wait_for``: wait until ``key`` holds a value for which
        ``predicate(value)`` is true (or, without one, exists); return that value.

        No thread waits: changes wake the task through the loop, and the predicate runs
        on the loop. Cancelling the task ends the wait.

        Raises:
            OperationTimeout: ``timeout`` seconds went by first (None: no limit).
            ClosedError: the engine closed first.
            InvalidArgumentError: ``predicate`` is not callable, or ``timeout`` is not
                None or a number >= 0.
        """
        checked, seconds = _waiting.check_wait(key, predicate, timeout)
        engine = await self._engine()
        start = perf_counter()
        try:
            return await _waiting.wait_async(
                engine,
                self.name,
                checked,
                predicate,
                seconds,
                call_soon=_bridge().call_soon,
                run=self._handle._run,
            )
        finally:
            engine.stats.record("wait_for", perf_counter() - start)

    # -- writes: each verb's checks and work are _writes', as for Scope ------------
    async def set(
        self,
        key: str,
        value: Any,
        ttl: float | None = None,
        keep_ttl: bool = False,
        *,
        if_revision: int | None = None,
    ) -> Change:
        """``Scope.set``: store ``value`` at ``key``; return the old and new value."""
        engine = await self._writer()
        work = _writes.set_value(engine.options, self.name, key, value, ttl, keep_ttl, if_revision)
        return await self._submit("set", engine, work)

    async def set_many(
        self,
        mapping: Mapping[str, Any],
        ttl: float | None = None,
        *,
        if_revision: int | None = None,
    ) -> dict[str, Change]:
        """``Scope.set_many``: every key-value of ``mapping`` in one write."""
        engine = await self._writer()
        work = _writes.set_many(engine.options, self.name, mapping, ttl, if_revision)
        return {} if work is None else await self._submit("set_many", engine, work)

    async def delete(self, key: str, *, if_revision: int | None = None) -> Any:
        """``Scope.delete``: remove ``key``; return its old value, or None."""
        engine = await self._writer()
        work = _writes.delete(self.name, key, if_revision)
        return await self._submit("delete", engine, work)

    async def clear(self, pattern: str = "*", *, if_revision: int | None = None) -> int:
        """``Scope.clear``: remove the keys matching ``pattern``; return how many."""
        engine = await self._writer()
        work = _writes.clear(self.name, pattern, if_revision)
        return await self._submit("clear", engine, work)

    async def expire(
        self, key: str, seconds: float | None, *, if_revision: int | None = None
    ) -> bool:
        """``Scope.expire``: a new expiry for ``key``; whether it existed."""
        engine = await self._writer()
        work = _writes.expire(self.name, key, seconds, if_revision)
        return await self._submit("expire", engine, work)

    async def increment(
        self,
        key: str,
        by: int | float = 1,
        default: int | float = 0,
        *,
        if_revision: int | None = None,
    ) -> int | float:
        """``Scope.increment``: add ``by`` to the number at ``key``; the result."""
        engine = await self._writer()
        work = _writes.increment(engine.options, self.name, key, by, default, if_revision)
        return await self._submit("increment", engine, work)

    async def decrement(
        self,
        key: str,
        by: int | float = 1,
        default: int | float = 0,
        *,
        if_revision: int | None = None,
    ) -> int | float:
        """``Scope.decrement``: subtract ``by`` from the number at ``key``; the result."""
        engine = await self._writer()
        work = _writes.increment(
            engine.options, self.name, key, by, default, if_revision, down=True
        )
        return await self._submit("decrement", engine, work)

    async def append(self, key: str, text: str, *, if_revision: int | None = None) -> int:
        """``Scope.append``: append ``text`` to the string at ``key``; its length."""
        engine = await self._writer()
        work = _writes.append_text(engine.options, self.name, key, text, if_revision)
        return await self._submit("append", engine, work)

    async def compare_and_swap(
        self, key: str, expected: Any, new: Any, *, if_revision: int | None = None
    ) -> bool:
        """``Scope.compare_and_swap``: set ``key`` to ``new`` if it holds ``expected``."""
        engine = await self._writer()
        work = _writes.compare_and_swap(engine.options, self.name, key, expected, new, if_revision)
        return await self._submit("compare_and_swap", engine, work)

    async def push(self, key: str, *items: Any, if_revision: int | None = None) -> int:
        """``Scope.push``: append ``items`` to the list at ``key``; its length."""
        engine = await self._writer()
        work = _writes.push(engine.options, self.name, key, items, if_revision)
        return await self._submit("push", engine, work)

    async def pop(self, key: str, front: bool = False, *, if_revision: int | None = None) -> Any:
        """``Scope.pop``: remove and return the last (or first) item of the list."""
        engine = await self._writer()
        work = _writes.pop(self.name, key, front, if_revision)
        return await self._submit("pop", engine, work)

    async def schedule(
        self,
        key: str,
        value: Any = MISSING,
        *,
        after: float | None = None,
        at: float | None = None,
        every: float | None = None,
        ops: builtins.list[dict[str, Any]] | None = None,
    ) -> Timer:
        """``Scope.schedule``: a write of ``value`` (or ``ops``) to ``key``, due later."""
        engine = await self._writer()
        work = _timers.schedule(engine.options, self.name, key, value, ops, after, at, every)
        return await self._submit("schedule", engine, work)

    async def update(
        self,
        key: str,
        ops: builtins.list[dict[str, Any]],
        atomic: bool | None = None,
        *,
        if_revision: int | None = None,
    ) -> UpdateResult:
        """``Scope.update``: apply update ops or a JSON Patch in one write."""
        engine = await self._writer()
        work = _writes.update(engine.options, self.name, key, ops, atomic, if_revision)
        return await self._submit("update", engine, work)


class AsyncQueue:
    """A durable work queue's verbs as coroutines (see ``reactor.Queue``). A take that
    waits holds no thread: puts and leases running out wake the task through the loop."""

    __slots__ = ("_handle", "_max_attempts", "_queue", "name")

    def __init__(self, handle: AsyncState, name: str, max_attempts: int | None) -> None:
        self._handle = handle
        self.name: str = _jobs.check_queue(name)
        """The queue's name; its events have scope ``queue:NAME``."""
        self._max_attempts = _jobs.check_max_attempts(max_attempts)
        self._queue: _queues.Queue | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncQueue {self.name!r}>"

    async def _sync(self) -> _queues.Queue:
        if self._queue is None:
            self._queue = (await self._handle._sync()).queue(self.name, self._max_attempts)
        return self._queue

    async def put(self, item: Any, delay: float | None = None, key: str | None = None) -> int:
        """``Queue.put``: add a job (after ``delay`` seconds); its id. ``key``: a put
        with the key of a job the queue holds adds nothing, and returns that job's id."""
        queue = await self._sync()
        return await self._handle._run(queue.put, item, delay, key)

    async def take(
        self, timeout: float | None = None, lease: float = _jobs.DEFAULT_LEASE
    ) -> AsyncJob | None:
        """``Queue.take``: the next ready job, for ``lease`` seconds, or None if none
        came within ``timeout`` seconds (None: wait until one comes; 0: look once).

        No thread waits. Cancelling the task ends the wait; a job taken meanwhile is
        given back as it was (its attempts unchanged).

        Raises:
            ClosedError: the engine closed while it waited.
            InvalidArgumentError: a bad ``timeout`` or ``lease``.
            ReadOnlyError: the engine is read-only.
        """
        seconds = _jobs.check_lease(lease)
        wait = _jobs.check_timeout(timeout)
        queue = await self._sync()
        engine = _queues._writable(binding_of(await self._handle._sync()))
        start = perf_counter()
        try:
            job = await _queues.take_async(
                queue,
                engine,
                seconds,
                wait,
                call_soon=_bridge().call_soon,
                run=self._handle._run,
            )
        finally:
            engine.stats.record("queue.take", perf_counter() - start)
        return None if job is None else AsyncJob(self._handle, job)

    async def stats(self) -> dict[str, int]:
        """``Queue.stats``: how many jobs are ready, delayed, taken and dead."""
        return await self._handle._run((await self._sync()).stats)

    async def dead(self, limit: int | None = None) -> builtins.list[AsyncJob]:
        """``Queue.dead``: the dead jobs, in the order they died."""
        jobs = await self._handle._run((await self._sync()).dead, limit)
        return [AsyncJob(self._handle, job) for job in jobs]

    async def retry_dead(self) -> int:
        """``Queue.retry_dead``: make every dead job ready again; how many."""
        return await self._handle._run((await self._sync()).retry_dead)


class AsyncJob:
    """A job taken from an ``AsyncQueue``, its ``ack``, ``nack`` and ``extend`` as
    coroutines (see ``reactor.Job``)."""

    __slots__ = ("_handle", "_job")

    def __init__(self, handle: AsyncState, job: _queues.Job) -> None:
        self._handle = handle
        self._job = job

    def __repr__(self) -> str:
        job = self._job
        return f"AsyncJob(id={job.id}, item={job.item!r}, attempts={job.attempts})"

    @property
    def id(self) -> int:
        """The job's id in its queue."""
        return self._job.id

    @property
    def item(self) -> Any:
        """The job's item."""
        return self._job.item

    @property
    def attempts(self) -> int:
        """How many times it has been taken (1 at its first take)."""
        return self._job.attempts

    @property
    def queue(self) -> str:
        """The name of the job's queue."""
        return self._job.queue

    async def ack(self) -> None:
        """``Job.ack``: done, removed. Raises ``LockNotOwnedError`` if the lease is lost."""
        await self._handle._run(self._job.ack)

    async def nack(self, delay: float | None = None) -> None:
        """``Job.nack``: back to the queue (after ``delay``), or dead after its last
        attempt."""
        await self._handle._run(self._job.nack, delay)

    async def extend(self, seconds: float | None = None) -> None:
        """``Job.extend``: the lease now ends ``seconds`` from now."""
        await self._handle._run(self._job.extend, seconds)


class AsyncWatch:
    """``async for event in state.watch(...)``; ends when closed or when the engine
    closes. Waiting for the next event holds no thread: the watch wakes the loop when
    events arrive (one wake-up for a burst, shared by every watch on the loop). The
    replay of the log after ``since`` is read a page at a time in the handle's worker
    threads. Until its first iteration a watch holds nothing (no feed, no buffer): the
    replay covers what was committed since it was made (``since``: ``state.watch``
    sets it to "now" when none is given)."""

    def __init__(
        self, handle: AsyncState, since: int | None, scope: str | None, key: str | None
    ) -> None:
        self._handle = handle
        self._args = (since, scope, key)
        self._watch: Watch | None = None
        self._replay: Iterator[ChangeEvent] | None = None
        self._page: collections.deque[ChangeEvent] = collections.deque()
        self._failed: Exception | None = None
        self._arrived = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[ChangeEvent]:
        return self

    async def __anext__(self) -> ChangeEvent:
        watch = self._watch or await self._start()
        replay = self._replay
        if not self._page and replay is not None:
            page, more, failed = await self._handle._run(_next_page, replay)
            if self._replay is replay:  # not closed meanwhile
                self._page.extend(page)
                self._failed = failed
                if not more:
                    self._replay = None
        if self._page:
            return self._page.popleft()
        if self._failed is not None:  # the replay cannot go on: the watch ends with it
            error, self._failed = self._failed, None
            watch.close()
            raise error
        while True:
            self._arrived.clear()  # before looking: an event offered from now on sets it
            item = watch._take()
            if isinstance(item, ChangeEvent):
                return item
            if item:
                raise StopAsyncIteration
            await self._arrived.wait()

    def _begin_at(self, revision: int) -> None:
        """Start after ``revision`` (a watch made before its handle opened)."""
        since, scope, key = self._args
        if since is None and self._watch is None:
            self._args = (revision, scope, key)

    async def _start(self) -> Watch:
        state = await self._handle._sync()
        creating = asyncio.ensure_future(self._handle._run(state.watch, *self._args))
        try:
            watch = await asyncio.shield(creating)
        except asyncio.CancelledError:
            creating.add_done_callback(_close_created)  # nobody will iterate it
            raise
        watch._on_ready = functools.partial(_bridge().call_soon, self._arrived.set)
        if self._args[0] is not None:
            self._replay = watch._replay()
        self._watch = watch
        return watch

    async def aclose(self) -> None:
        """Stop the watch; iteration ends."""
        self._replay = None
        self._page.clear()
        if self._watch is not None:
            self._watch.close()

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


def _next_page(
    replay: Iterator[ChangeEvent],
) -> tuple[builtins.list[ChangeEvent], bool, Exception | None]:
    """Up to a page of a watch's replay (in a worker thread): the events, whether the
    replay goes on, and the error that ended it, if one did (raised once the events
    read before it are taken)."""
    page: builtins.list[ChangeEvent] = []
    try:
        for event in replay:
            page.append(event)
            if len(page) >= _PAGE:
                return page, True, None
    except Exception as exc:  # noqa: BLE001 - raised to the iterator after this page
        return page, False, exc
    return page, False, None


def _close_created(creating: asyncio.Future[Watch]) -> None:
    if not creating.cancelled() and creating.exception() is None:
        creating.result().close()
