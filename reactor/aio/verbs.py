"""A scope's write verbs as coroutines, each written once for ``AsyncScope`` and
``AsyncTransaction`` (and so for the parts of an ``AsyncMultiTransaction``).

Each verb's checks and work are ``_writes``' (or ``_timers``'), as for the synchronous
``ScopeVerbs``: a verb here only names its work; a handle says how work runs, through
its one hook, ``_submit``: ``AsyncScope`` queues it for the scope's actor and awaits
the commit, ``AsyncTransaction`` stages it in its pending transaction.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._base.results import Change, Timer, UpdateResult
from reactor._base.values import MISSING, Number
from reactor._work import timers as _timers
from reactor._work import writes as _writes

from .reads import AsyncReads

if TYPE_CHECKING:
    from reactor._engine.options import Options
    from reactor._work.writes import Work

__all__ = ["AsyncVerbs"]

T = TypeVar("T")


class _NothingToWrite(Exception):
    """Raised by a write's ``make`` when there is nothing to write (``set_many({})``):
    the verb answers without asking anyone. ``_submit`` lets it through."""


class AsyncVerbs(AsyncReads):
    """The verbs of a scope, as coroutines, with ``Scope``'s results and errors; in a
    transaction, each write is staged, and committed with the transaction."""

    __slots__ = ()

    name: str
    """The scope's name."""

    async def _submit(self, verb: str, make: Callable[[Options], Work[T]]) -> T:
        """Run the work ``make(options)`` returns, once this handle may write (checked
        before ``make`` looks at any argument); its result. Timed for ``stats()`` as
        ``verb``.

        Raises:
            _NothingToWrite: from ``make``, before anything is timed or queued.
        """
        raise NotImplementedError

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
        return await self._submit(
            "set",
            lambda options: _writes.set_value(
                options, self.name, key, value, ttl, keep_ttl, if_revision
            ),
        )

    async def set_many(
        self,
        mapping: Mapping[str, Any],
        ttl: float | None = None,
        *,
        if_revision: int | None = None,
    ) -> dict[str, Change]:
        """``Scope.set_many``: every key-value of ``mapping`` in one write."""

        def make(options: Options) -> Work[dict[str, Change]]:
            work = _writes.set_many(options, self.name, mapping, ttl, if_revision)
            if work is None:
                raise _NothingToWrite
            return work

        try:
            return await self._submit("set_many", make)
        except _NothingToWrite:
            return {}

    async def delete(self, key: str, *, if_revision: int | None = None) -> Any:
        """``Scope.delete``: remove ``key``; return its old value, or None."""
        return await self._submit("delete", lambda _: _writes.delete(self.name, key, if_revision))

    async def clear(self, pattern: str = "*", *, if_revision: int | None = None) -> int:
        """``Scope.clear``: remove the keys matching ``pattern``; return how many."""
        return await self._submit("clear", lambda _: _writes.clear(self.name, pattern, if_revision))

    async def expire(
        self, key: str, seconds: float | None, *, if_revision: int | None = None
    ) -> bool:
        """``Scope.expire``: a new expiry for ``key``; whether it existed."""
        return await self._submit(
            "expire", lambda _: _writes.expire(self.name, key, seconds, if_revision)
        )

    async def increment(
        self, key: str, by: Number = 1, default: Number = 0, *, if_revision: int | None = None
    ) -> Number:
        """``Scope.increment``: add ``by`` to the number at ``key``; the result."""
        return await self._submit(
            "increment",
            lambda options: _writes.increment(options, self.name, key, by, default, if_revision),
        )

    async def decrement(
        self, key: str, by: Number = 1, default: Number = 0, *, if_revision: int | None = None
    ) -> Number:
        """``Scope.decrement``: subtract ``by`` from the number at ``key``; the result."""
        return await self._submit(
            "decrement",
            lambda options: _writes.increment(
                options, self.name, key, by, default, if_revision, down=True
            ),
        )

    async def append(self, key: str, text: str, *, if_revision: int | None = None) -> int:
        """``Scope.append``: append ``text`` to the string at ``key``; its length."""
        return await self._submit(
            "append",
            lambda options: _writes.append_text(options, self.name, key, text, if_revision),
        )

    async def compare_and_swap(
        self, key: str, expected: Any, new: Any, *, if_revision: int | None = None
    ) -> bool:
        """``Scope.compare_and_swap``: set ``key`` to ``new`` if it holds ``expected``."""
        return await self._submit(
            "compare_and_swap",
            lambda options: _writes.compare_and_swap(
                options, self.name, key, expected, new, if_revision
            ),
        )

    async def push(self, key: str, *items: Any, if_revision: int | None = None) -> int:
        """``Scope.push``: append ``items`` to the list at ``key``; its length."""
        return await self._submit(
            "push", lambda options: _writes.push(options, self.name, key, items, if_revision)
        )

    async def pop(self, key: str, front: bool = False, *, if_revision: int | None = None) -> Any:
        """``Scope.pop``: remove and return the last (or first) item of the list."""
        return await self._submit("pop", lambda _: _writes.pop(self.name, key, front, if_revision))

    async def schedule(
        self,
        key: str,
        value: Any = MISSING,
        *,
        after: float | None = None,
        at: float | None = None,
        every: float | None = None,
        ops: builtins.list[dict[str, Any]] | None = None,
        cron: str | None = None,
        tz: str | None = None,
    ) -> Timer:
        """``Scope.schedule``: a write of ``value`` (or ``ops``) to ``key``, due later (or
        at the times ``cron`` names in zone ``tz``); in a transaction, the timer is
        created with the commit."""
        return await self._submit(
            "schedule",
            lambda options: _timers.schedule(
                options, self.name, key, value, ops, after, at, every, cron=cron, tz=tz
            ),
        )

    async def update(
        self,
        key: str,
        ops: builtins.list[dict[str, Any]],
        atomic: bool | None = None,
        *,
        if_revision: int | None = None,
    ) -> UpdateResult:
        """``Scope.update``: apply update ops or a JSON Patch in one write (SPEC §4)."""
        return await self._submit(
            "update",
            lambda options: _writes.update(options, self.name, key, ops, atomic, if_revision),
        )
