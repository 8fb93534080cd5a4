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
once per result as ``asyncio.wrap_future`` would. Reads, opening and closing run in the
loop's default executor.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import dataclasses
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar, cast

from . import _writes
from ._aio_exclusive import AsyncLock, AsyncTransaction, check_not_held
from ._engine import Engine, operation_timeout
from ._events import ChangeEvent
from ._keys import check_key
from ._open import open as open_sync
from ._results import Change, Snapshot, UpdateResult
from ._scope import Scope
from ._state import State
from ._subscriptions import Subscription, Watch
from ._verbs import Verbs
from .errors import ClosedError

__all__ = ["AsyncLock", "AsyncScope", "AsyncState", "AsyncTransaction", "AsyncWatch", "open"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
_DONE = object()


def open(target: str | os.PathLike[str] | None = None, **options: Any) -> AsyncState:  # noqa: A001
    """An asyncio handle to the database ``target`` (see ``reactor.open`` for the
    targets and options). It returns at once; the database opens, in a worker thread,
    on ``async with`` or the first call."""
    return AsyncState(target, options)


class _LoopBridge:
    """Hands results from the actor's thread to one event loop, many per wake-up, and
    times the requests out with one timer for all (not one ``asyncio.timeout`` each)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[Future[Any], asyncio.Future[Any]]] = []
        # Requests in the order they were made, per timeout: their deadlines ascend.
        self._waiting: dict[float, collections.deque[_Waiting]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def track(self, source: Future[Any], scope: str, timeout: float | None) -> asyncio.Future[Any]:
        """An asyncio future, on this loop, that settles as ``source`` does, or fails
        with ``OperationTimeout`` after ``timeout`` seconds."""
        target: asyncio.Future[Any] = self._loop.create_future()
        source.add_done_callback(lambda done: self._settled(done, target))
        if timeout is not None:
            deadline = self._loop.time() + timeout
            queue = self._waiting.get(timeout)
            if queue is None:
                queue = self._waiting[timeout] = collections.deque()
            queue.append(_Waiting(deadline, target, source, scope, timeout))
            if self._timer is None or deadline < self._timer.when():
                self._arm(deadline)
        return target

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
                if not waiting.target.done():
                    waiting.target.set_exception(
                        operation_timeout(waiting.scope, waiting.timeout, waiting.source)
                    )
            if queue and (earliest is None or queue[0].deadline < earliest):
                earliest = queue[0].deadline
        if earliest is not None:
            self._arm(earliest)

    def _settled(self, source: Future[Any], target: asyncio.Future[Any]) -> None:
        with self._lock:
            self._ready.append((source, target))
            first = len(self._ready) == 1
        if first:  # the loop is woken once; what settles meanwhile joins that wake-up
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for source, target in ready:
            if target.done():
                continue  # its caller stopped waiting (a timeout)
            if source.cancelled():
                target.cancel()
            elif (error := source.exception()) is not None:
                target.set_exception(error)
            else:
                target.set_result(source.result())
        for queue in self._waiting.values():  # forget what is answered (mostly in order)
            while queue and queue[0].target.done():
                queue.popleft()


@dataclasses.dataclass(slots=True)
class _Waiting:
    deadline: float
    target: asyncio.Future[Any]
    source: Future[Any]
    scope: str
    timeout: float


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBridge] = (
    weakref.WeakKeyDictionary()
)


def _bridge() -> _LoopBridge:
    loop = asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _bridges[loop] = _LoopBridge(loop)
    return bridge


class _Writer(Verbs):
    """The write verbs of a scope, returning the actor's future instead of waiting."""

    __slots__ = ("_state", "name")

    def __init__(self, state: State, name: str) -> None:
        self._state = state
        self.name = name

    def _usable(self) -> Engine:
        return self._state._engine_or_raise()

    def _run(self, work: _writes.Work) -> Future[Any]:
        return self._usable().mailbox(self.name).submit(work, self.name)


class AsyncState:
    """The asyncio handle: ``scope()``, and coroutines for what spans scopes."""

    def __init__(self, target: str | os.PathLike[str] | None, options: dict[str, Any]) -> None:
        self._target = target
        self._options = options
        self._state: State | None = None
        self._opening: asyncio.Future[State] | None = None
        self._closed = False

    async def _sync(self) -> State:
        """The synchronous handle, opened in a worker thread on first use."""
        if self._closed:
            raise ClosedError("this reactor handle is closed")
        if self._state is None:
            if self._opening is None:
                self._opening = asyncio.ensure_future(
                    asyncio.to_thread(open_sync, self._target, **self._options)
                )
            self._state = await asyncio.shield(self._opening)
        return self._state

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

    def lock(self, name: str, ttl: float, timeout: float | None = None) -> AsyncLock:
        """A lease on ``name`` for ``ttl`` seconds, shared by every process on this
        database: ``async with state.lock("deploy", ttl=30, timeout=60):``.

        Raises:
            InvalidKeyError: ``name`` is not a valid name.
            InvalidArgumentError: ``ttl`` is not a number > 0.
        """
        return AsyncLock(self, name, ttl, timeout)

    def on(
        self,
        scope: str | None = None,
        key: str | None = None,
        events: Any = None,
        where: Any = None,
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
        return await asyncio.to_thread((await self._sync()).scopes)

    async def stats(self) -> dict[str, Any]:
        """The same figures as ``State.stats()``."""
        return await asyncio.to_thread((await self._sync()).stats)

    async def changes(
        self,
        since: int = 0,
        scope: str | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[ChangeEvent]:
        """The recorded changes after ``since`` (see ``State.changes``)."""
        state = await self._sync()
        return await asyncio.to_thread(state.changes, since, scope, key, limit)

    async def subscribe(
        self, callback: Callable[[ChangeEvent], Any], *args: Any, **kwargs: Any
    ) -> Subscription:
        """``State.subscribe``; an ``async def`` callback runs on this loop."""
        state = await self._sync()
        # Subscribed here, on the loop, so that an async callback is bound to it; the
        # few reads it makes (a durable position) are quick and never wait on a lock.
        return state.subscribe(callback, *args, **kwargs)

    def watch(
        self, since: int | None = None, scope: str | None = None, key: str | None = None
    ) -> AsyncWatch:
        """An async iterator over changes: those after ``since``, then live ones."""
        return AsyncWatch(self, since, scope, key)

    async def close(self) -> None:
        """Close this handle (in a worker thread); idempotent."""
        self._closed = True
        opening, self._opening = self._opening, None
        state, self._state = self._state, None
        if state is None and opening is not None:
            state = await asyncio.shield(opening)
        if state is not None:
            await asyncio.to_thread(state.close)


class AsyncScope:
    """A scope's verbs as coroutines; the same results and errors as ``Scope``'s."""

    __slots__ = ("_handle", "_scope", "_writer", "name")

    def __init__(self, handle: AsyncState, name: str) -> None:
        self._handle = handle
        self.name = name
        self._scope: Scope | None = None
        self._writer: _Writer | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncScope {self.name!r}>"

    async def _reader(self) -> Scope:
        if self._scope is None:
            self._scope = (await self._handle._sync()).scope(self.name)
        return self._scope

    async def _write(self, submit: Callable[[_Writer], Any]) -> Any:
        if self._writer is None:
            self._writer = _Writer(await self._handle._sync(), self.name)
        check_not_held(id(self._writer._usable()), self.name)
        future = cast(Future[Any], submit(self._writer))
        timeout = self._writer._usable().options.timeout
        return await _bridge().track(future, self.name, timeout)

    def transaction(self) -> AsyncTransaction:
        """``async with scope.transaction() as tx:``: the scope is this task's until the
        block ends; ``tx``'s verbs (coroutines) commit together, or not at all.

        Raises (at the end of the block):
            ConflictError: another process changed the scope meanwhile (nothing applied).
        """
        return AsyncTransaction(self._handle, self.name)

    async def _read(self, read: Callable[[Scope], T]) -> T:
        scope = await self._reader()
        return await asyncio.to_thread(read, scope)

    # -- reads ---------------------------------------------------------------------
    async def get(self, key: str, default: Any = None) -> Any:
        return await self._read(lambda scope: scope.get(key, default))

    async def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        wanted = list(keys)
        return await self._read(lambda scope: scope.get_many(wanted))

    async def exists(self, key: str) -> bool:
        return await self._read(lambda scope: scope.exists(key))

    async def list(self) -> dict[str, Any]:
        return await self._read(lambda scope: scope.list())

    async def keys(self, pattern: str = "*") -> builtins.list[str]:
        return await self._read(lambda scope: scope.keys(pattern))

    async def ttl(self, key: str) -> float:
        return await self._read(lambda scope: scope.ttl(key))

    async def length(self, key: str) -> int:
        return await self._read(lambda scope: scope.length(key))

    async def snapshot(self) -> Snapshot:
        return await self._read(lambda scope: scope.snapshot())

    # -- writes --------------------------------------------------------------------
    async def set(
        self, key: str, value: Any, ttl: float | None = None, keep_ttl: bool = False
    ) -> Change:
        return cast(Change, await self._write(lambda w: w.set(key, value, ttl, keep_ttl)))

    async def set_many(
        self, mapping: Mapping[str, Any], ttl: float | None = None
    ) -> dict[str, Change]:
        if not mapping:
            return {}
        return cast(dict[str, Change], await self._write(lambda w: w.set_many(mapping, ttl)))

    async def delete(self, key: str) -> Any:
        return await self._write(lambda w: w.delete(key))

    async def clear(self, pattern: str = "*") -> int:
        return cast(int, await self._write(lambda w: w.clear(pattern)))

    async def expire(self, key: str, seconds: float | None) -> bool:
        return cast(bool, await self._write(lambda w: w.expire(key, seconds)))

    async def increment(
        self, key: str, by: int | float = 1, default: int | float = 0
    ) -> int | float:
        return cast(int | float, await self._write(lambda w: w.increment(key, by, default)))

    async def decrement(
        self, key: str, by: int | float = 1, default: int | float = 0
    ) -> int | float:
        return cast(int | float, await self._write(lambda w: w.decrement(key, by, default)))

    async def append(self, key: str, text: str) -> int:
        return cast(int, await self._write(lambda w: w.append(key, text)))

    async def compare_and_swap(self, key: str, expected: Any, new: Any) -> bool:
        return cast(bool, await self._write(lambda w: w.compare_and_swap(key, expected, new)))

    async def push(self, key: str, *items: Any) -> int:
        return cast(int, await self._write(lambda w: w.push(key, *items)))

    async def pop(self, key: str, front: bool = False) -> Any:
        return await self._write(lambda w: w.pop(key, front))

    async def update(
        self, key: str, ops: builtins.list[dict[str, Any]], atomic: bool | None = None
    ) -> UpdateResult:
        return cast(UpdateResult, await self._write(lambda w: w.update(key, ops, atomic)))


class AsyncWatch:
    """``async for event in state.watch(...)``; ends when closed or when the engine
    closes. Each wait for the next event runs in a worker thread."""

    def __init__(
        self, handle: AsyncState, since: int | None, scope: str | None, key: str | None
    ) -> None:
        self._handle = handle
        self._args = (since, scope, key)
        self._watch: Watch | None = None

    def __aiter__(self) -> AsyncIterator[ChangeEvent]:
        return self

    async def __anext__(self) -> ChangeEvent:
        if self._watch is None:
            state = await self._handle._sync()
            self._watch = await asyncio.to_thread(state.watch, *self._args)
        item = await asyncio.to_thread(next, self._watch, _DONE)
        if item is _DONE:
            raise StopAsyncIteration
        return cast(ChangeEvent, item)

    async def aclose(self) -> None:
        """Stop the watch; iteration ends."""
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
