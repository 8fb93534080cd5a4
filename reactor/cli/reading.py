"""Reads for the quick commands (``get``, ``mget``, ``exists``, ``ttl``, ``keys``,
``list``, ``scopes``): straight on a SQLite file's store, without an engine.

A ``reactor get`` is often one call in a shell loop, and most of its time would go to
importing and starting what it does not use: actors, the listener hub, the upkeep. On a
SQLite file these commands open the store alone, read-only, and read as a ``Scope``
would (the same keys' checks, expired keys hidden, values decoded afresh). Elsewhere (a
PostgreSQL URL, a file that needs a migration first) they read through a ``State`` as
every other command does; both give the same answers.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import click

from reactor._base.keys import check_key, compile_pattern
from reactor._base.values import decode
from reactor._storage.locate import locate, open_store
from reactor.errors import ReadOnlyError

from .group import STORAGE, failure
from .options import DB, command_state

if TYPE_CHECKING:
    from reactor._storage.store import StoreReads

__all__ = ["ScopeReads", "command_reads", "scope_counts"]

_TIMEOUT = 30.0  # seconds to wait for another process's lock, as ``open``'s default


class ScopeReads(Protocol):
    """The reads of one scope the quick commands use: ``Scope``'s, or a store's."""

    def get(self, key: str, default: Any = None) -> Any: ...

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]: ...

    def exists(self, key: str) -> bool: ...

    def ttl(self, key: str) -> float: ...

    def keys(self, pattern: str = "*") -> list[str]: ...

    def list(self) -> dict[str, Any]: ...


class _StoreScope:
    """A scope's reads on a bare store, as ``Scope`` reads them."""

    __slots__ = ("_store", "name")

    def __init__(self, store: StoreReads, name: str) -> None:
        self._store = store
        self.name = check_key(name, "scope name")

    def get(self, key: str, default: Any = None) -> Any:
        text = self._store.get(self.name, check_key(key), time.time())
        return default if text is None else decode(text)

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        wanted = [check_key(key) for key in keys]
        found = self._store.get_many(self.name, wanted, time.time())
        return {key: decode(text) for key, text in found.items()}

    def exists(self, key: str) -> bool:
        return self._store.get(self.name, check_key(key), time.time()) is not None

    def ttl(self, key: str) -> float:
        now = time.time()
        entry = self._store.get_entry(self.name, check_key(key), now)
        if entry is None:
            return -2.0
        deadline = entry[1]
        return -1.0 if deadline is None else max(0.0, deadline - now)

    def keys(self, pattern: str = "*") -> list[str]:
        return self._store.keys(self.name, compile_pattern(pattern), time.time())

    def list(self) -> dict[str, Any]:
        rows = self._store.items(self.name, compile_pattern("*"), time.time())
        return {key: decode(text) for key, text in rows}


def _store() -> StoreReads | None:
    """The running command's SQLite store, opened read-only (closed when the command
    ends); None where reads go through a ``State`` (PostgreSQL, memory, or a file that
    cannot be read without a write first).

    Raises:
        click.ClickException: the file does not exist (exit status 3).
    """
    ctx = click.get_current_context()
    _, location = locate(ctx.meta.get(DB), "normal")
    if not isinstance(location, Path):
        return None
    if not location.exists():
        raise failure(f"no database at {location}", STORAGE)
    try:
        store = open_store(location, durability="normal", timeout=_TIMEOUT, readonly=True)
    except ReadOnlyError:
        return None  # a migration first, say: the State's way (``command_state``)
    ctx.call_on_close(store.close)
    return store


def command_reads(scope: str) -> ScopeReads:
    """The reads of ``scope`` for the running command.

    Raises:
        InvalidKeyError: ``scope`` is not a valid scope name.
    """
    store = _store()
    if store is not None:
        return _StoreScope(store, scope)
    return command_state().scope(scope)


def scope_counts() -> dict[str, int]:
    """Every scope with live keys, and how many."""
    store = _store()
    if store is not None:
        return store.counts(time.time())
    counts: dict[str, int] = command_state().stats()["scopes"]
    return counts
