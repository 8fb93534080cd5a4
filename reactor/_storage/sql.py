"""What the SQL backends share: the statements, and the reads and writes built on them.

Statements are written once, with ``?`` placeholders; a backend whose driver wants
another style converts them (``postgres_text.pg``). A backend provides a way to run a
query (``SQLStore._query``) and a write connection (``SQLStatements``, of
``sql_statements``); everything else here works the same on SQLite and PostgreSQL.

A name (a scope, a key, a queue, a lock or a durable subscriber) that a statement looks up,
compares or declares unique is written in brackets: ``[scope] = ?``, ``[key] IN (?, ?)``,
``[key] >= ?``, ``j.[queue] = q.[name]``, ``ON CONFLICT ([scope], [key])``. SQLite reads
``[scope]`` as the column ``scope`` (a quoted identifier); PostgreSQL, whose B-tree
entries hold at most 2,704 bytes, indexes a name by a bounded form of it, and
``postgres_text`` turns the brackets into that form (``schema.NAME_INDEXED``), so that every
name of up to 1,024 characters (4 KB of UTF-8) is stored and found through an index.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any, NamedTuple, NoReturn, TypeVar

from reactor._base.keys import Pattern
from reactor._base.turn import Turn
from reactor.errors import (
    BusyError,
    ClosedError,
    InvalidArgumentError,
    ReactorError,
    RevisionCompactedError,
    StorageError,
)

from .combine import Combiner
from .records import ChangeRecord, LockRow, Row, TimerRow
from .sql_statements import SQLReader, SQLStatements
from .sql_text import (
    COMPACTED,
    COUNTS,
    EXPIRED,
    FIRST_DUE_TIMER,
    FIRST_EXPIRED,
    FIRST_LEASE_END,
    GET,
    GET_ENTRY,
    HELD_LOCKS,
    HISTORY,
    IN_CHUNK,
    ITEMS,
    KEY_HISTORY,
    KEYS,
    LAST_FAILURES,
    LIVE_ROW,
    LOCKS_HELD,
    LOG_AFTER,
    LOG_AFTER_IN,
    LOG_SPAN,
    NEXT_TIMER,
    POSITION,
    REVISION,
    SCOPES,
    SUBSCRIBERS,
    TIMER,
    TIMERS,
    TIMERS_DUE,
    TIMERS_PENDING,
    VALUE_AT,
    ranged,
)
from .txn import WriteTxn

__all__ = ["SQLStore"]

logger = logging.getLogger("reactor")
T = TypeVar("T")


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt a driver error was raised while handling, if any: the
    caller pressed Ctrl-C, and hears of that rather than of what it caused."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class _Change(NamedTuple):
    """The first change of a key after a revision: what the key held before it."""

    type: str
    old_value: str | None
    expires_at: float | None  # of an "expired" change: the deadline that passed


class _Stored(NamedTuple):
    """A key's row as it is now."""

    value: str
    expires_at: float | None


class _KeyAt(NamedTuple):
    """What ``VALUE_AT`` reads of a key at a revision, in one snapshot."""

    first_after: _Change | None  # None: no change of the key since
    stored: _Stored | None  # None: no row
    at: float | None  # when the revision committed (None: its record is gone)
    compacted: int  # the compaction horizon
    last: int  # the last revision committed
    compacted_at: float | None  # when the record at the horizon was made (None: unknown)


def _key_at(rows: list[Any]) -> _KeyAt:
    """``VALUE_AT``'s rows, each tagged by the part of the statement that read it."""
    first_after = stored = None
    at = compacted_at = None
    compacted = last = 0
    for part, kind, text, number in rows:
        tag = int(part)
        if tag == 0:
            first_after = _Change(kind, text, None if number is None else float(number))
        elif tag == 1:
            stored = _Stored(text, None if number is None else float(number))
        elif tag == 2:
            at = float(number)
        elif tag == 3:
            compacted = int(number)
        elif tag == 4:
            last = int(number or 0)
        elif int(number) >= 0:  # 5: -1 when not known (compacted before version 5)
            compacted_at = int(number) / 1_000_000
    return _KeyAt(first_after, stored, at, compacted, last, compacted_at)


