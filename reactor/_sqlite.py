"""The SQLite store: a file in WAL mode, or a database in memory.

SQLAlchemy opens every connection (pragmas in its ``connect`` event) and runs the
schema and migrations; the hot statements run on the DBAPI connections it made, since
SQLAlchemy Core costs tens of microseconds a statement over them. All SQL of this
backend lives here.

Concurrency, as SQLite allows it: any number of readers, one writer at a time per file.
Readers take an idle connection from a free list (no thread hop, no lock); WAL gives
each statement a snapshot of the last commit. Writers in this process queue on one lock
(``_gate``) and share one connection, so they never meet in SQLite's busy handler,
which sleeps; other processes are waited for by ``busy_timeout``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool, StaticPool

from ._keys import Pattern
from ._schema import migrate
from ._store import ChangeRecord, LockRow, Row, WriteTxn
from .errors import BusyError, ClosedError, ReactorError, StorageError

__all__ = ["SQLiteStore"]

logger = logging.getLogger("reactor")

T = TypeVar("T")

_LIVE: Final = "(expires_at IS NULL OR expires_at > ?)"
GET: Final = f"SELECT value FROM reactor_kv WHERE scope = ? AND key = ? AND {_LIVE}"
GET_ENTRY: Final = (
    f"SELECT value, expires_at FROM reactor_kv WHERE scope = ? AND key = ? AND {_LIVE}"
)
ITEMS: Final = f"SELECT key, value FROM reactor_kv WHERE scope = ? AND {_LIVE}"
KEYS: Final = f"SELECT key FROM reactor_kv WHERE scope = ? AND {_LIVE}"
RANGE: Final = " AND key >= ?"
RANGE_END: Final = " AND key < ?"
SCOPES: Final = f"SELECT DISTINCT scope FROM reactor_kv WHERE {_LIVE} ORDER BY scope"
COUNTS: Final = f"SELECT scope, COUNT(*) FROM reactor_kv WHERE {_LIVE} GROUP BY scope"
EXPIRED: Final = (
    "SELECT scope, key FROM reactor_kv WHERE expires_at IS NOT NULL AND expires_at <= ? "
    "ORDER BY expires_at LIMIT ?"
)
ROW: Final = "SELECT value, expires_at, revision FROM reactor_kv WHERE scope = ? AND key = ?"
ROWS: Final = "SELECT key, value, expires_at, revision FROM reactor_kv WHERE scope = ?"
UPSERT: Final = (
    "INSERT INTO reactor_kv (scope, key, value, expires_at, revision) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, "
    "expires_at = excluded.expires_at, revision = excluded.revision"
)
DELETE: Final = "DELETE FROM reactor_kv WHERE scope = ? AND key = ?"
LOG: Final = (
    "INSERT INTO reactor_changes (scope, key, type, old_value, new_value, ops, timestamp) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
REVISION: Final = "SELECT COALESCE(MAX(revision), 0) FROM reactor_changes"
CHANGED_SINCE: Final = "SELECT 1 FROM reactor_changes WHERE scope = ? AND revision > ? LIMIT 1"
COMPACT_UPTO: Final = "DELETE FROM reactor_changes WHERE revision <= ?"
# By age: everything below the oldest revision still young enough, so that the log
# stays a contiguous range even if timestamps do not rise with revisions; the newest
# record always stays (it holds the revision counter: see _schema.changes).
COMPACT_BEFORE: Final = (
    "DELETE FROM reactor_changes WHERE revision < COALESCE("
    "(SELECT MIN(revision) FROM reactor_changes WHERE timestamp >= ?), "
    "(SELECT MAX(revision) FROM reactor_changes))"
)
COMPACTED: Final = "SELECT value FROM reactor_meta WHERE name = 'compacted'"
SET_COMPACTED: Final = "UPDATE reactor_meta SET value = MAX(value, ?) WHERE name = 'compacted'"
LAST_REMOVED: Final = "SELECT COALESCE(MIN(revision), ?) - 1 FROM reactor_changes"
SLOWEST: Final = "SELECT MIN(position) FROM reactor_subscribers"
LOG_AFTER: Final = (
    "SELECT scope, key, type, old_value, new_value, ops, revision, timestamp "
    "FROM reactor_changes WHERE revision > ? AND revision <= ? ORDER BY revision LIMIT ?"
)
POSITION: Final = "SELECT position FROM reactor_subscribers WHERE name = ?"
SUBSCRIBERS: Final = "SELECT name, position, delivered, failed FROM reactor_subscribers"
SAVE_POSITION: Final = (
    "INSERT INTO reactor_subscribers (name, position, delivered, failed, updated_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET position = excluded.position, "
    "delivered = excluded.delivered, failed = excluded.failed, updated_at = excluded.updated_at"
)
RECORD_FAILURE: Final = (
    "INSERT INTO reactor_failures (name, revision, error, failed_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (name, revision) DO UPDATE SET error = excluded.error, "
    "failed_at = excluded.failed_at"
)
LOCK: Final = "SELECT owner, token, expires_at FROM reactor_locks WHERE name = ?"
SAVE_LOCK: Final = (
    "INSERT INTO reactor_locks (name, owner, token, expires_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
    "expires_at = excluded.expires_at"
)
LOCKS_HELD: Final = "SELECT COUNT(*) FROM reactor_locks WHERE owner IS NOT NULL AND expires_at > ?"
_IN_CHUNK: Final = 500  # keys per IN (...) list, well under SQLite's variable limit
_AUTOCHECKPOINT_PAGES: Final = 10_000

SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL", "memory": "OFF"}


class _RowReads:
    """Reading rows as a write transaction sees them; ``_all`` runs a query."""

    __slots__ = ()

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def fetch_row(self, scope: str, key: str) -> Row | None:
        found = self._all(ROW, (scope, key))
        return Row(*found[0]) if found else None

    def fetch_rows(
        self, scope: str, bounds: tuple[str, str | None] | None
    ) -> list[tuple[str, Row]]:
        sql, params = _ranged(ROWS, scope, bounds)
        return [
            (key, Row(value, expires_at, revision))
            for key, value, expires_at, revision in self._all(sql, params)
        ]

    def fetch_lock(self, name: str) -> LockRow | None:
        found = self._all(LOCK, (name,))
        return LockRow(*found[0]) if found else None

    def fetch_many(self, scope: str, keys: list[str]) -> dict[str, Row]:
        found: dict[str, Row] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _IN_CHUNK):
            chunk = unique[start : start + _IN_CHUNK]
            sql = f"{ROWS} AND key IN ({', '.join('?' * len(chunk))})"
            for key, value, expires_at, revision in self._all(sql, (scope, *chunk)):
                found[key] = Row(value, expires_at, revision)
        return found


class _Statements(_RowReads):
    """The write-path statements, bound to the writer connection.

    Driver errors become reactor errors here, so that the actor can tell a failed
    transaction (which fails its whole batch) from a request that does not apply.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def append_log(self, records: list[ChangeRecord]) -> int:
        try:
            if len(records) == 1:  # execute(), not executemany(): a few microseconds less
                r = records[0]
                cursor = self._conn.execute(
                    LOG, (r.scope, r.key, r.type, r.old_value, r.new_value, r.ops, r.timestamp)
                )
                assert cursor.lastrowid is not None
                return cursor.lastrowid
            self._conn.executemany(
                LOG,
                [
                    (r.scope, r.key, r.type, r.old_value, r.new_value, r.ops, r.timestamp)
                    for r in records
                ],
            )
            # This transaction holds the write lock: its revisions follow one another.
            return int(self._conn.execute(REVISION).fetchall()[0][0]) - len(records) + 1
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def write_rows(
        self, upserts: list[tuple[str, str, str, float | None, int]], deletes: list[tuple[str, str]]
    ) -> None:
        conn = self._conn
        try:
            if len(deletes) == 1:
                conn.execute(DELETE, deletes[0])
            elif deletes:
                conn.executemany(DELETE, deletes)
            if len(upserts) == 1:
                conn.execute(UPSERT, upserts[0])
            elif upserts:
                conn.executemany(UPSERT, upserts)
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def current_revision(self) -> int:
        return int(self._all(REVISION, ())[0][0])

    def changed_since(self, scope: str, revision: int) -> bool:
        if self._all(CHANGED_SINCE, (scope, revision)):
            return True
        # A log compacted past the revision can no longer tell: assume a change.
        return int(self._all(COMPACTED, ())[0][0]) > revision

    def compact(self, upto_revision: int | None, before: float | None) -> int:
        """Drop log records up to a revision and/or older than a time, but none that a
        durable subscriber has yet to acknowledge; remember how far the log is gone."""
        removed = 0
        try:
            conn = self._conn
            slowest = conn.execute(SLOWEST).fetchall()[0][0]
            if upto_revision is not None:
                if slowest is not None:
                    upto_revision = min(upto_revision, slowest)
                removed += conn.execute(COMPACT_UPTO, (upto_revision,)).rowcount
            if before is not None:
                if slowest is not None:
                    removed += conn.execute(
                        COMPACT_BEFORE + " AND revision <= ?", (before, slowest)
                    ).rowcount
                else:
                    removed += conn.execute(COMPACT_BEFORE, (before,)).rowcount
            if removed:
                revision = int(conn.execute(REVISION).fetchall()[0][0])
                gone = int(conn.execute(LAST_REMOVED, (revision + 1,)).fetchall()[0][0])
                conn.execute(SET_COMPACTED, (gone,))
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        return removed

    def save_position(
        self, name: str, position: int, delivered: int, failed: int, now: float
    ) -> None:
        self._all(SAVE_POSITION, (name, position, delivered, failed, now))

    def record_failure(self, name: str, revision: int, error: str, now: float) -> None:
        self._all(RECORD_FAILURE, (name, revision, error, now))

    def save_lock(self, name: str, row: LockRow) -> None:
        self._all(SAVE_LOCK, (name, row.owner, row.token, row.expires_at))


