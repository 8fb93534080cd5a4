"""``AsyncScope``: a scope's verbs as coroutines.

Writes are validated and encoded on the loop (CPU only), then queued for the scope's
actor; the task awaits the commit with no thread waiting (the loop's bridge). Reads are
short blocking calls, run in the handle's worker threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._base.keys import RESERVED_PREFIXES, check_writable
from reactor._handles import waiting as _waiting
from reactor._handles.binding import engine_of
from reactor._handles.scope import Scope

from .bridge import bridge
from .exclusive import AsyncTransaction, check_not_held
from .verbs import AsyncVerbs

if TYPE_CHECKING:
    from reactor._base.codecs import Codec
    from reactor._base.results import Snapshot
    from reactor._engine.options import Options
    from reactor._engine.port import EnginePort
    from reactor._handles.verbs import ScopeVerbs
    from reactor._work.writes import Work

    from .link import Link

__all__ = ["AsyncScope"]

T = TypeVar("T")


class AsyncScope(AsyncVerbs):
    """A scope's verbs as coroutines; the same results and errors as ``Scope``'s."""

    __slots__ = ("_codec", "_link", "_reserved", "_scope", "name")

    def __init__(self, link: Link, name: str, codec: Codec | None = None) -> None:
        self._link = link
        self.name = name
        self._codec = codec  # its own, if given (else the state's)
        self._scope: Scope | None = None
        self._reserved = name.startswith(RESERVED_PREFIXES)  # its writes raise

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncScope {self.name!r}>"

    async def _reader(self) -> Scope:
        if self._scope is None:
            self._scope = (await self._link.sync()).scope(self.name, codec=self._codec)
        return self._scope

    async def _engine(self) -> EnginePort:
        """The engine, once this task may wait on the scope.

        Raises:
            ClosedError: the handle is closed.
            ReentrancyError: this task holds a transaction on the scope.
        """
        engine = engine_of(await self._link.sync())
        check_not_held(id(engine), self.name)
        return engine

    async def _submit(self, verb: str, make: Callable[[Options], Work[T]]) -> T:
        """Queue the work for the scope's actor and await its result (no thread waits);
        timed for ``stats()`` from the request to the answer.

        Raises:
            InvalidKeyError: a scope of events (``queue:NAME``, ``run:NAME``).
            ClosedError: the handle is closed.
            ReentrancyError: this task holds a transaction on the scope.
        """
        if self._reserved:
            check_writable(self.name)  # raises
        binding = self._link.binding
        current = None if binding is None else binding.current
        engine: EnginePort
        if current is None or current.closed:  # not open yet, or closed
            engine = await self._engine()
        else:  # what ``_engine`` checks, on every write's path
            engine = current
            check_not_held(id(engine), self.name)
        binding = self._link.binding  # set once open (``_engine`` opens it)
        assert binding is not None
        work = make(binding.options(engine, self._codec))
        stats = engine.stats
        timed = stats.timing(verb)  # counted; timed one call in several (Stats.timing)
        start = perf_counter() if timed else 0.0
        try:
            answer = bridge().send(engine, self.name, work)
            try:
                return await answer.target
            except asyncio.CancelledError:
                answer.cancel()  # withdrawn, unless the actor has begun it
                raise
        finally:
            if timed:
                stats.sample(verb, perf_counter() - start)

    def transaction(self) -> AsyncTransaction:
        """``async with scope.transaction() as tx:``: the scope is this task's until the
        block ends; ``tx``'s verbs (coroutines) commit together, or not at all.

        Raises:
            InvalidKeyError: a scope of events (``queue:NAME``, ``run:NAME``), which
                no transaction writes.
            ConflictError: (at the end of the block) another process changed the scope
                meanwhile; nothing was applied.
        """
        return AsyncTransaction(self._link, check_writable(self.name), codec=self._codec)

    async def _read(self, read: Callable[[ScopeVerbs], T]) -> T:
        scope = await self._reader()
        return await self._link.run(read, scope)

    # -- reads: AsyncReads' --------------------------------------------------------
    async def snapshot(self) -> Snapshot:
        """``Scope.snapshot``: every live key-value and the revision they are current at."""
        return await self._link.run(Scope.snapshot, await self._reader())

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
        on the loop. Cancelling the task ends the wait. It raises what ``Scope.wait_for``
        raises: ``OperationTimeout``, ``ClosedError``, ``InvalidArgumentError``.
        """
        checked, seconds = _waiting.check_wait(key, predicate, timeout)
        engine = await self._engine()
        start = perf_counter()
        try:
            return await _waiting.wait_async(
                engine, self.name, checked, predicate, seconds, self._link
            )
        finally:
            engine.stats.record("wait_for", perf_counter() - start)
