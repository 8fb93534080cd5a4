"""What the SQL backends share: the statements, and the reads and writes built on them.

Statements are written once, with ``?`` placeholders; a backend whose driver wants
another style converts them (``_postgres``). A backend provides a way to run a query
(``SQLStore._query``) and a write connection (``SQLStatements``); everything else here
works the same on SQLite and PostgreSQL.

A name (a scope, a key, a queue, a lock or a durable subscriber) that a statement looks up,
compares or declares unique is written in brackets: ``[scope] = ?``, ``[key] IN (?, ?)``,
``[key] >= ?``, ``j.[queue] = q.[name]``, ``ON CONFLICT ([scope], [key])``. SQLite reads
``[scope]`` as the column ``scope`` (a quoted identifier); PostgreSQL, whose B-tree
entries hold at most 2,704 bytes, indexes a name by a bounded form of it, and
``_postgres`` turns the brackets into that form (``_schema.NAME_INDEXED``), so that every
name of up to 1,024 characters (4 KB of UTF-8) is stored and found through an index.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

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
from .records import ChangeRecord, Key, LockRow, Row, TimerRow, Upsert
from .sql_jobs import SQLJobs
from .sql_text import (
    CHANGED_SINCE,
    COMPACT_UPTO,
    COMPACTED,
    COUNTS,
    DELETE,
    EXPIRED,
    GET,
    GET_ENTRY,
    HELD_LOCKS,
    HISTORY,
    IN_CHUNK,
    ITEMS,
    KEY_HISTORY,
    KEYS,
    KEYS_CHANGED_SINCE,
    LAST_TO_GO,
    LIVE_ROW,
    LOCK,
    LOCKS_HELD,
    LOG_AFTER,
    NEXT_TIMER,
    POSITION,
    RECORD_FAILURE,
    REVISION,
    ROW,
    ROWS,
    SAVE_LOCK,
    SAVE_POSITION,
    SCOPE_CHANGED_KEYS,
    SCOPES,
    SET_COMPACTED_AT,
    SLOWEST,
    SUBSCRIBERS,
    TIMER,
    TIMER_DELETE,
    TIMER_INSERT,
    TIMERS,
    TIMERS_BY_ID,
    TIMERS_DELETE,
    TIMERS_DUE,
    TIMERS_MOVE,
    TIMERS_PENDING,
    UPSERT,
    VALUE_AT,
    YOUNGEST_KEPT,
    chunks,
    ranged,
)
from .store import WriteTxn

__all__ = ["SQLJobs", "SQLStatements", "SQLStore", "TransactionReader"]

logger = logging.getLogger("reactor")
T = TypeVar("T")


class _RowReads:
    """Reading rows as a write transaction sees them; ``_all`` runs a query."""

    __slots__ = ()

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def _all_several(self, statements: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        """The rows of each of ``statements``: one by one (PostgreSQL's writer sends
        them in one round trip)."""
        return [self._all(sql, params) for sql, params in statements]

    def compacted(self) -> int:
        raise NotImplementedError

    def fetch_row(self, scope: str, key: str) -> Row | None:
        found = self._all(ROW, (scope, key))
        return Row(*found[0]) if found else None

    def fetch_rows(
        self, scope: str, bounds: tuple[str, str | None] | None
    ) -> list[tuple[str, Row]]:
        sql, params = ranged(ROWS, scope, bounds)
        return [(key, Row(*row)) for key, *row in self._all(sql, params)]

    def keys_changed_since(self, scope: str, keys: list[str], revision: int) -> bool:
        """Whether any of ``keys`` has a change after ``revision`` (or the log, compacted
        past it, can no longer tell)."""
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), IN_CHUNK):
            chunk = unique[start : start + IN_CHUNK]
            sql = KEYS_CHANGED_SINCE.format(", ".join("?" * len(chunk)))
            if self._all(sql, (scope, *chunk, revision)):
                return True
        return self.compacted() > revision

    def keys_matching_changed_since(self, scope: str, pattern: Pattern, revision: int) -> bool:
        """Whether a key of ``scope`` matching ``pattern`` has a change after
        ``revision`` (or the log, compacted past it, can no longer tell)."""
        sql, params = ranged(SCOPE_CHANGED_KEYS, scope, pattern.bounds(), revision)
        if any(pattern.matches(key) for (key,) in self._all(sql, params)):
            return True
        return self.compacted() > revision

    def fetch_timer(self, timer_id: str) -> TimerRow | None:
        found = self._all(TIMER, (timer_id,))
        return TimerRow(*found[0]) if found else None

    def fetch_timers(self, timer_ids: list[str]) -> dict[str, TimerRow]:
        """The timers of ``timer_ids`` that exist, by id: read together (one round trip
        on PostgreSQL)."""
        statements = [
            (TIMERS_BY_ID.format(", ".join("?" * len(chunk))), tuple(chunk))
            for chunk in chunks(list(dict.fromkeys(timer_ids)))
        ]
        return {row[0]: TimerRow(*row) for found in self._all_several(statements) for row in found}

    def fetch_lock(self, name: str) -> LockRow | None:
        found = self._all(LOCK, (name,))
        return LockRow(*found[0]) if found else None

    def fetch_many(self, scope: str, keys: list[str]) -> dict[str, Row]:
        found: dict[str, Row] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), IN_CHUNK):
            chunk = unique[start : start + IN_CHUNK]
            sql = f"{ROWS} AND [key] IN ({', '.join('?' * len(chunk))})"
            for key, *row in self._all(sql, (scope, *chunk)):
                found[key] = Row(*row)
        return found

    def read_ahead(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], Row | None]:
        if len(keys) == 1:
            ((scope, key),) = keys
            return {(scope, key): self.fetch_row(scope, key)}
        by_scope: dict[str, list[str]] = {}
        for scope, key in keys:
            by_scope.setdefault(scope, []).append(key)
        ahead: dict[tuple[str, str], Row | None] = {}
        for scope, names in by_scope.items():
            found = self.fetch_many(scope, names)
            for name in names:
                ahead[(scope, name)] = found.get(name)
        return ahead


def _no_writes(*_: object) -> int:
    raise AssertionError("a plain read never writes jobs")


class SQLStatements(_RowReads):
    """The write-path statements (``_store.Statements``) on a backend's write connection,
    inside the transaction the backend began.

    A backend supplies ``_all`` (a query's rows), ``_run`` (a statement's row count),
    ``_many`` (one statement, many parameter rows), ``append_log`` and the statement
    that raises the compaction horizon. Driver errors become reactor errors in those
    three, so that the actor can tell a failed transaction (which fails its whole
    batch) from a request that does not apply.
    """

    __slots__ = ()

    SET_COMPACTED: str = ""

    def _run(self, sql: str, params: tuple[Any, ...]) -> int:
        raise NotImplementedError

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def append_log(self, records: list[ChangeRecord]) -> int:
        """Append ``records`` to the change log; return the revision given to the first
        (the others follow it, one by one)."""
        raise NotImplementedError

    def write_changes(
        self, records: list[ChangeRecord], upserts: list[Upsert], deletes: list[Key]
    ) -> None:
        offset = self.append_log(records) - 1 if records else 0
        for record in records:
            record.revision = offset - record.revision
        if records:
            upserts = [
                (
                    scope,
                    key,
                    value,
                    expires_at,
                    offset - revision if revision < 0 else revision,
                    offset - created if created < 0 else created,
                    version,
                )
                for scope, key, value, expires_at, revision, created, version in upserts
            ]
        self.write_rows(upserts, deletes)

    def commit(self, records: list[ChangeRecord]) -> None:
        """Commit the transaction; ``records`` are what it changed."""
        raise NotImplementedError

    def abort(self, interrupted: bool = False) -> None:
        """Roll the transaction back, after any failure (it must not raise);
        ``interrupted``: by a KeyboardInterrupt (or SystemExit), which may have landed
        inside the driver."""
        raise NotImplementedError

    def write_rows(self, upserts: list[Upsert], deletes: list[Key]) -> None:
        if len(deletes) == 1:  # execute(), not executemany(): a few microseconds less
            self._run(DELETE, deletes[0])
        elif deletes:
            self._many(DELETE, deletes)
        if len(upserts) == 1:
            self._run(UPSERT, upserts[0])
        elif upserts:
            self._many(UPSERT, upserts)

    def current_revision(self) -> int:
        return int(self._all(REVISION, ())[0][0])

    def changed_since(self, scope: str, revision: int) -> bool:
        if self._all(CHANGED_SINCE, (scope, revision)):
            return True
        # A log compacted past the revision can no longer tell: assume a change.
        return self.compacted() > revision

    def compact(self, upto_revision: int | None, before: float | None) -> int:
        """Drop log records up to a revision and/or older than a time, but none that a
        durable subscriber has yet to acknowledge, nor the newest (it holds the revision
        counter); remember how far the log is gone, and when that last record was made
        (``get(at_revision=)`` at the horizon compares deadlines with it)."""
        bound = upto_revision
        if before is not None:
            young = self._all(YOUNGEST_KEPT, (before,))[0][0]
            if young is not None:
                bound = max(bound or 0, int(young) - 1)
        if bound is None:
            return 0
        slowest = self._all(SLOWEST, ())[0][0]
        if slowest is not None:
            bound = min(bound, int(slowest))
        bound = min(bound, self.current_revision() - 1)
        last = self._all(LAST_TO_GO, (bound,))
        if not last:
            return 0
        revision, timestamp = int(last[0][0]), float(last[0][1])
        removed = self._run(COMPACT_UPTO, (revision,))
        if removed:
            self._run(self.SET_COMPACTED, (revision,))
            self._run(SET_COMPACTED_AT, (round(timestamp * 1_000_000),))
        return removed

    def compacted(self) -> int:
        return int(self._all(COMPACTED, ())[0][0])

    def save_position(
        self, name: str, position: int, delivered: int, failed: int, now: float
    ) -> None:
        self._run(SAVE_POSITION, (name, position, delivered, failed, now))

    def record_failure(self, name: str, revision: int, error: str, now: float) -> None:
        self._run(RECORD_FAILURE, (name, revision, error, now))

    def save_lock(self, name: str, row: LockRow) -> None:
        self._run(SAVE_LOCK, (name, row.owner, row.token, row.expires_at))

    def add_timer(self, timer: TimerRow, now: float) -> None:
        self._send(  # on PostgreSQL, not a round trip per timer of a transaction
            TIMER_INSERT,
            (timer.id, timer.scope, timer.key, timer.due, timer.every, timer.value, timer.ops, now),
        )

    def _send(self, sql: str, params: tuple[Any, ...]) -> None:
        """Run ``sql``, whose answer nothing waits for: at once here; on PostgreSQL with
        the next statement answered (in order, in one round trip)."""
        self._run(sql, params)

    def drop_timer(self, timer_id: str) -> bool:
        return self._run(TIMER_DELETE, (timer_id,)) > 0

    def drop_timers(self, timer_ids: list[str]) -> None:
        for chunk in chunks(timer_ids):
            self._send(TIMERS_DELETE.format(", ".join("?" * len(chunk))), tuple(chunk))

    def move_timers(self, moves: list[tuple[str, float]]) -> None:
        """Move each timer (id, due) to its new due time: a statement per due time (the
        timers of one period, fired together, move together)."""
        by_due: dict[float, list[str]] = {}
        for timer_id, due in moves:
            by_due.setdefault(due, []).append(timer_id)
        for due, timer_ids in by_due.items():
            for chunk in chunks(timer_ids):
                self._send(TIMERS_MOVE.format(", ".join("?" * len(chunk))), (due, *chunk))

    def jobs(self) -> SQLJobs:
        return SQLJobs(self._all, self._run)


class TransactionReader(_RowReads):
    """The read statements of a write transaction, for a transaction body: each runs
    as a plain read of the store, outside any database transaction.

    ``deadlines`` keeps the deadline of every row the body read (None: no expiry or no
    row), as first read: the commit checks them, since a change of deadline alone
    leaves no record in the change log."""

    __slots__ = ("_store", "deadlines")

    def __init__(self, store: SQLStore) -> None:
        self._store = store
        self.deadlines: dict[tuple[str, str], float | None] = {}

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return self._store._query(sql, params)

    def fetch_row(self, scope: str, key: str) -> Row | None:
        row = super().fetch_row(scope, key)
        self.deadlines.setdefault((scope, key), None if row is None else row.expires_at)
        return row

    def fetch_rows(
        self, scope: str, bounds: tuple[str, str | None] | None
    ) -> list[tuple[str, Row]]:
        rows = super().fetch_rows(scope, bounds)
        for key, row in rows:
            self.deadlines.setdefault((scope, key), row.expires_at)
        return rows

    def fetch_many(self, scope: str, keys: list[str]) -> dict[str, Row]:
        found = super().fetch_many(scope, keys)
        for key in keys:
            row = found.get(key)
            self.deadlines.setdefault((scope, key), None if row is None else row.expires_at)
        return found

    def write_changes(self, *_: object) -> None:
        raise AssertionError("a transaction body never writes")

    def current_revision(self) -> int:
        return self._store.revision()

    def changed_since(self, *_: object) -> bool:
        raise AssertionError("only a commit checks for changes")

    def compact(self, *_: object) -> int:
        raise AssertionError("a transaction body never compacts")

    def compacted(self) -> int:
        return self._store.compacted()

    def save_position(self, *_: object) -> None:
        raise AssertionError("a transaction body never moves subscribers")

    def record_failure(self, *_: object) -> None:
        raise AssertionError("a transaction body never moves subscribers")

    def save_lock(self, *_: object) -> None:
        raise AssertionError("locks are not part of transactions")

    def add_timer(self, *_: object) -> None:
        raise AssertionError("a transaction body defers its timers to the commit")

    def drop_timer(self, *_: object) -> bool:
        raise AssertionError("a transaction body defers its timers to the commit")

    def drop_timers(self, *_: object) -> None:
        raise AssertionError("a transaction body never fires timers")

    def move_timers(self, *_: object) -> None:
        raise AssertionError("a transaction body never fires timers")

    def jobs(self) -> SQLJobs:
        """Reads of the queues; a body's enqueues run in its commit (``WriteTxn.defer``)."""
        return SQLJobs(self._all, _no_writes)


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