class _Reader(_RowReads):
    """The read statements of a write transaction, for a transaction body: each runs
    on a reader connection, outside any database transaction."""

    __slots__ = ("_store",)

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return self._store._query(sql, params)

    def append_log(self, *_: object) -> int:
        raise AssertionError("a transaction body never writes")

    def write_rows(self, *_: object) -> None:
        raise AssertionError("a transaction body never writes")

    def current_revision(self) -> int:
        return self._store.revision()

    def changed_since(self, *_: object) -> bool:
        raise AssertionError("only a commit checks for changes")

    def compact(self, *_: object) -> int:
        raise AssertionError("a transaction body never compacts")

    def save_position(self, *_: object) -> None:
        raise AssertionError("a transaction body never moves subscribers")

    def record_failure(self, *_: object) -> None:
        raise AssertionError("a transaction body never moves subscribers")

    def save_lock(self, *_: object) -> None:
        raise AssertionError("locks are not part of transactions")


def _ranged(
    sql: str, scope: str, bounds: tuple[str, str | None] | None, *live: float
) -> tuple[str, tuple[Any, ...]]:
    params: tuple[Any, ...] = (scope, *live)
    if bounds is not None:
        low, high = bounds
        sql += RANGE
        params += (low,)
        if high is not None:
            sql += RANGE_END
            params += (high,)
    return sql, params


