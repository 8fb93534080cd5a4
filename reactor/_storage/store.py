"""What the engine needs from a database, and the write transaction every write runs in.

A store answers reads from any thread and runs write transactions one at a time. A
write transaction stages its changes in memory (``WriteTxn``): each request in a batch
can be undone on its own when it fails, and the batch reaches the database as a few
statements just before the commit, together with its change-log records.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Final, Generic, Protocol, TypeVar

from reactor._base.keys import Pattern

from .records import ChangeRecord, JobRow, Key, LockRow, RefusedError, Row, TimerRow, Upsert
from .sql_jobs import SQLJobs

__all__ = [
    "ChangeRecord",
    "JobRow",
    "LockRow",
    "Reads",
    "RefusedError",
    "Row",
    "Store",
    "TimerRow",
    "Work",
    "WriteTxn",
]

T = TypeVar("T")


class _Absent(enum.Enum):
    """No entry (a row staged or read ahead may itself be None: no row)."""

    ABSENT = enum.auto()


_ABSENT: Final = _Absent.ABSENT


class Statements(Protocol):
    """The statements a write transaction runs, bound to one connection."""

    def fetch_row(self, scope: str, key: str) -> Row | None: ...

    def fetch_rows(
        self, scope: str, bounds: tuple[str, str | None] | None
    ) -> list[tuple[str, Row]]: ...

    def fetch_many(self, scope: str, keys: list[str]) -> dict[str, Row]: ...

    def read_ahead(self, keys: Collection[Key]) -> dict[Key, Row | None]:
        """The rows of ``keys`` (None: no row), in as few statements as it can."""
        ...

    def write_changes(
        self, records: list[ChangeRecord], upserts: list[Upsert], deletes: list[Key]
    ) -> None:
        """Append ``records`` to the change log and write the rows; give each record
        its revision (``-n``, the n-th change of the transaction, becomes the n-th
        revision after the last committed), now or at the latest by the commit. A row's
        revision (or created revision) below zero is such a provisional one."""
        ...

    def current_revision(self) -> int: ...

    def changed_since(self, scope: str, revision: int) -> bool: ...

    def keys_changed_since(self, scope: str, keys: list[str], revision: int) -> bool: ...

    def keys_matching_changed_since(self, scope: str, pattern: Pattern, revision: int) -> bool: ...

    def compact(self, upto_revision: int | None, before: float | None) -> int: ...

    def compacted(self) -> int:
        """Every change-log record up to this revision may have been compacted away."""
        ...

    def save_position(
        self, name: str, position: int, delivered: int, failed: int, now: float
    ) -> None: ...

    def record_failure(self, name: str, revision: int, error: str, now: float) -> None: ...

    def fetch_lock(self, name: str) -> LockRow | None: ...

    def save_lock(self, name: str, row: LockRow) -> None: ...

    def fetch_timer(self, timer_id: str) -> TimerRow | None: ...

    def add_timer(self, timer: TimerRow, now: float) -> None: ...

    def fetch_timers(self, timer_ids: list[str]) -> dict[str, TimerRow]: ...

    def drop_timer(self, timer_id: str) -> bool: ...

    def drop_timers(self, timer_ids: list[str]) -> None: ...

    def move_timers(self, moves: list[tuple[str, float]]) -> None:
        """Move each timer of ``moves`` (id, due) to its new due time."""
        ...

    def jobs(self) -> SQLJobs:
        """The statements of work queues (``reactor_queues``, ``reactor_jobs``)."""
        ...


class WriteTxn:
    """The staged state of one write transaction (one batch of requests).

    Reads see the database as this transaction has changed it so far; writes are kept
    here until `flush()`. `savepoint()` and `rollback_to()` undo one request's writes
    without touching the others'.

    Until the backend numbers them (at `flush()` on SQLite; on PostgreSQL at the commit,
    under the lock that orders revisions), a change carries a provisional revision:
    ``-n`` for the n-th change of the transaction, and so does the row it staged.
    """

    __slots__ = (
        "_changes",
        "_count",
        "_deferred",
        "_fetched",
        "_staged",
        "_undo",
        "now",
        "pending",
        "statements",
        "timer",
    )

    def __init__(self, statements: Statements, now: float, *, pending: bool = False) -> None:
        self.now = now
        self.statements = statements
        self.pending = pending  # a transaction body's: committed later, by another
        self.timer: str | None = None  # the timer firing now: its id goes on the records
        self._count = 0
        self._fetched: dict[Key, Row | None] = {}  # rows read ahead by prefetch()
        self._staged: dict[Key, Row | None] = {}
        self._changes: list[ChangeRecord] = []
        self._undo: list[tuple[Key, Row | _Absent | None]] = []
        # Work for the commit's transaction, of a transaction body (``defer``), with how
        # many changes the body had recorded before it: its place among them.
        self._deferred: list[tuple[int, Callable[[WriteTxn], None]]] = []

    # -- reading -------------------------------------------------------------------
    def row(self, scope: str, key: str) -> Row | None:
        """The stored row, live or not yet swept, as this transaction sees it."""
        staged = self._staged.get((scope, key), _ABSENT)
        if staged is not _ABSENT:
            return staged
        fetched = self._fetched.pop((scope, key), _ABSENT)
        if fetched is not _ABSENT:
            return fetched
        return self.statements.fetch_row(scope, key)

    def prefetch(self, keys: Collection[Key]) -> None:
        """Read the rows of ``keys`` ahead of the writes that will ask for them one by
        one (``Statements.read_ahead``)."""
        self._fetched.update(self.statements.read_ahead(keys))

    def live_row(self, scope: str, key: str) -> Row | None:
        """The row if it is live. A row past its deadline is expired here and now."""
        row = self.row(scope, key)
        if row is not None and not row.live(self.now):
            self.write(scope, key, row, None, None, change_type="expired")
            return None
        return row

    def live_rows(self, scope: str, pattern: Pattern) -> list[tuple[str, Row]]:
        """Every live row of ``scope`` whose key matches, sorted by key."""
        found = dict(self.statements.fetch_rows(scope, pattern.bounds()))
        for (row_scope, key), staged in self._staged.items():
            if row_scope == scope:
                if staged is None:
                    found.pop(key, None)
                else:
                    found[key] = staged
        matching: list[tuple[str, Row]] = []
        for key in sorted(found):
            if not pattern.matches(key):
                continue
            row = found[key]
            if row.live(self.now):
                matching.append((key, row))
            else:
                self.write(scope, key, row, None, None, change_type="expired")
        return matching

    # -- writing -------------------------------------------------------------------
    def write(
        self,
        scope: str,
        key: str,
        old: Row | None,
        value: str | None,
        expires_at: float | None,
        *,
        change_type: str | None = None,
        ops: str | None = None,
    ) -> None:
        """Stage ``value`` (None deletes) over ``old``, the row ``row()`` returned.

        A write that leaves the JSON text as it was records no change (though a new
        deadline is still stored); every other write records one, with a new revision.
        """
        if value is None:
            if old is None:
                return
            self._stage((scope, key), None)
            kind = change_type or "deleted"
            passed = old.expires_at if kind == "expired" else None
            self._record(scope, key, kind, old.value, None, ops, 0, passed)
            return
        if old is not None and old.value == value:
            if old.expires_at != expires_at:
                self._stage((scope, key), replace(old, expires_at=expires_at))
            return
        if old is None:
            provisional = self._record(
                scope, key, change_type or "created", None, value, ops, 1, expires_at
            )
            self._stage((scope, key), Row(value, expires_at, provisional, provisional, 1))
            return
        version = old.version + 1
        provisional = self._record(
            scope, key, change_type or "updated", old.value, value, ops, version, expires_at
        )
        staged = Row(value, expires_at, provisional, old.created_revision, version)
        self._stage((scope, key), staged)

    def log(self, scope: str, key: str, kind: str, old: str | None, new: str | None) -> None:
        """Record a change that no row of ``reactor_kv`` holds (a queue's job: the
        jobs table does), so that it has a revision and an event like any other."""
        self._changes.append(
            ChangeRecord(scope, key, kind, old, new, None, -self._count - 1, self.now)
        )
        self._count += 1

    def defer(self, work: Callable[[WriteTxn], None]) -> None:
        """Run ``work`` in the transaction that commits this one: at once on a write
        transaction, at the commit for a transaction body (``adopt`` runs it there, at
        its place among the body's changes, so that what it records comes between
        them as in the body). Deferred work writes other tables than the keys' (jobs,
        timers): it must not read or write the body's keys."""
        if self.pending:
            self._deferred.append((len(self._changes), work))
        else:
            work(self)

    def deferred_work(self) -> Iterator[Callable[[WriteTxn], None]]:
        """The work deferred to the commit so far, in order."""
        return (work for _, work in self._deferred)

    def last_deferred(self) -> Callable[[WriteTxn], None] | None:
        """The work deferred last, if no change was recorded since (more of the same
        may join it, keeping the body's order); None otherwise."""
        if self._deferred and self._deferred[-1][0] == len(self._changes):
            return self._deferred[-1][1]
        return None

    def _stage(self, key: Key, row: Row | None) -> None:
        self._undo.append((key, self._staged.get(key, _ABSENT)))
        self._staged[key] = row

    def _record(
        self,
        scope: str,
        key: str,
        kind: str,
        old: str | None,
        new: str | None,
        ops: str | None,
        version: int,
        expires_at: float | None,
    ) -> int:
        self._count += 1
        record = ChangeRecord(scope, key, kind, old, new, ops, -self._count, self.now, version)
        # An expiry the write meets is the deadline's doing, not the timer's.
        record.timer = self.timer if kind != "expired" else None
        record.expires_at = expires_at
        self._changes.append(record)
        return -self._count

    # -- undo and flush ------------------------------------------------------------
    def savepoint(self) -> tuple[int, int, int, int]:
        return len(self._undo), len(self._changes), self._count, len(self._deferred)

    def rollback_to(self, mark: tuple[int, int, int, int]) -> None:
        undo_len, changes_len, count, deferred_len = mark
        del self._deferred[deferred_len:]
        while len(self._undo) > undo_len:
            key, previous = self._undo.pop()
            if previous is _ABSENT:
                del self._staged[key]
            else:
                self._staged[key] = previous
        del self._changes[changes_len:]
        self._count = count

    def flush(self) -> list[ChangeRecord]:
        """Write what is staged; return the change records (with their revisions once
        the transaction commits: ``Statements.write_changes``)."""
        upserts = [
            (scope, key, row.value, row.expires_at, row.revision, row.created_revision, row.version)
            for (scope, key), row in self._staged.items()
            if row is not None
        ]
        deletes = [key for key, row in self._staged.items() if row is None]
        if self._changes or upserts or deletes:
            self.statements.write_changes(self._changes, upserts, deletes)
        return self._changes

    @property
    def changed(self) -> bool:
        """Whether anything is staged (or deferred to the commit)."""
        return bool(self._staged or self._deferred)

    def adopt(self, other: WriteTxn, read_deadlines: dict[Key, float | None]) -> None:
        """Stage what ``other`` staged (a transaction body), and run what it deferred;
        its changes come after this transaction's own, in their order, what deferred
        work records (jobs enqueued) at its place among them.

        A deadline the body set (one not among ``read_deadlines``, those of the rows it
        read) counted from the body's clock; it moves to count from this commit's.
        """
        renumbered: dict[int, int] = {}  # the body's provisional revisions: this one's
        deferred = iter(other._deferred)
        place, work = next(deferred, (len(other._changes), None))
        for index, record in enumerate(other._changes):
            while work is not None and place <= index:
                work(self)
                place, work = next(deferred, (len(other._changes), None))
            self._count += 1
            renumbered[record.revision] = record.revision = -self._count
            record.timestamp = self.now
            self._changes.append(record)
        while work is not None:
            work(self)
            place, work = next(deferred, (len(other._changes), None))
        later = self.now - other.now
        for key, staged in other._staged.items():
            if staged is not None:
                expires_at = staged.expires_at
                if expires_at is not None and read_deadlines.get(key) != expires_at:
                    expires_at += later
                staged = Row(  # noqa: PLW2901 - the body's row, as this transaction stages it
                    staged.value,
                    expires_at,
                    renumbered.get(staged.revision, staged.revision),
                    renumbered.get(staged.created_revision, staged.created_revision),
                    staged.version,
                )
            self._stage(key, staged)


