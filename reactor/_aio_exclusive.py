"""Transactions and locks for asyncio: ``async with`` over the synchronous ones.

Their waits (for a scope's actor to hand the scope over, for a lease to come free) run
in worker threads or as ``asyncio.sleep``; their database work in worker threads: the
loop never blocks. A task that holds a transaction on a scope and writes to that scope
outside the transaction would wait on itself: it gets ``ReentrancyError``, as a thread
does with the synchronous ``Transaction``; other tasks wait for the commit.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ._keys import check_key
from ._locks import Lock
from ._transaction import Transaction
from ._verbs import check_ttl
from .errors import InvalidArgumentError, LockNotOwnedError, LockTimeout, ReentrancyError

if TYPE_CHECKING:
    from .aio import AsyncState

__all__ = ["AsyncLock", "AsyncTransaction", "check_not_held"]

logger = logging.getLogger("reactor")

_POLL_MIN: Final = 0.002
_POLL_MAX: Final = 0.05

# (engine, scope, task) for the transaction bodies the current task is inside. Tasks
# started in a body inherit the context, hence the task: they may wait for the commit.
_held: contextvars.ContextVar[frozenset[tuple[int, str, int]]] = contextvars.ContextVar(
    "reactor_aio_held", default=frozenset()
)

AsyncVerb = Callable[..., Coroutine[Any, Any, Any]]


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


class AsyncTransaction:
    """``async with scope.transaction() as tx:``: ``tx`` has every verb of a scope, as
    coroutines, staged in the transaction and committed together when the block ends
    (nothing if it raises). See ``Scope.transaction``."""

    def __init__(self, handle: AsyncState, name: str) -> None:
        self._handle = handle
        self.name = name
        self._tx: Transaction | None = None
        self._token: contextvars.Token[frozenset[tuple[int, str, int]]] | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncTransaction on {self.name!r}>"

    async def __aenter__(self) -> AsyncTransaction:
        if self._tx is not None:
            raise ReentrancyError("a transaction is entered once")
        state = await self._handle._sync()
        engine_id = id(state._engine_or_raise())
        check_not_held(engine_id, self.name)
        tx = self._tx = Transaction(state, self.name)
        beginning = asyncio.ensure_future(asyncio.to_thread(tx.begin))
        try:
            await asyncio.shield(beginning)
        except asyncio.CancelledError:
            # The scope may still be handed over, to nobody: give it back then.
            beginning.add_done_callback(lambda _: _hand_back(tx))
            raise
        self._token = _held.set(_held.get() | {(engine_id, self.name, id(asyncio.current_task()))})
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _held.reset(self._token)
            self._token = None
        if self._tx is not None:
            await asyncio.to_thread(self._tx.finish, exc_type is None)

    def __getattr__(self, verb: str) -> AsyncVerb:
        tx = self._tx
        if tx is None or verb.startswith("_"):
            raise AttributeError(verb)
        method = getattr(tx, verb)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(functools.partial(method, *args, **kwargs))

        call.__name__ = verb
        return call


def _hand_back(tx: Transaction) -> None:
    loop = asyncio.get_running_loop()
    loop.run_in_executor(None, tx.finish, False)


class AsyncLock:
    """``async with state.lock(name, ttl):``: a lease shared by every process on the
    database (see ``State.lock``). Waiting for it is ``asyncio.sleep``, backing off from
    2 ms to 50 ms between tries."""

    def __init__(self, handle: AsyncState, name: str, ttl: float, timeout: float | None) -> None:
        self._handle = handle
        self.name = check_key(name, "lock name")
        if check_ttl(ttl) is None:
            raise InvalidArgumentError("a lock needs a ttl: a number of seconds > 0")
        if timeout is not None and (type(timeout) not in (int, float) or not timeout >= 0):
            raise InvalidArgumentError(f"timeout must be a number >= 0, not {timeout!r}")
        self.ttl = ttl
        self.timeout = timeout
        self._lock: Lock | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncLock {self.name!r} token={self.token}>"

    async def _sync(self) -> Lock:
        if self._lock is None:
            state = await self._handle._sync()
            self._lock = Lock(state, self.name, self.ttl, self.timeout)
        return self._lock

    @property
    def token(self) -> int | None:
        """The fencing token of this holder's lease; None when it holds none."""
        return None if self._lock is None else self._lock.token

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lease; with ``blocking``, wait up to ``timeout`` seconds (None: as
        long as it takes). Return whether it was taken."""
        lock = await self._sync()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = _POLL_MIN
        while True:
            if await asyncio.to_thread(lock.acquire, False):
                return True
            if not blocking:
                return False
            wait = delay
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    return False
            await asyncio.sleep(wait)
            delay = min(delay * 2, _POLL_MAX)

    async def release(self) -> None:
        """Give the lease back.

        Raises:
            LockNotOwnedError: this holder does not hold it (never did, or it expired).
        """
        await asyncio.to_thread((await self._sync()).release)

    async def extend(self, ttl: float | None = None) -> None:
        """Renew the lease for ``ttl`` seconds (the lock's own ttl by default)."""
        await asyncio.to_thread((await self._sync()).extend, ttl)

    async def held(self) -> bool:
        """Whether this holder holds the lease now."""
        return await asyncio.to_thread((await self._sync()).held)

    async def __aenter__(self) -> AsyncLock:
        if not await self.acquire(timeout=self.timeout):
            raise LockTimeout(f"lock {self.name!r} was not acquired within {self.timeout} s")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockNotOwnedError:
            if exc_type is None:
                raise
            logger.warning("lock %r had expired when its body raised", self.name)
