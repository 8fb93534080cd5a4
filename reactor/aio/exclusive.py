"""Transactions and locks for asyncio: ``async with`` over the synchronous ones.

Waiting holds no thread. A transaction's turn at each of its scopes (taken in order,
as the synchronous ones are), and its commit, are the actors' futures awaited through
the loop's bridge (``bridge.py``), timed out only once the scope has not moved on for
the engine's timeout: any number of transactions queued on one scope run in turn.
Tasks of one loop waiting for the same lock stand in one line: the first tries the
lease, backing off from 2 ms to 50 ms (at once when a holder on this loop releases it),
the others wait on the loop with no thread and no query. The database work itself (the
body's reads, a lock's try) runs in the handle's worker threads, a short call each.

A task that holds a transaction on a scope and writes to that scope outside the
transaction would wait on itself: it gets ``ReentrancyError``, as a thread does with the
synchronous ``Transaction``; other tasks wait for the commit.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from reactor._handles import lock_lines
from reactor._handles.binding import binding_of, engine_of
from reactor._handles.locks import Lock, check_lock
from reactor._handles.transaction import Hold, MultiTransaction, Transaction
from reactor._handles.transaction_scopes import part_of, scope_names
from reactor._handles.verbs import ScopeVerbs
from reactor.errors import (
    ClosedError,
    LockNotOwnedError,
    LockTimeout,
    ReentrancyError,
)

from .verbs import AsyncVerbs

if TYPE_CHECKING:
    from reactor._base.codecs import Codec
    from reactor._base.results import Snapshot
    from reactor._engine.options import Options
    from reactor._engine.port import EnginePort
    from reactor._engine.reply import ThreadReply
    from reactor._handles.state import State
    from reactor._work.jobs import PutOptions
    from reactor._work.writes import Work

    from .link import Link

__all__ = [
    "AsyncLock",
    "AsyncMultiTransaction",
    "AsyncTransaction",
    "check_not_held",
    "held_scopes",
]

logger = logging.getLogger("reactor")
T = TypeVar("T")
Pending = tuple[Transaction, Hold]  # a begun transaction's verbs on a scope, and its hold

# (engine, scope, task) for the transaction bodies the current task is inside. Tasks
# started in a body inherit the context, hence the task: they may wait for the commit.
_Held = frozenset[tuple[int, str, int]]
_held: contextvars.ContextVar[_Held] = contextvars.ContextVar(
    "reactor_aio_held", default=frozenset()
)


def check_not_held(engine_id: int, scope: str) -> None:
    """Refuse a write that would wait for the current task's own transaction.

    Raises:
        ReentrancyError: this task is inside a transaction body on ``scope``.
    """
    held = _held.get()
    if held and (engine_id, scope, id(asyncio.current_task())) in held:
        raise ReentrancyError(
            f"this task holds a transaction on {scope!r}: write through its tx, not the scope"
        )


def held_scopes(engine_id: int) -> list[str]:
    """The scopes of the engine ``engine_id`` that the current task is inside a
    transaction body on, sorted."""
    held = _held.get()
    if not held:
        return []
    task = id(asyncio.current_task()) if _in_loop() else None
    return sorted(scope for engine, scope, owner in held if engine == engine_id and owner == task)


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _take(link: Link, hold: Hold) -> contextvars.Token[_Held]:
    """Take the scopes of ``hold`` in order, each awaited on the loop with no thread
    waiting, and open its pending transaction; on any failure (a timeout, a closing
    engine, a cancelled task) none stays held. The token to give to ``_finish``."""
    engine = hold.start()
    for name in hold.names:
        granted: ThreadReply[None] | None = None
        try:
            granted = hold.ask(name)
            await link.answer(engine, name, granted)
        except BaseException:
            hold.give_up(name, granted)  # a scope handed over after all goes back too
            raise
        hold.took(name)
    opening = asyncio.ensure_future(link.run(hold.open))
    try:
        await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(lambda _: hold.hand_back("withdrawn"))
        raise
    except BaseException:
        hold.hand_back("failed")  # a no-op if opening failed (it gave the scopes back)
        raise
    task = id(asyncio.current_task())
    return _held.set(_held.get() | {(id(engine), name, task) for name in hold.names})


async def _finish(
    link: Link, hold: Hold, token: contextvars.Token[_Held] | None, commit: bool
) -> None:
    """Commit what the body staged (``commit``), or drop it; hand the scopes back."""
    if token is not None:
        _held.reset(token)
    engine = hold.engine
    if engine is None or hold.txn is None:
        return
    future = None
    try:
        future = hold.submit_commit(commit)
        if future is not None:
            await link.answer(engine, hold.names[0], future)
    except BaseException:
        if future is not None:
            future.cancel()  # withdrawn, unless it is running (then it may commit)
        hold.hand_back("failed")
        raise
    hold.hand_back("rolled back" if future is None else "committed")


async def _engine_for(link: Link, names: tuple[str, ...]) -> tuple[State, EnginePort]:
    """The synchronous handle and its engine, once this task may take ``names``.

    Raises:
        ReentrancyError: this task is inside a transaction body on one of them.
    """
    state = await link.sync()
    engine = engine_of(state)
    for name in names:
        check_not_held(id(engine), name)
    return state, engine


class AsyncTransaction(AsyncVerbs):
    """``async with scope.transaction() as tx:``: ``tx`` has every verb of a scope, as
    coroutines, staged in the transaction and committed together when the block ends
    (nothing if it raises). See ``Scope.transaction``. In a transaction over several
    scopes, ``tx[name]`` of an ``AsyncMultiTransaction``: the same verbs, on that
    scope."""

    def __init__(
        self,
        link: Link,
        name: str,
        *,
        part: Callable[[], Pending | None] | None = None,
        codec: Codec | None = None,
    ) -> None:
        self._link = link
        self.name = name
        self._codec = codec  # the scope's own, if it has one (else the state's)
        # A part of an AsyncMultiTransaction: how to find that transaction's, once begun.
        self._part = part
        self._pending: Pending | None = None  # its own, once begun (not a part)
        self._token: contextvars.Token[_Held] | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncTransaction on {self.name!r}>"

    async def __aenter__(self) -> AsyncTransaction:
        if self._part is not None:
            raise ReentrancyError(
                f"tx[{self.name!r}] is part of a transaction over several scopes: "
                "that transaction begins and ends them all"
            )
        if self._pending is not None:
            raise ReentrancyError("a transaction is entered once")
        state, _ = await _engine_for(self._link, (self.name,))
        binding = binding_of(state)
        hold = Hold(binding, (self.name,))
        self._pending = (Transaction(binding, self.name, hold, codec=self._codec), hold)
        self._token = await _take(self._link, hold)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        token, self._token = self._token, None
        if self._pending is not None and self._part is None:
            await _finish(self._link, self._pending[1], token, commit=exc_type is None)

    def _begun(self) -> Pending:
        pending = self._pending if self._part is None else self._part()
        if pending is None:
            raise ClosedError("this transaction has not begun: use async with")
        return pending

    async def _call(self, verb: Callable[[Transaction], T]) -> T:
        """Run ``verb`` on the pending transaction, in a worker (it may read)."""
        return await self._link.run(verb, self._begun()[0])

    async def _read(self, read: Callable[[ScopeVerbs], T]) -> T:
        return await self._call(read)

    async def _submit(self, verb: str, make: Callable[[Options], Work[T]]) -> T:
        """Stage the work in the pending transaction, in a worker (it may read); a verb
        that fails leaves the body's other writes be (``Hold.run``).

        Raises:
            ClosedError: the transaction has not begun, or is over.
        """
        _, hold = self._begun()
        engine = hold.usable()
        work = make(hold.options(engine, self._codec))
        start = perf_counter()
        try:
            return await self._link.run(hold.run, work)
        finally:
            engine.stats.record(verb, perf_counter() - start)

    # -- the verbs of Scope, as coroutines: AsyncVerbs' (reads: AsyncReads') ---------
    async def snapshot(self) -> Snapshot:
        """The scope as this transaction sees it, with the revision it began at."""
        return await self._call(lambda tx: tx.snapshot())

    async def cancel_timer(self, timer_id: str) -> bool:
        """Cancel a pending timer with the commit (``Transaction.cancel_timer``)."""
        return await self._call(lambda tx: tx.cancel_timer(timer_id))

    async def enqueue(
        self,
        queue: str,
        item: Any,
        delay: float | None = None,
        key: str | None = None,
        **options: Unpack[PutOptions],
    ) -> None:
        """Add a job to ``queue`` if, and when, the transaction commits (see
        ``Transaction.enqueue``)."""
        await self._call(lambda tx: tx.enqueue(queue, item, delay, key, **options))


class AsyncMultiTransaction:
    """``async with state.transaction("orders", "ledger") as tx:``: the task owns every
    scope named until the block ends; ``tx["orders"]`` is an ``AsyncTransaction`` with
    every verb of a scope, as coroutines, on that scope. The writes of the body, to all
    the scopes, commit together, or not at all if it raises. See ``State.transaction``.
    """

    def __init__(self, link: Link, names: Iterable[str]) -> None:
        self._link = link
        self.names: tuple[str, ...] = scope_names(names)
        """The scopes it holds, sorted by name: the order it takes them in."""
        self._parts = {
            name: AsyncTransaction(link, name, part=functools.partial(self._pending, name))
            for name in self.names
        }
        self._hold: Hold | None = None
        self._sync: MultiTransaction | None = None
        self._token: contextvars.Token[_Held] | None = None

    def __repr__(self) -> str:
        scopes = ", ".join(repr(name) for name in self.names)
        return f"<reactor.aio.AsyncMultiTransaction on {scopes}>"

    async def cancel_timer(self, timer_id: str) -> bool:
        """Cancel a pending timer with the commit (``Transaction.cancel_timer``)."""
        first = self[self.names[0]]
        return await first.cancel_timer(timer_id)

    def __getitem__(self, name: str) -> AsyncTransaction:
        """The verbs of scope ``name`` in this transaction.

        Raises:
            InvalidArgumentError: ``name`` is not one of the transaction's scopes.
            InvalidKeyError: ``name`` is not a valid scope name.
        """
        return self._parts[part_of(self.names, name)]

    async def enqueue(
        self,
        queue: str,
        item: Any,
        delay: float | None = None,
        key: str | None = None,
        **options: Unpack[PutOptions],
    ) -> None:
        """Add a job to ``queue`` if, and when, the transaction commits, with the body's
        writes to every scope (see ``Transaction.enqueue``)."""
        hold = self._hold
        if hold is None:
            raise ClosedError("this transaction has not begun: use async with")
        await self._link.run(hold.enqueue, queue, item, delay, key, options)

    async def __aenter__(self) -> AsyncMultiTransaction:
        if self._hold is not None:
            raise ReentrancyError("a transaction is entered once")
        state, _ = await _engine_for(self._link, self.names)
        binding = binding_of(state)
        hold = self._hold = Hold(binding, self.names)
        self._sync = MultiTransaction(binding, self.names, hold)
        self._token = await _take(self._link, hold)
        return self

    def _pending(self, name: str) -> Pending | None:
        """Scope ``name``'s part of the pending transaction, once begun."""
        if self._sync is None or self._hold is None:
            return None
        return self._sync[name], self._hold

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        token, self._token = self._token, None
        if self._hold is not None:
            await _finish(self._link, self._hold, token, commit=exc_type is None)


