"""What the engine needs from a database, as small facets by role.

A store answers reads from any thread (``KeyReads``, ``LogReads``, ``TimerLockReads``,
``Snapshots``; together, with a transaction body's ``reader``, ``StoreReads``: what
the engine's port gives features), follows other processes' commits (``Following``),
and runs write transactions one at a time (``Writing``: the engine's door alone calls
it). Implementations: ``sqlite.SQLiteStore``, ``postgres.PostgresStore``, opened by
``locate.open_store``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

from reactor._base.keys import Pattern

from .records import ChangeRecord, JobRow, LockRow, Row, TimerRow
from .statements import JobReads, Reader
from .txn import WriteTxn

__all__ = [
    "Following",
    "KeyReads",
    "LogReads",
    "SnapshotReads",
    "Snapshots",
    "Store",
    "StoreReads",
    "TimerLockReads",
    "Writing",
]

T = TypeVar("T")


class KeyReads(Protocol):
    """The keys as committed; a key past its deadline reads as absent."""

    def get(self, scope: str, key: str, now: float) -> str | None: ...

    def get_entry(self, scope: str, key: str, now: float) -> tuple[str, float | None] | None: ...

    def get_many(self, scope: str, keys: Iterable[str], now: float) -> dict[str, str]: ...

    def get_row(self, scope: str, key: str, now: float) -> Row | None: ...

    def value_at(self, scope: str, key: str, revision: int) -> str | None: ...

    def items(self, scope: str, pattern: Pattern, now: float) -> list[tuple[str, str]]: ...

    def keys(self, scope: str, pattern: Pattern, now: float) -> list[str]: ...

    def scopes(self, now: float) -> list[str]: ...

    def counts(self, now: float) -> dict[str, int]: ...

    def expired(
        self, now: float, limit: int, skip: Collection[str] = ()
    ) -> list[tuple[str, str]]: ...

    def size_bytes(self) -> int: ...


class LogReads(Protocol):
    """The change log, and the durable subscribers' places in it."""

    def revision(self) -> int: ...

    def log_after(
        self,
        revision: int,
        limit: int,
        upto: int | None = None,
        scopes: Collection[str] | None = None,
    ) -> list[ChangeRecord]: ...

    def compacted(self) -> int: ...

    def log_span(self) -> tuple[int, int] | None:
        """The first and last revisions the change log holds (None: it is empty)."""
        ...

    def key_history(self, scope: str, key: str, since: int, limit: int) -> list[ChangeRecord]: ...

    def history(self, scope: str, key: str, limit: int) -> list[ChangeRecord]:
        """The change log's last ``limit`` records of one key, newest first."""
        ...

    def position(self, name: str) -> int | None: ...

    def subscribers(self) -> dict[str, tuple[int, int, int]]: ...


class TimerLockReads(Protocol):
    """Pending timers and held locks."""

    def due_timers(
        self, now: float, limit: int, skip: Collection[str] = ()
    ) -> list[tuple[str, str, str]]:
        """Up to ``limit`` timers due at ``now`` (id, scope, key), earliest first, of
        scopes other than those in ``skip``."""
        ...

    def next_timer(self, now: float) -> float | None:
        """When the first timer due after ``now`` is due (None: none is)."""
        ...

    def overdue(self, now: float) -> float | None:
        """When the oldest upkeep work still undone at ``now`` fell due (None: none)."""
        ...

    def timers(self, limit: int | None = None) -> list[TimerRow]: ...

    def timer(self, timer_id: str) -> TimerRow | None: ...

    def timers_pending(self) -> int: ...

    def locks_held(self, now: float) -> int: ...

    def held_locks(self, now: float, limit: int) -> list[tuple[str, LockRow]]:
        """Up to ``limit`` locks held at ``now``, by name."""
        ...


class SnapshotReads(Protocol):
    """What an export reads, every read from one snapshot of the database."""

    def counts(self, now: float) -> dict[str, int]:
        """How many live keys each scope has."""
        ...

    def live_rows(self, now: float) -> Iterator[tuple[str, str, str, float | None]]:
        """Every live key (scope, key, JSON text, deadline), sorted by scope and key:
        fetched a few at a time, however many there are."""
        ...

    def timers(self) -> list[TimerRow]:
        """The pending timers, earliest first."""
        ...

    def jobs(self) -> JobReads: ...

    def queue_jobs(self, queue: str) -> Iterator[tuple[JobRow, str | None]]:
        """Every job of ``queue`` with its idempotency key, in the order of
        ``ready_at``: fetched a few at a time."""
        ...

    def revision(self) -> int:
        """The last revision the snapshot holds."""
        ...

    def row(self, scope: str, key: str) -> Row | None:
        """The stored row of ``key`` (live or past its deadline, not swept yet)."""
        ...

    def rows(self, scope: str, pattern: Pattern) -> list[tuple[str, Row]]:
        """The stored rows of the keys matching ``pattern``, sorted by key."""
        ...


class Snapshots(Protocol):
    def snapshot(self, scope: str, now: float) -> tuple[list[tuple[str, str]], int]:
        """Every live key-value of ``scope`` and the revision they are current at."""
        ...

    def consistent_reads(self) -> AbstractContextManager[SnapshotReads]:
        """Reads that all see one snapshot of the database, taken as the block begins,
        for as long as it runs (writers go on meanwhile): an export's."""
        ...


class StoreReads(KeyReads, LogReads, TimerLockReads, Snapshots, Protocol):
    """What features may use of a store (``EnginePort.store``): reads only."""

    location: str
    commits: int
    """Write transactions this store committed (this process's, since it opened)."""

    def reader(self) -> Reader:
        """The reads of a transaction body, each a plain read of the store."""
        ...

    def checkpoint(self) -> None:
        """Copy what the write-ahead log holds into the database (no change of data)."""
        ...


class Following(Protocol):
    def await_commits(self, timeout: float) -> int | None:
        """Wait at most ``timeout`` for a sign that another connection committed; return
        the highest revision it may have committed, or None without a sign."""
        ...


class Writing(Protocol):
    """Write transactions: the engine's door alone runs them (``tests/test_layers.py``)."""

    def write(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        on_commit: Callable[[list[ChangeRecord]], None] | None = None,
        *,
        shared: bool = False,
        scopes: Collection[str] | None = None,
        reads: Collection[tuple[str, str]] = (),
    ) -> tuple[T, list[ChangeRecord]]: ...

    def reclaim(self) -> None:
        """Give back the writers' turn if this thread lost it to a Ctrl-C."""
        ...

    def close(self) -> None: ...


class Store(StoreReads, Following, Writing, Protocol):
    """A database as the engine uses it."""
