"""The statements both SQL backends run in a write transaction: its reads (``SQLReads``),
with its writes (``SQLStatements``) on a commit's connection, or as a transaction body's
plain reads (``SQLReader``); and an export's reads of one snapshot (``SQLSnapshot``).
See ``sql`` for how statements are written."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

from reactor._base.keys import Pattern

from .records import ChangeRecord, JobRow, Key, LockRow, Row, TimerRow, Upsert
from .sql_jobs import SQLJobReads, SQLJobs
from .sql_text import (
    ALL_LIVE_ROWS,
    CHANGED_SINCE,
    COMPACT_UPTO,
    COMPACTED,
    COUNTS,
    DELETE,
    IN_CHUNK,
    KEYS_CHANGED_SINCE,
    LAST_TO_GO,
    LOCK,
    PRUNE_FAILURES,
    QUEUE_JOBS,
    RECORD_FAILURE,
    REVISION,
    ROW,
    ROWS,
    SAVE_LOCK,
    SAVE_POSITION,
    SCOPE_CHANGED_KEYS,
    SCOPE_CHANGES_SINCE,
    SET_COMPACTED_AT,
    SLOWEST,
    TIMER,
    TIMER_DELETE,
    TIMER_INSERT,
    TIMERS,
    TIMERS_BY_ID,
    TIMERS_DELETE,
    TIMERS_MOVE,
    UPSERT,
    YOUNGEST_KEPT,
    chunks,
    job_row,
    ranged,
)

__all__ = ["SQLReader", "SQLReads", "SQLSnapshot", "SQLStatements"]


class SQLReads:
    """The reads of a write transaction (``statements.ReadStatements``); a backend
    supplies ``_all``, which runs a query."""

    __slots__ = ()

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def _all_several(self, statements: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        """The rows of each of ``statements``: one by one (PostgreSQL's writer sends
        them in one round trip)."""
        return [self._all(sql, params) for sql, params in statements]

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
        bounds = pattern.bounds()
        if bounds is None:  # any key: the revisions after, not the scope's whole history
            found = self._all(SCOPE_CHANGES_SINCE, (revision, scope))
        else:  # a range of keys: their records, on the index by key
            found = self._all(*ranged(SCOPE_CHANGED_KEYS, scope, bounds, revision))
        if any(pattern.matches(key) for (key,) in found):
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

    def current_revision(self) -> int:
        return int(self._all(REVISION, ())[0][0])

    def changed_since(self, scope: str, revision: int) -> bool:
        if self._all(CHANGED_SINCE, (revision, scope)):
            return True
        # A log compacted past the revision can no longer tell: assume a change.
        return self.compacted() > revision

    def compacted(self) -> int:
        return int(self._all(COMPACTED, ())[0][0])

    def jobs(self) -> SQLJobReads:
        return SQLJobReads(self._all)


class SQLStatements(SQLReads):
    """The reads and writes of a commit's transaction (``statements.WriteStatements``) on
    a backend's write connection, inside the transaction the backend began.

    A backend supplies ``_all`` (a query's rows), ``_run`` (a statement's row count),
    ``_many`` (one statement, many parameter rows), ``append_log`` and the statement
    that raises the compaction horizon. Driver errors become reactor errors in those
    three, so that the actor can tell a failed transaction (which fails its whole
    batch) from a request that does not apply.
    """

    __slots__ = ()

    SET_COMPACTED: str = ""
    READS_ONE_AHEAD: bool = True  # whether a write that reads one key reads it ahead

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

    def compact(self, upto_revision: int | None, before: float | None) -> int:
        """Drop log records up to a revision and/or older than a time, but none that a
        durable subscriber has yet to acknowledge, nor the newest (it holds the revision
        counter); remember how far the log is gone, and when that last record was made
        (``get(at_revision=)`` at the horizon compares deadlines with it). The failures
        of durable subscribers on events gone go too, but each one's latest."""
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
            self._run(PRUNE_FAILURES, (revision,))
            self._run(self.SET_COMPACTED, (revision,))
            self._run(SET_COMPACTED_AT, (round(timestamp * 1_000_000),))
        return removed

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
            (
                timer.id,
                timer.scope,
                timer.key,
                timer.due,
                timer.every,
                timer.value,
                timer.ops,
                timer.cron,
                timer.tz,
                now,
            ),
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


class SQLReader(SQLReads):
    """The reads of a transaction body (``statements.Reader``): each runs as a plain
    read of the store, outside any database transaction; ``deadlines`` keeps the
    deadline of each row it read, as first read."""

    __slots__ = ("_query", "deadlines")

    def __init__(self, query: Callable[[str, tuple[Any, ...]], list[Any]]) -> None:
        self._query = query
        self.deadlines: dict[tuple[str, str], float | None] = {}

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return self._query(sql, params)

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


class SQLSnapshot:
    """What an export reads (``store.SnapshotReads``), every statement in the one read
    transaction (one snapshot) of a connection; a backend supplies ``all`` (a query's
    rows, all at once) and ``each`` (fetched a few at a time: however many there are,
    only a few are held at once)."""

    __slots__ = ()

    def all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def each(self, sql: str, params: tuple[Any, ...]) -> Iterator[Any]:
        raise NotImplementedError

    def counts(self, now: float) -> dict[str, int]:
        return {scope: int(count) for scope, count in self.all(COUNTS, (now,))}

    def live_rows(self, now: float) -> Iterator[tuple[str, str, str, float | None]]:
        return self.each(ALL_LIVE_ROWS, (now,))

    def timers(self) -> list[TimerRow]:
        return [TimerRow(*row) for row in self.all(TIMERS, ())]

    def jobs(self) -> SQLJobReads:
        return SQLJobReads(self.all)

    def queue_jobs(self, queue: str) -> Iterator[tuple[JobRow, str | None]]:
        for *columns, key in self.each(QUEUE_JOBS, (queue,)):
            yield job_row(columns), key

    def revision(self) -> int:
        return int(self.all(REVISION, ())[0][0])

    def row(self, scope: str, key: str) -> Row | None:
        found = self.all(ROW, (scope, key))
        return Row(*found[0]) if found else None

    def rows(self, scope: str, pattern: Pattern) -> list[tuple[str, Row]]:
        sql, params = ranged(ROWS, scope, pattern.bounds())
        found = self.all(sql + " ORDER BY key", params)
        return [(key, Row(*row)) for key, *row in found if pattern.matches(key)]