class SQLStore:
    """The reads of a SQL store, and its writes: every write, on either backend, runs
    the one commit protocol of ``_write_once`` (through a ``Combiner`` where threads
    share commits). A backend supplies ``_query``, ``_begin_write`` (a write
    transaction begun, as ``SQLStatements`` that can commit and abort), ``_translate``
    and the rest of ``_store.Store`` (snapshots, following other processes, closing)."""

    location: str
    _combiner: Combiner | None  # None: each write commits on its own (SQLite)
    _gate: Turn  # this process's writers take turns here
    _timeout: float
    _closed: bool
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
        self._gate.reclaim()  # the leader may be another thread: see ``_turn``
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
                statements = self._begin_write(scopes, reads)
                try:
                    txn = WriteTxn(statements, now)
                    if reads:
                        txn.prefetch(reads)
                    result = work(txn)
                    records = txn.flush()
                    statements.commit(records)
                except BaseException as exc:
                    statements.abort(interrupted=not isinstance(exc, Exception))
                    raise
            except (self._driver_error, StorageError) as exc:
                interrupt = _interrupt_behind(exc)
                if interrupt is not None:  # the driver failed as it handled a Ctrl-C
                    raise interrupt from None
                if isinstance(exc, StorageError):
                    raise
                raise self._translate(exc) from exc
            self._committed()
            if records and on_commit is not None:
                try:
                    on_commit(records)
                except Exception:  # the write stands: it is committed
                    logger.exception("publishing the changes of a commit failed")
            return result, records
        finally:
            self._gate.give_back()

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

    def _translate(self, exc: Exception) -> ReactorError:
        """The reactor error for a driver error."""
        raise NotImplementedError

    def _committed(self) -> None:
        """Called after each commit, before it is acknowledged (nothing by default)."""

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def get(self, scope: str, key: str, now: float) -> str | None:
        found = self._query(GET, (scope, key, now))
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
        parts: dict[int, tuple[Any, Any, Any]] = {}
        for part, kind, text, number in self._query(
            VALUE_AT, (scope, key, revision, scope, key, revision)
        ):
            parts[int(part)] = (kind, text, number)
        last = int(parts[4][2] or 0) if 4 in parts else 0
        compacted = int(parts[3][2]) if 3 in parts else 0
        if revision > last:
            raise InvalidArgumentError(
                f"revision {revision} is after the last one committed ({last})"
            )
        at = parts[2][2] if 2 in parts else None  # when the revision committed
        if at is None and revision == compacted and 5 in parts and int(parts[5][2]) >= 0:
            at = int(parts[5][2]) / 1_000_000  # its record is gone; its time is kept
        if revision < compacted or (at is None and revision > 0):
            raise RevisionCompactedError(
                f"the change log holds the changes after revision {compacted}, so it can "
                f"no longer tell what {key!r} held at revision {revision}"
            )
        if 0 in parts:  # the first change after the revision says what was before it
            kind, before, passed = parts[0]
            if kind == "expired" and passed is not None and float(passed) <= float(at or 0):
                return None  # past its deadline by then, its expiry recorded later
            return None if before is None else str(before)
        if 1 not in parts:
            return None
        _, text, expires_at = parts[1]
        if expires_at is not None and at is not None and float(expires_at) <= float(at):
            return None  # past its deadline already then (its expiry not yet recorded)
        return str(text)

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
        return int(self._query(REVISION, ())[0][0])

    def reader(self) -> TransactionReader:
        return TransactionReader(self)

    def log_after(self, revision: int, limit: int, upto: int | None = None) -> list[ChangeRecord]:
        """The change records after ``revision`` (up to ``upto``), oldest first."""
        last = upto if upto is not None else 2**63 - 1
        return [ChangeRecord(*row) for row in self._query(LOG_AFTER, (revision, last, limit))]

    def compacted(self) -> int:
        """Every change-log record up to this revision may have been compacted away."""
        return int(self._query(COMPACTED, ())[0][0])

    def position(self, name: str) -> int | None:
        found = self._query(POSITION, (name,))
        return int(found[0][0]) if found else None

    def subscribers(self) -> dict[str, tuple[int, int, int]]:
        """Each durable subscriber's position, events delivered and events failed."""
        return {
            name: (int(position), int(delivered), int(failed))
            for name, position, delivered, failed in self._query(SUBSCRIBERS, ())
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
