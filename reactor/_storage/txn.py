"""The write transaction every write runs in (``WriteTxn``), and what one write does
in it (``Work``).

A write transaction stages its changes in memory: each request in a batch can be undone
on its own when it fails, and the batch reaches the database as a few statements just
before the commit, together with its change-log records.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from typing import Final, Generic, TypeVar

from reactor._base.keys import Pattern

from .records import ChangeRecord, Key, Row, Upsert
from .statements import ReadStatements, WriteStatements

__all__ = ["Mark", "Work", "WriteTxn"]

T = TypeVar("T")
# A savepoint: how many undo entries, changes, provisional revisions and deferred works
# there were, and how many times ``writes`` had been asked for.
Mark = tuple[int, int, int, int, int]


class _Absent(enum.Enum):
    """No entry (a row staged or read ahead may itself be None: no row)."""

    ABSENT = enum.auto()


_ABSENT: Final = _Absent.ABSENT


class WriteTxn:
    """The staged state of one write transaction (one batch of requests).

    Reads see the database as this transaction has changed it so far; writes are kept
    here until `flush()`. `savepoint()` and `rollback_to()` undo one request's writes
    without touching the others'.

    A commit's transaction has its ``writes`` too; a transaction body's reads
    only, and defers what else it writes to the commit (``defer``).

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
        "_writes",
        "_written",
        "now",
        "statements",
        "timer",
    )

    def __init__(
        self, statements: ReadStatements, now: float, *, writes: WriteStatements | None = None
    ) -> None:
        self.now = now
        self.statements = statements
        self._writes = writes  # None: a transaction body's, committed later by another
        self.timer: str | None = None  # the timer firing now: its id goes on the records
        self._count = 0
        self._fetched: dict[Key, Row | None] = {}  # rows read (ahead by prefetch())
        self._staged: dict[Key, Row | None] = {}
        self._changes: list[ChangeRecord] = []
        # What each staged write replaced, kept from the first savepoint on (only then
        # can anything be undone): a lone write pays nothing for it.
        self._undo: list[tuple[Key, Row | _Absent | None]] | None = None
        # Work for the commit's transaction, of a transaction body (``defer``), with how
        # many changes the body had recorded before it: its place among them.
        self._deferred: list[tuple[int, Callable[[WriteTxn], None]]] = []
        # How many times ``writes`` was asked for: statements that a savepoint's
        # rollback cannot take back may have run since a mark that counted fewer.
        self._written = 0

    @property
    def writes(self) -> WriteStatements:
        """The statements that write besides the keys (timers, jobs, locks, positions,
        compaction): a commit's only.

        Raises:
            AssertionError: this is a transaction body's (``defer`` such writes).
        """
        if self._writes is None:
            raise AssertionError("a transaction body defers its writes to the commit")
        self._written += 1
        return self._writes

    # -- reading -------------------------------------------------------------------
    def row(self, scope: str, key: str) -> Row | None:
        """The stored row, live or not yet swept, as this transaction sees it."""
        staged = self._staged.get((scope, key), _ABSENT)
        if staged is not _ABSENT:
            return staged
        if self._fetched:
            # Kept, not popped: the rows of the database do not change under the
            # transaction's locks but by its own flush at commit (a run's record reads
            # its document, then its save reads it again as the old row).
            fetched = self._fetched.get((scope, key), _ABSENT)
            if fetched is not _ABSENT:
                return fetched
        found = self.statements.fetch_row(scope, key)
        if self._writes is not None:  # a commit's: read under its locks, kept likewise
            self._fetched[(scope, key)] = found
        return found

    def prefetch(self, keys: Collection[Key]) -> None:
        """Read the rows of ``keys`` ahead of the writes that will ask for them one by
        one (``ReadStatements.read_ahead``)."""
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
        record = ChangeRecord(scope, key, kind, old, new, None, -self._count - 1, self.now)
        record.timer = self.timer  # a periodic put's job carries its timer's id
        self._changes.append(record)
        self._count += 1

    def defer(self, work: Callable[[WriteTxn], None]) -> None:
        """Run ``work`` in the transaction that commits this one: at once on a write
        transaction, at the commit for a transaction body (``adopt`` runs it there, at
        its place among the body's changes, so that what it records comes between
        them as in the body). Deferred work writes other tables than the keys' (jobs,
        timers): it must not read or write the body's keys."""
        if self._writes is None:
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
        if self._undo is not None:
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
    def savepoint(self) -> Mark:
        if self._undo is None:
            self._undo = []  # from now on, what each write replaces is kept
        return len(self._undo), len(self._changes), self._count, len(self._deferred), self._written

    def rollback_to(self, mark: Mark) -> bool:
        """Undo what was staged since ``mark``; whether that undid everything: False
        if statements of ``writes`` may have run since (jobs, timers, locks), which
        only the whole transaction's abort takes back."""
        undo_len, changes_len, count, deferred_len, written = mark
        undo = self._undo
        assert undo is not None, "a mark comes from savepoint()"
        del self._deferred[deferred_len:]
        while len(undo) > undo_len:
            key, previous = undo.pop()
            if previous is _ABSENT:
                del self._staged[key]
            else:
                self._staged[key] = previous
        del self._changes[changes_len:]
        self._count = count
        return self._written == written

    def flush(self) -> list[ChangeRecord]:
        """Write what is staged; return the change records (with their revisions once
        the transaction commits: ``WriteStatements.write_changes``)."""
        upserts: list[Upsert] = []
        deletes: list[Key] = []
        for key, row in self._staged.items():
            if row is None:
                deletes.append(key)
            else:
                scope, name = key
                revision, created, version = row.revision, row.created_revision, row.version
                upserts.append((scope, name, row.value, row.expires_at, revision, created, version))
        if self._changes or upserts or deletes:
            assert self._writes is not None  # a transaction body is adopted, not flushed
            self._writes.write_changes(self._changes, upserts, deletes)
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