def translate(exc: sqlite3.Error) -> ReactorError:
    """The reactor error for a driver error (chain it with ``raise ... from exc``)."""
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
        return ClosedError("the database is closed")
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return BusyError(f"the database stayed locked past the busy timeout: {exc}")
    return StorageError(f"the database failed: {exc}")


class SQLiteStore:
    """A SQLite database, as a file (``path``) or in memory (``path=None``)."""

    def __init__(self, path: Path | None, *, durability: str, timeout: float) -> None:
        self.location = str(path) if path is not None else ":memory:"
        self._in_memory = path is None
        self._timeout = timeout
        self._synchronous = SYNCHRONOUS[durability]
        self._closed = False
        self._gate = threading.Lock()
        self._idle: deque[sqlite3.Connection] = deque()
        self._opened: list[Any] = []  # every pool connection handed out, to close them
        self._opened_lock = threading.Lock()
        self._follower: sqlite3.Connection | None = None  # for data_version, one thread only
        if path is not None:
            try:
                _create_private(path)
            except OSError as exc:
                raise StorageError(f"cannot create the database {path}: {exc}") from exc
            url = sa.URL.create("sqlite", database=str(path))
            self._engine = sa.create_engine(
                url,
                poolclass=NullPool,
                connect_args={"check_same_thread": False, "timeout": timeout},
            )
        else:
            self._engine = sa.create_engine(
                "sqlite://",
                poolclass=StaticPool,
                connect_args={"check_same_thread": False},
            )
        sa.event.listen(self._engine, "connect", self._on_connect)
        sa.event.listen(self._engine, "begin", _begin_immediate)
        try:
            migrate(self._engine)
            self._writer = self._connect()
        except sqlite3.Error as exc:
            self.close()
            raise translate(exc) from exc
        except sa.exc.DBAPIError as exc:
            self.close()
            raise translate(exc.orig) from exc  # type: ignore[arg-type]
        except BaseException:
            self.close()
            raise

    # -- connections ---------------------------------------------------------------
    def _on_connect(self, dbapi_conn: sqlite3.Connection, _record: object) -> None:
        # Take control of transactions: the driver's legacy mode does not BEGIN before
        # a SELECT, so a read-then-write would not be atomic. We BEGIN ourselves.
        dbapi_conn.isolation_level = None
        dbapi_conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        if not self._in_memory:
            dbapi_conn.execute("PRAGMA journal_mode = WAL")
            # The sweeper checkpoints the WAL in the background (checkpoint()): a writer
            # only does it itself past a much larger WAL than SQLite's default 1,000 pages.
            dbapi_conn.execute(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT_PAGES}")
        dbapi_conn.execute(f"PRAGMA synchronous = {self._synchronous}")

    def _connect(self) -> sqlite3.Connection:
        proxy = self._engine.raw_connection()
        with self._opened_lock:
            self._opened.append(proxy)
        conn = proxy.driver_connection
        assert isinstance(conn, sqlite3.Connection)
        return conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise ClosedError("the database is closed")
        if self._in_memory:
            # One connection serves everything in memory; the gate keeps a reader out
            # of a write transaction in progress.
            self._enter_gate()
            try:
                yield self._writer
            finally:
                self._gate.release()
            return
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connect()
        try:
            yield conn
        finally:
            self._idle.append(conn)

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        if self._in_memory or self._closed:
            try:
                with self._reading() as conn:
                    return conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise translate(exc) from exc
        # The hot path of every read: _reading() inlined (a generator costs a microsecond).
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connect()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        finally:
            self._idle.append(conn)

    # -- reads ---------------------------------------------------------------------
    def get(self, scope: str, key: str, now: float) -> str | None:
        found = self._query(GET, (scope, key, now))
        return found[0][0] if found else None

    def get_entry(self, scope: str, key: str, now: float) -> tuple[str, float | None] | None:
        found = self._query(GET_ENTRY, (scope, key, now))
        return (found[0][0], found[0][1]) if found else None

    def get_many(self, scope: str, keys: Iterable[str], now: float) -> dict[str, str]:
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start : start + _IN_CHUNK]
            sql = f"{ITEMS} AND key IN ({', '.join('?' * len(chunk))})"
            found.update(self._query(sql, (scope, now, *chunk)))
        return {key: found[key] for key in wanted if key in found}

    def items(self, scope: str, pattern: Pattern, now: float) -> list[tuple[str, str]]:
        sql, params = _ranged(ITEMS, scope, pattern.bounds(), now)
        rows = self._query(sql + " ORDER BY key", params)
        if pattern.matches_all:
            return rows
        return [(key, value) for key, value in rows if pattern.matches(key)]

    def keys(self, scope: str, pattern: Pattern, now: float) -> list[str]:
        sql, params = _ranged(KEYS, scope, pattern.bounds(), now)
        return [
            key for (key,) in self._query(sql + " ORDER BY key", params) if pattern.matches(key)
        ]

    def scopes(self, now: float) -> list[str]:
        return [scope for (scope,) in self._query(SCOPES, (now,))]

    def counts(self, now: float) -> dict[str, int]:
        return dict(self._query(COUNTS, (now,)))

    def expired(self, now: float, limit: int) -> list[tuple[str, str]]:
        return [(scope, key) for scope, key in self._query(EXPIRED, (now, limit))]

    def revision(self) -> int:
        return int(self._query(REVISION, ())[0][0])

    def reader(self) -> _Reader:
        return _Reader(self)

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
            name: (position, delivered, failed)
            for name, position, delivered, failed in self._query(SUBSCRIBERS, ())
        }

    def checkpoint(self) -> None:
        """Copy the WAL back into the database without blocking anyone (PASSIVE)."""
        if not self._in_memory:
            self._query("PRAGMA wal_checkpoint(PASSIVE)", ())

    def data_version(self) -> int:
        """A number that changes when another connection commits (``PRAGMA data_version``)."""
        conn = self._follower
        if conn is None:
            conn = self._follower = self._connect()
        try:
            return int(conn.execute("PRAGMA data_version").fetchall()[0][0])
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def locks_held(self, now: float) -> int:
        return int(self._query(LOCKS_HELD, (now,))[0][0])

    def snapshot(self, scope: str, now: float) -> tuple[list[tuple[str, str]], int]:
        """Every live key-value of ``scope`` and the revision they are current at."""
        try:
            with self._reading() as conn:
                # One read transaction: WAL gives both statements the same snapshot.
                conn.execute("BEGIN")
                try:
                    revision = int(conn.execute(REVISION).fetchall()[0][0])
                    rows = conn.execute(ITEMS + " ORDER BY key", (scope, now)).fetchall()
                finally:
                    conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        return rows, revision

    def size_bytes(self) -> int:
        if self._in_memory:
            pages = self._query("PRAGMA page_count", ())[0][0]
            return int(pages) * int(self._query("PRAGMA page_size", ())[0][0])
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(self.location + suffix).st_size
        return total

    # -- writes --------------------------------------------------------------------
    def write(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        on_commit: Callable[[list[ChangeRecord]], None] | None = None,
    ) -> tuple[T, list[ChangeRecord]]:
        """Run ``work`` in one write transaction and commit; return its result and the
        change records it committed. ``on_commit`` gets those records right after the
        commit, while no other writer of this process can commit: in revision order.

        Raises:
            BusyError: another process held the database past the busy timeout.
            StorageError: the database failed; nothing was committed.
        """
        self._enter_gate()
        try:
            if self._closed:
                raise ClosedError("the database is closed")
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    txn = WriteTxn(_Statements(conn), now)
                    result = work(txn)
                    records = txn.flush()
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise translate(exc) from exc
            if records and on_commit is not None:
                try:
                    on_commit(records)
                except Exception:  # the write stands: it is committed
                    logger.exception("publishing the changes of a commit failed")
            return result, records
        finally:
            self._gate.release()

    def _enter_gate(self) -> None:
        if not self._gate.acquire(timeout=self._timeout):
            raise BusyError(f"this process's writer stayed busy for more than {self._timeout} s")

    def close(self) -> None:
        """Close every connection; later calls raise ``ClosedError``. Idempotent."""
        gated = self._gate.acquire(timeout=self._timeout)
        if not gated:
            logger.warning("closing %s while a write is still running", self.location)
        try:
            self._closed = True
            with self._opened_lock:
                opened, self._opened = self._opened, []
            for proxy in opened:
                with contextlib.suppress(Exception):
                    proxy.close()
            self._idle.clear()
            self._engine.dispose()
        finally:
            if gated:
                self._gate.release()


def _begin_immediate(conn: sa.Connection) -> None:
    # BEGIN IMMEDIATE: a deferred read-then-write transaction can fail with
    # SQLITE_BUSY_SNAPSHOT when another connection commits in between.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _create_private(path: Path) -> None:
    """Create the database file, and its folder, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # SQLite gives the -wal and -shm files the mode of the database file.
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