class SQLStore:
    """The reads of a SQL store, and its writes: every write, on either backend, runs
    the one commit protocol of ``_write_once`` (through a ``Combiner`` where threads
    share commits). A backend supplies ``_query``, ``_begin_write`` (a write
    transaction begun, as ``SQLStatements`` that can commit and abort), ``_translate``
    and the rest of ``_store.Store`` (snapshots, following other processes, closing)."""

    location: str
    commits: int = 0
    _combiner: Combiner | None  # None: each write commits on its own (SQLite)
    _gate: Turn  # this process's writers take turns here
    _timeout: float
    _closed: bool
    _opened: list[Any]  # every connection handed out, to close them
    _opened_lock: threading.Lock
    _driver_error: type[Exception]  # what the backend's driver raises

    def write(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        on_commit: Callable[[list[ChangeRecord]], None] | None = None,
        *,
        shared: bool = False,
        scopes: Collection[str] | None = None,
        reads: Collection[tuple[str, str]] = (),
    ) -> tuple[T, list[ChangeRecord]]:
        """Run ``work`` in a write transaction and commit; return its result and the
        change records of the transaction. ``on_commit`` gets those records right after
        the commit, in revision order. ``shared`` work (it only stages its changes) may
        commit in one transaction with other threads' (``_combine``). ``scopes``: the
        only scopes ``work`` reads or writes (None: it may touch anything); ``reads``:
        the keys it will read, read ahead in as few round trips as the backend can.

        Raises:
            BusyError: the database (or this process's writer) stayed busy too long.
            StorageError: the database failed; nothing was committed (or, for
                ``OutcomeUnknownError``, it cannot be known).
        """
        if self._combiner is None:
            return self._write_once(work, now, on_commit, scopes, reads)
        return self._combiner.write(work, now, on_commit, shared=shared, scopes=scopes, reads=reads)

    def _write_once(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        on_commit: Callable[[list[ChangeRecord]], None] | None = None,
        scopes: Collection[str] | None = None,
        reads: Collection[tuple[str, str]] = (),
    ) -> tuple[T, list[ChangeRecord]]:
        """The commit protocol, the same on every backend:

        1. take this process's turn (``_gate``), so that its commits, and what
           ``on_commit`` publishes of them, come one at a time;
        2. begin: the backend takes what keeps other processes from writing what
           ``work`` reads (``_begin_write``: the ``scopes``, or the whole database),
           and reads ahead the rows of ``reads`` (with the begin, if it can);
        3. run ``work``, which stages its changes in a ``WriteTxn``; ``flush`` writes
           them, log records and rows, and the backend numbers them in the one order
           of revisions of every process (at the latest in the commit);
        4. commit (or, on any failure, abort: nothing is applied);
        5. still in turn, after the commit: ``_committed`` (a last check of the
           backend's), then ``on_commit`` publishes the records, in revision order.

        Raises:
            BusyError: this process's writer, or the database, stayed busy too long.
            ClosedError: the store is closed.
            StorageError: the database failed; nothing was committed (but see
                ``OutcomeUnknownError`` and ``SQLiteStore._check_file``).
        """
        if not self._gate.take(self._timeout):
            raise BusyError(f"this process's writer stayed busy for more than {self._timeout} s")
        try:
            if self._closed:
                raise ClosedError("the database is closed")
            try:
                result, records = self._attempt(work, now, scopes, reads)
            except BusyError:
                # A lock held past the timeout: by a writer frozen in its transaction?
                if not self.end_frozen_writers():
                    raise
                result, records = self._attempt(work, now, scopes, reads)
            self._committed()
            if records and on_commit is not None:
                try:
                    on_commit(records)
                except Exception:  # the write stands: it is committed
                    logger.exception("publishing the changes of a commit failed")
            return result, records
        finally:
            self._gate.give_back()

    def _attempt(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        scopes: Collection[str] | None,
        reads: Collection[tuple[str, str]],
    ) -> tuple[T, list[ChangeRecord]]:
        """Steps 2 to 4 of ``_write_once``, in turn: begin, run ``work``, commit."""
        try:
            statements = self._begin_write(scopes, reads)
            try:
                txn = WriteTxn(statements, now, writes=statements)
                if reads and (statements.READS_ONE_AHEAD or len(reads) > 1):
                    txn.prefetch(reads)
                result = work(txn)
                records = txn.flush()
                statements.commit(records)
                self.commits += 1  # in turn: no other thread of this store counts now
            except BaseException as exc:
                statements.abort(interrupted=not isinstance(exc, Exception))
                raise
        except (self._driver_error, StorageError) as exc:
            self._fail(exc)
        return result, records

    def end_frozen_writers(self) -> bool:
        """End the transactions of other processes' writers frozen in them (stopped,
        wedged) past the timeout, and so free their locks; whether any was. SQLite
        cannot: its write lock is a file lock, released only by its holder."""
        return False

    def _fail(self, exc: Exception) -> NoReturn:
        """Raise what a write that failed with ``exc`` raises: the Ctrl-C the driver
        failed as it handled, a reactor error as it is, a driver error translated."""
        interrupt = _interrupt_behind(exc)
        if interrupt is not None:
            raise interrupt from None
        if isinstance(exc, StorageError):
            raise exc
        raise self._translate(exc) from exc

    def reclaim(self) -> None:
        """Give back the writers' turn if this thread lost it to a Ctrl-C (``_turn``):
        called before this thread waits for another's write."""
        self._gate.reclaim()

    def _begin_write(
        self, scopes: Collection[str] | None, reads: Collection[tuple[str, str]]
    ) -> SQLStatements:
        """Begin a write transaction; no other process may write ``scopes`` (None:
        anything) until it ends. ``reads``: rows to read ahead now, if that saves a
        round trip (``SQLStatements.read_ahead`` gives them)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every connection; later calls raise ``ClosedError``. Idempotent."""
        gated = self._gate.take(self._timeout)
        if not gated:
            logger.warning("closing %s while a write is still running", self.location)
        try:
            self._closed = True
            with self._opened_lock:
                opened, self._opened = self._opened, []
            self._close_all(opened)
        finally:
            if gated:
                self._gate.give_back()

    def _close_all(self, opened: list[Any]) -> None:
        """Close ``opened``, every connection handed out (the store is closed now)."""
        raise NotImplementedError

    def _translate(self, exc: Exception) -> ReactorError:
        """The reactor error for a driver error."""
        raise NotImplementedError

    def _committed(self) -> None:
        """Called after each commit, before it is acknowledged (nothing by default)."""

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def _query_often(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """``_query`` of a read run again and again (the follower's reads of the log, a
        get), whose plan is one index seek or range whatever the statistics say:
        prepared where the backend prepares statements."""
        return self._query(sql, params)

    def get(self, scope: str, key: str, now: float) -> str | None:
        found = self._query_often(GET, (scope, key, now))
        return found[0][0] if found else None

    def get_entry(self, scope: str, key: str, now: float) -> tuple[str, float | None] | None:
        found = self._query(GET_ENTRY, (scope, key, now))
        return (found[0][0], found[0][1]) if found else None

    def get_row(self, scope: str, key: str, now: float) -> Row | None:
        """The row of live ``key``, with its revisions and version, or None."""
        found = self._query(LIVE_ROW, (scope, key, now))
        return Row(*found[0]) if found else None

    def value_at(self, scope: str, key: str, revision: int) -> str | None:
        """The JSON text ``key`` held at ``revision`` (None: absent then), read in one
        statement.

        Raises:
            InvalidArgumentError: ``revision`` is after the last one committed.
            RevisionCompactedError: the change log no longer covers ``revision``.
        """
        found = _key_at(self._query(VALUE_AT, (scope, key, revision, scope, key, revision)))
        if revision > found.last:
            raise InvalidArgumentError(
                f"revision {revision} is after the last one committed ({found.last})"
            )
        at = found.at  # when the revision committed
        if at is None and revision == found.compacted:
            at = found.compacted_at  # its record is gone; its time is kept
        if revision < found.compacted or (at is None and revision > 0):
            raise RevisionCompactedError(
                f"the change log holds the changes after revision {found.compacted}, so it "
                f"can no longer tell what {key!r} held at revision {revision}"
            )
        first = found.first_after  # the first change after the revision: what was before
        if first is not None:
            passed = first.expires_at if first.type == "expired" else None
            if passed is not None and passed <= (at or 0):
                return None  # past its deadline by then, its expiry recorded later
            return None if first.old_value is None else str(first.old_value)
        stored = found.stored
        if stored is None:
            return None
        if stored.expires_at is not None and at is not None and stored.expires_at <= at:
            return None  # past its deadline already then (its expiry not yet recorded)
        return str(stored.value)

    def key_history(self, scope: str, key: str, since: int, limit: int) -> list[ChangeRecord]:
        """Up to ``limit`` change-log records of one key after revision ``since``,
        oldest first."""
        return [ChangeRecord(*row) for row in self._query(KEY_HISTORY, (scope, key, since, limit))]

    def get_many(self, scope: str, keys: Iterable[str], now: float) -> dict[str, str]:
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        for start in range(0, len(wanted), IN_CHUNK):
            chunk = wanted[start : start + IN_CHUNK]
            sql = f"{ITEMS} AND [key] IN ({', '.join('?' * len(chunk))})"
            found.update(self._query(sql, (scope, now, *chunk)))
        return {key: found[key] for key in wanted if key in found}

    def items(self, scope: str, pattern: Pattern, now: float) -> list[tuple[str, str]]:
        sql, params = ranged(ITEMS, scope, pattern.bounds(), now)
        rows: list[tuple[str, str]] = self._query(sql + " ORDER BY key", params)
        if pattern.matches_all:
            return rows
        return [(key, value) for key, value in rows if pattern.matches(key)]

    def keys(self, scope: str, pattern: Pattern, now: float) -> list[str]:
        sql, params = ranged(KEYS, scope, pattern.bounds(), now)
        return [
            key for (key,) in self._query(sql + " ORDER BY key", params) if pattern.matches(key)
        ]

    def scopes(self, now: float) -> list[str]:
        return [scope for (scope,) in self._query(SCOPES, (now,))]

    def counts(self, now: float) -> dict[str, int]:
        return {scope: int(count) for scope, count in self._query(COUNTS, (now,))}

    def expired(self, now: float, limit: int, skip: Collection[str] = ()) -> list[tuple[str, str]]:
        """Up to ``limit`` keys past their deadline, earliest first, of scopes other
        than those in ``skip``."""
        sql: str = EXPIRED
        params: tuple[Any, ...] = (now,)
        if skip:
            sql += f" AND scope NOT IN ({', '.join('?' * len(skip))})"
            params += tuple(skip)
        return [
            (scope, key)
            for scope, key in self._query(sql + " ORDER BY expires_at LIMIT ?", (*params, limit))
        ]

    def revision(self) -> int:
        return int(self._query_often(REVISION, ())[0][0])

    def reader(self) -> SQLReader:
        return SQLReader(self._query)

    def log_after(
        self,
        revision: int,
        limit: int,
        upto: int | None = None,
        scopes: Collection[str] | None = None,
    ) -> list[ChangeRecord]:
        """The change records after ``revision`` (up to ``upto``), oldest first; only
        those of ``scopes`` if given."""
        last = upto if upto is not None else 2**63 - 1
        if scopes is None:
            rows = self._query_often(LOG_AFTER, (revision, last, limit))
            return [ChangeRecord(*row) for row in rows]
        names = sorted(scopes)
        sql = LOG_AFTER_IN.format(", ".join("?" * len(names)))
        rows = self._query_often(sql, (revision, last, *names, limit))
        return [ChangeRecord(*row) for row in rows]

    def compacted(self) -> int:
        """Every change-log record up to this revision may have been compacted away."""
        return int(self._query(COMPACTED, ())[0][0])

    def log_span(self) -> tuple[int, int] | None:
        """The first and last revisions the change log holds (None: it is empty)."""
        first, last = self._query(LOG_SPAN, ())[0]
        return None if first is None else (int(first), int(last))

    def position(self, name: str) -> int | None:
        found = self._query(POSITION, (name,))
        return int(found[0][0]) if found else None

    def subscribers(self) -> dict[str, tuple[int, int, int]]:
        """Each durable subscriber's position, events delivered and events failed."""
        return {
            name: (int(position), int(delivered), int(failed))
            for name, position, delivered, failed in self._query(SUBSCRIBERS, ())
        }

    def last_failures(self) -> dict[str, tuple[int, str, float, int]]:
        """Each durable subscriber's last event given up on: its revision, the error,
        when, and how many such events the subscriber has on record."""
        return {
            name: (int(revision), error, float(failed_at), int(count))
            for name, revision, error, failed_at, count in self._query(LAST_FAILURES, ())
        }

    def due_timers(
        self, now: float, limit: int, skip: Collection[str] = ()
    ) -> list[tuple[str, str, str]]:
        """Up to ``limit`` timers due at ``now`` (id, scope, key), earliest first, of
        scopes other than those in ``skip``."""
        sql: str = TIMERS_DUE
        params: tuple[Any, ...] = (now,)
        if skip:
            sql += f" AND scope NOT IN ({', '.join('?' * len(skip))})"
            params += tuple(skip)
        found = self._query(sql + " ORDER BY due, id LIMIT ?", (*params, limit))
        return [(timer_id, scope, key) for timer_id, scope, key in found]

    def next_timer(self, now: float) -> float | None:
        """When the first timer due after ``now`` is due (None: none is)."""
        found = self._query(NEXT_TIMER, (now,))
        return float(found[0][0]) if found else None

    def overdue(self, now: float) -> float | None:
        """When the oldest upkeep work still undone at ``now`` fell due: a key past its
        deadline, a due timer or a job whose lease ran out (None: nothing is due)."""
        due = [
            float(found[0][0])
            for sql in (FIRST_EXPIRED, FIRST_DUE_TIMER)
            if (found := self._query(sql, (now,)))
        ]
        lease_end = self._query(FIRST_LEASE_END, ())[0][0]
        if lease_end is not None and lease_end <= now:
            due.append(float(lease_end))
        return min(due, default=None)

    def timers(self, limit: int | None = None) -> list[TimerRow]:
        """The pending timers, earliest first (the first ``limit`` of them)."""
        if limit is None:
            return [TimerRow(*row) for row in self._query(TIMERS, ())]
        return [TimerRow(*row) for row in self._query(TIMERS + " LIMIT ?", (limit,))]

    def timer(self, timer_id: str) -> TimerRow | None:
        found = self._query(TIMER, (timer_id,))
        return TimerRow(*found[0]) if found else None

    def timers_pending(self) -> int:
        return int(self._query(TIMERS_PENDING, ())[0][0])

    def locks_held(self, now: float) -> int:
        return int(self._query(LOCKS_HELD, (now,))[0][0])

    def held_locks(self, now: float, limit: int) -> list[tuple[str, LockRow]]:
        """Up to ``limit`` locks held at ``now``, by name."""
        return [
            (name, LockRow(owner, int(token), expires_at))
            for name, owner, token, expires_at in self._query(HELD_LOCKS, (now, limit))
        ]

    def history(self, scope: str, key: str, limit: int) -> list[ChangeRecord]:
        """The change log's last ``limit`` records of one key, newest first."""
        return [ChangeRecord(*row) for row in self._query(HISTORY, (scope, key, limit))]
