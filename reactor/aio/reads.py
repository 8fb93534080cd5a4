"""A scope's read verbs as coroutines, defined once for ``AsyncScope`` and
``AsyncTransaction``: each awaits the sync verb of ``ScopeVerbs`` (its checks, its
read, its errors), run where the handle runs its reads (``_read``).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from reactor._base.results import Entry
from reactor._engine.events import ChangeEvent
from reactor._handles.verbs import ScopeVerbs

__all__ = ["AsyncReads"]

T = TypeVar("T")


class AsyncReads:
    """The reads of a scope, as coroutines (``Scope``'s, with the same results and
    errors); in a transaction, as the transaction sees the scope."""

    __slots__ = ()

    async def _read(self, read: Callable[[ScopeVerbs], T]) -> T:
        """``read`` on the sync handle, off the event loop."""
        raise NotImplementedError

    async def get(
        self,
        key: str,
        default: Any = None,
        *,
        at_revision: int | None = None,
        type: Any = None,  # noqa: A002 - as Scope.get's
    ) -> Any:
        """``Scope.get``: the value of ``key`` (as committed at ``at_revision``), or
        ``default``; decoded as ``type`` if given."""
        return await self._read(
            lambda verbs: verbs.get(key, default, at_revision=at_revision, type=type)
        )

    async def entry(self, key: str) -> Entry | None:
        """``Scope.entry``: the value of ``key`` with its revisions and version."""
        return await self._read(lambda verbs: verbs.entry(key))

    async def history(
        self, key: str, since: int | None = None, limit: int | None = None
    ) -> builtins.list[ChangeEvent]:
        """``Scope.history``: the retained events of ``key``, oldest first."""
        return await self._read(lambda verbs: verbs.history(key, since, limit))

    async def get_many(
        self,
        keys: Iterable[str],
        *,
        type: Any = None,  # noqa: A002 - as Scope.get's
    ) -> dict[str, Any]:
        """``Scope.get_many``: the values of those of ``keys`` that exist, in order."""
        # A string stays one (the verb refuses it); any other iterable is read here.
        wanted = keys if isinstance(keys, str) or not isinstance(keys, Iterable) else [*keys]
        return await self._read(lambda verbs: verbs.get_many(wanted, type=type))

    async def exists(self, key: str) -> bool:
        """``Scope.exists``: whether ``key`` holds a live value."""
        return await self._read(lambda verbs: verbs.exists(key))

    async def list(self, *, type: Any = None) -> dict[str, Any]:  # noqa: A002 - as Scope's
        """``Scope.list``: every live key and its value, sorted by key."""
        return await self._read(lambda verbs: verbs.list(type=type))

    async def keys(self, pattern: str = "*") -> builtins.list[str]:
        """``Scope.keys``: the live keys matching the glob ``pattern``, sorted."""
        return await self._read(lambda verbs: verbs.keys(pattern))

    async def ttl(self, key: str) -> float:
        """``Scope.ttl``: seconds left; ``-1`` without expiry, ``-2`` if absent."""
        return await self._read(lambda verbs: verbs.ttl(key))

    async def length(self, key: str) -> int:
        """``Scope.length``: the length of the list at ``key``; 0 when absent."""
        return await self._read(lambda verbs: verbs.length(key))