async def _until(future: asyncio.Future[None], seconds: float | None) -> bool:
    """Wait for ``future`` at most ``seconds`` (None: no limit); whether it is done."""
    if seconds is not None and seconds <= 0:
        return future.done()
    await asyncio.wait((future,), timeout=seconds)
    return future.done()


class AsyncLock:
    """``async with state.lock(name, ttl):``: a lease shared by every process on the
    database (see ``State.lock``). Waiting for it holds no thread: the tasks of a loop
    waiting for one lock stand in line, and only the first tries the lease, backing off
    from 2 ms to 50 ms between tries, and trying at once when a holder on the same loop
    releases it."""

    def __init__(self, link: Link, name: str, ttl: float, timeout: float | None) -> None:
        self._link = link
        self.name, self.ttl, self.timeout = check_lock(name, ttl, timeout)
        self._lock: Lock | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncLock {self.name!r} token={self.token}>"

    async def _sync(self) -> Lock:
        if self._lock is None:
            state = await self._link.sync()
            self._lock = Lock(binding_of(state), self.name, self.ttl, self.timeout)
        return self._lock

    @property
    def token(self) -> int | None:
        """The fencing token of this holder's lease; None when it holds none."""
        return None if self._lock is None else self._lock.token

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lease; with ``blocking``, wait up to ``timeout`` seconds (None: as
        long as it takes). Return whether it was taken.

        Raises:
            ClosedError: the handle closed.
        """
        lock = await self._sync()
        if not blocking:
            return await self._try(lock)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        line = lock.line()
        turn = line.queue(loop)
        try:
            left = None if deadline is None else deadline - loop.time()
            if not await _until(turn, left):
                return await self._try(lock)  # out of time in line: one try, as a thread's
            pause = lock_lines.POLL_MIN
            while True:
                poke = line.poke(loop)  # made before the try: a release while it runs counts
                if await self._try(lock):
                    return True
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return False
                poked = await _until(poke, pause if left is None else min(pause, left))
                pause = lock_lines.next_pause(pause, poked)
        finally:
            line.step_out(loop, turn)
            line.leave()

    async def _try(self, lock: Lock) -> bool:
        if self._link.closed:
            raise ClosedError("this reactor handle is closed")
        trying = asyncio.ensure_future(self._link.run(lock.acquire, False))
        try:
            return await asyncio.shield(trying)
        except asyncio.CancelledError:
            # Cancelled while trying: a lease taken meanwhile has nobody to release it.
            trying.add_done_callback(functools.partial(_give_back, self._link, lock))
            raise

    async def release(self) -> None:
        """Give the lease back.

        Raises:
            LockNotOwnedError: this holder does not hold it (never did, or it expired).
        """
        await self._link.run((await self._sync()).release)  # its waiters try at once

    async def extend(self, ttl: float | None = None) -> None:
        """Renew the lease for ``ttl`` seconds (the lock's own ttl by default)."""
        await self._link.run((await self._sync()).extend, ttl)

    async def held(self) -> bool:
        """Whether this holder holds the lease now."""
        return await self._link.run((await self._sync()).held)

    async def __aenter__(self) -> AsyncLock:
        if not await self.acquire(timeout=self.timeout):
            raise LockTimeout(f"lock {self.name!r} was not acquired within {self.timeout} s")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            await self.release()
        except LockNotOwnedError:
            if exc_type is None:
                raise
            logger.warning("lock %r had expired when its body raised", self.name)


def _give_back(link: Link, lock: Lock, trying: asyncio.Future[bool]) -> None:
    if trying.cancelled() or trying.exception() is not None or not trying.result():
        return
    releasing = asyncio.ensure_future(link.run(lock.release))
    releasing.add_done_callback(_log_failure)


def _log_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and (error := done.exception()) is not None:
        logger.warning("a lease taken by a cancelled acquire was not given back: %s", error)