class Work(Generic[T]):
    """What one write does in its transaction (``run``), and the keys it will read
    (``reads``: a batch reads the rows of all its writes ahead, in one statement, or
    with the round trip that begins the transaction)."""

    __slots__ = ("reads", "run")

    def __init__(self, run: Callable[[WriteTxn], T], reads: tuple[Key, ...] = ()) -> None:
        self.run = run
        self.reads = reads

    def __call__(self, txn: WriteTxn) -> T:
        return self.run(txn)


class Reads(Protocol):
    """Statements (``?`` placeholders) run on one connection, in one read transaction."""

    def all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """The rows of ``sql``, all at once."""
        ...

    def each(self, sql: str, params: tuple[Any, ...]) -> Iterator[Any]:
        """The rows of ``sql``, fetched a few at a time: however many there are, only
        a few are held at once."""
        ...


class Store(Protocol):
    """A database as the engine uses it. Implementations: ``_sqlite.SQLiteStore``,
    ``_postgres.PostgresStore``."""

    location: str

    def get(self, scope: str, key: str, now: float) -> str | None: ...

    def get_entry(self, scope: str, key: str, now: float) -> tuple[str, float | None] | None: ...

    def get_many(self, scope: str, keys: Iterable[str], now: float) -> dict[str, str]: ...

    def get_row(self, scope: str, key: str, now: float) -> Row | None: ...

    def value_at(self, scope: str, key: str, revision: int) -> str | None: ...

    def key_history(self, scope: str, key: str, since: int, limit: int) -> list[ChangeRecord]: ...

    def items(self, scope: str, pattern: Pattern, now: float) -> list[tuple[str, str]]: ...

    def keys(self, scope: str, pattern: Pattern, now: float) -> list[str]: ...

    def scopes(self, now: float) -> list[str]: ...

    def counts(self, now: float) -> dict[str, int]: ...

    def expired(
        self, now: float, limit: int, skip: Collection[str] = ()
    ) -> list[tuple[str, str]]: ...

    def size_bytes(self) -> int: ...

    def revision(self) -> int: ...

    def snapshot(self, scope: str, now: float) -> tuple[list[tuple[str, str]], int]: ...

    def consistent_reads(self) -> AbstractContextManager[Reads]:
        """Reads that all see one snapshot of the database, taken as the block begins,
        for as long as it runs (writers go on meanwhile): an export's."""
        ...

    def locks_held(self, now: float) -> int: ...

    def due_timers(
        self, now: float, limit: int, skip: Collection[str] = ()
    ) -> list[tuple[str, str, str]]:
        """Up to ``limit`` timers due at ``now`` (id, scope, key), earliest first, of
        scopes other than those in ``skip``."""
        ...

    def next_timer(self, now: float) -> float | None:
        """When the first timer due after ``now`` is due (None: none is)."""
        ...

    def timers(self, limit: int | None = None) -> list[TimerRow]: ...

    def timer(self, timer_id: str) -> TimerRow | None: ...

    def timers_pending(self) -> int: ...

    def held_locks(self, now: float, limit: int) -> list[tuple[str, LockRow]]:
        """Up to ``limit`` locks held at ``now``, by name."""
        ...

    def history(self, scope: str, key: str, limit: int) -> list[ChangeRecord]:
        """The change log's last ``limit`` records of one key, newest first."""
        ...

    def reader(self) -> Statements: ...

    def log_after(
        self, revision: int, limit: int, upto: int | None = None
    ) -> list[ChangeRecord]: ...

    def compacted(self) -> int: ...

    def position(self, name: str) -> int | None: ...

    def subscribers(self) -> dict[str, tuple[int, int, int]]: ...

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

    def await_commits(self, timeout: float) -> int | None:
        """Wait at most ``timeout`` for a sign that another connection committed; return
        the highest revision it may have committed, or None without a sign."""
        ...

    def checkpoint(self) -> None: ...

    def close(self) -> None: ...

    def reclaim(self) -> None:
        """Give back the writers' turn if this thread lost it to a Ctrl-C."""
        ...
