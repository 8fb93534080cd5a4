"""``AsyncState``, the asyncio handle ``reactor.aio.open`` returns: the verbs that span
scopes as coroutines, and the scopes, transactions, locks, queues and watches taken from
it, all tied to the synchronous handle by one ``Link`` (its worker threads, its answers).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, Unpack

from reactor._base.clock import Clock
from reactor._base.codecs import Codec, check_codec
from reactor._base.keys import Globs, check_key
from reactor._base.results import RunInfo, Timer
from reactor._engine.events import ChangeEvent
from reactor._engine.options import Durability
from reactor._handles.binding import engine_of
from reactor._handles.reader import Reader
from reactor._handles.state import Events, State, Where, cancelling
from reactor._handles.subscriptions import DEFAULT_BUFFER, Subscription
from reactor._work.queue_settings import QueueOptions
from reactor.errors import ClosedError

from .bridge import bridge
from .derived import AsyncDerived
from .exclusive import AsyncLock, AsyncMultiTransaction, check_not_held
from .link import Link
from .queue import AsyncQueue
from .runs import AsyncRunHandle, AsyncWorkers, AsyncWorkflows
from .scope import AsyncScope
from .watch import AsyncWatch

__all__ = ["AsyncState", "adopt", "open"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[[ChangeEvent], Any])  # a callback of one event
W = TypeVar("W", bound=Callable[..., Any])  # a workflow function


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
    codec: Codec | None = None,
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
        "codec": check_codec(codec),
    }
    return AsyncState(target, options)


class AsyncState:
    """The asyncio handle: ``scope()``, and coroutines for what spans scopes."""

    def __init__(
        self,
        target: str | os.PathLike[str] | None,
        options: dict[str, Any],
        link: Link | None = None,
    ) -> None:
        self._link = Link(target, options) if link is None else link
        self._runs = AsyncWorkflows(self._link)
        _links[self] = self._link

    async def _sync(self) -> State:
        """The synchronous handle, opened on first use (``Link.sync``)."""
        return await self._link.sync()

    async def __aenter__(self) -> AsyncState:
        await self._link.sync()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether this handle is closed (or its engine is)."""
        return self._link.closed

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
        return AsyncMultiTransaction(self._link, scopes)

    def lock(self, name: str, ttl: float, timeout: float | None = None) -> AsyncLock:
        """A lease on ``name`` for ``ttl`` seconds, shared by every process on this
        database: ``async with state.lock("deploy", ttl=30, timeout=60):``.

        Raises:
            InvalidKeyError: ``name`` is not a valid name.
            InvalidArgumentError: ``ttl`` is not a number > 0.
        """
        return AsyncLock(self._link, name, ttl, timeout)

    def queue(
        self, name: str, max_attempts: int | None = None, **options: Unpack[QueueOptions]
    ) -> AsyncQueue:
        """A durable work queue (see ``State.queue``: ``concurrency``,
        ``group_concurrency``, ``rate``, ``backoff``), its verbs as coroutines.

        Raises:
            InvalidKeyError: ``name`` is not a valid name (at most 1,018 characters).
            InvalidArgumentError: a setting of the wrong type or out of range.
        """
        return AsyncQueue(self._link, name, max_attempts, options)

    async def queues(self) -> list[str]:
        """``State.queues``: the names of the queues in the database, sorted."""
        return await self._link.run((await self._link.sync()).queues)

    def on(
        self,
        scope: Globs | None = None,
        key: Globs | None = None,
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
        state = self._link.state
        if state is None or self._link.closed:
            raise ClosedError(
                "this handle is not open: use @state.on inside 'async with reactor.aio.open()'"
            )
        return state.on(scope, key, events, where, since, durable)

    def scope(self, name: str, *, codec: Codec | None = None) -> AsyncScope:
        """The handle to scope ``name``; ``codec``: its own, in place of the state's.

        Raises:
            InvalidKeyError: ``name`` is not a valid scope name.
            InvalidArgumentError: ``codec`` has no ``encode`` and ``decode`` methods.
        """
        return AsyncScope(self._link, check_key(name, "scope name"), check_codec(codec))

    async def scopes(self) -> list[str]:
        """The names of the scopes holding at least one live key, sorted."""
        return await self._link.run((await self._link.sync()).scopes)

    async def stats(self) -> dict[str, Any]:
        """The same figures as ``State.stats()``."""
        return await self._link.run((await self._link.sync()).stats)

    async def timers(self, scope: str = "*") -> list[Timer]:
        """``State.timers``: the pending timers of the matching scopes, earliest first."""
        state = await self._link.sync()
        return await self._link.run(state.timers, scope)

    async def cancel_timer(self, timer_id: str) -> bool:
        """``State.cancel_timer``: cancel a pending timer; whether it was pending.

        Raises:
            InvalidArgumentError: ``timer_id`` is not a str.
            ReentrancyError: this task holds a transaction on the timer's scope (use
                the transaction's ``cancel_timer``).
        """
        engine = engine_of(await self._link.sync())
        found = await self._link.run(cancelling, engine, timer_id)
        if found is None:
            return False
        scope, work = found
        check_not_held(id(engine), scope)  # its own transaction would hold it up
        answer = bridge().send(engine, scope, work)
        try:
            return await answer.target
        except asyncio.CancelledError:
            answer.cancel()  # withdrawn, unless the actor has begun it
            raise

    async def changes(
        self,
        since: int | None = None,
        scope: Globs | None = None,
        key: Globs | None = None,
        limit: int | None = None,
    ) -> list[ChangeEvent]:
        """The recorded changes after ``since`` (see ``State.changes``)."""
        state = await self._link.sync()
        return await self._link.run(state.changes, since, scope, key, limit)

    async def subscribe(
        self,
        callback: Callable[[ChangeEvent], Any],
        scope: Globs | None = None,
        key: Globs | None = None,
        events: Events | None = None,
        where: Where | None = None,
        since: int | None = None,
        durable: str | None = None,
        *,
        max_retries: int = 3,
        buffer_size: int = DEFAULT_BUFFER,
    ) -> Subscription:
        """``State.subscribe``; an ``async def`` callback runs on this loop."""
        state = await self._link.sync()
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
        self, since: int | None = None, scope: Globs | None = None, key: Globs | None = None
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
        link = self._link
        if link.closed:
            raise ClosedError("this reactor handle is closed")
        if since is None and link.state is not None:
            # Where "now" is, read on the loop: the last revision this engine published
            # (no lock, no thread), where a sync watch starts too. The first iteration
            # replays the log from there, so the changes committed between this call
            # and that one are not missed.
            since = engine_of(link.state).dispatcher.published
        return AsyncWatch(link, since, scope, key)

    # -- durable workflows (SPEC §14): State's, as coroutines ---------------------------
    def workflow(self, name: str, max_attempts: int = 5, lease: float = 30.0) -> Callable[[W], W]:
        """``State.workflow``: register a workflow function, ``async def`` or not (an
        async one gets an ``AsyncRun``: ``await run.step(...)``)."""
        return self._runs.workflow(name, max_attempts, lease)

    async def start(
        self,
        workflow: str,
        input: Any = None,  # noqa: A002 - the spec's names
        id: str | None = None,  # noqa: A002
    ) -> AsyncRunHandle:
        """``State.start``: record a run and make it ready; its handle."""
        return await self._runs.start(workflow, input, id)

    async def run(self, run_id: str) -> AsyncRunHandle:
        """``State.run``: the handle of run ``run_id`` (``KeyError`` if none)."""
        return await self._runs.run(run_id)

    async def serve(self, workflows: list[str] | None = None, concurrency: int = 4) -> AsyncWorkers:
        """``State.serve``: worker threads running the registered workflows' runs, until
        ``await workers.stop()``."""
        return await self._runs.serve(workflows, concurrency)

    async def send(self, run_id: str, topic: str, message: Any) -> None:
        """``State.send``: a message for the run's ``receive(topic)``."""
        await self._runs.send(run_id, topic, message)

    async def cancel(self, run_id: str) -> bool:
        """``State.cancel``: cancel a run (and its children); whether it was not finished."""
        return await self._runs.cancel(run_id)

    async def runs(self, workflow: str = "*", status: str | None = None) -> list[RunInfo]:
        """``State.runs``: the runs of the matching workflows, oldest first."""
        return await self._runs.runs(workflow, status)

    async def run_info(self, run_id: str) -> RunInfo:
        """``State.run_info``: a run as recorded (``KeyError`` if none)."""
        return await self._runs.run_info(run_id)

    # -- derived values (SPEC §15) -------------------------------------------------------
    async def derive(
        self,
        fn: Callable[[Reader], Any],
        name: str | None = None,
        into: tuple[str, str] | None = None,
    ) -> AsyncDerived:
        """``State.derive``: a value kept current (``fn`` may be a coroutine function:
        it runs on an event loop of reactor's thread, reading through its ``Reader``)."""
        state = await self._sync()
        return AsyncDerived(await self._link.run(state.derive, fn, name, into))

    async def count(
        self,
        scope: str,
        pattern: str = "*",
        where: Callable[[Any], bool] | None = None,
        name: str | None = None,
    ) -> AsyncDerived:
        """``State.count``: kept up from each change."""
        state = await self._sync()
        return AsyncDerived(await self._link.run(state.count, scope, pattern, where, name))

    async def sum(
        self,
        scope: str,
        pattern: str = "*",
        path: str = "",
        where: Callable[[Any], bool] | None = None,
        name: str | None = None,
    ) -> AsyncDerived:
        """``State.sum``: kept up from each change."""
        state = await self._sync()
        return AsyncDerived(await self._link.run(state.sum, scope, pattern, path, where, name))

    async def derived(self) -> list[AsyncDerived]:
        """``State.derived``: the derived values live in this process's engine."""
        state = await self._sync()
        return [AsyncDerived(value) for value in state.derived()]

    async def close(self) -> None:
        """Close this handle; idempotent. Lock waiters get ``ClosedError``; watches end
        when the engine closes (with its last handle). Closing waits for the actors and
        subscribers to finish: it runs in a thread of its own, ended on return."""
        await self._link.close()


_links: weakref.WeakKeyDictionary[AsyncState, Link] = weakref.WeakKeyDictionary()


def adopt(state: State) -> AsyncState:
    """An asyncio handle on the open ``state`` (for the dashboard, which is handed one):
    closing it ends its worker threads and leaves ``state`` open, to its owner.

    Raises:
        ClosedError: ``state`` is closed.
        TypeError: ``state`` is not a ``reactor.State``.
    """
    return AsyncState(None, {}, Link.adopting(state))


def link_of(handle: AsyncState) -> Link:
    """The link of an asyncio handle (for the dashboard, which is handed one)."""
    return _links[handle]
