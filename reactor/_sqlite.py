"""The SQLite store: a file in WAL mode, or a database in memory.

SQLAlchemy opens every connection (pragmas in its ``connect`` event) and runs the
schema and migrations; the hot statements run on the DBAPI connections it made, since
SQLAlchemy Core costs tens of microseconds a statement over them. The statements both
backends share are in ``_sql``; what only SQLite says is here.

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
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool, StaticPool

from ._schema import migrate
from ._sql import ITEMS, REVISION, SQLStatements, SQLStore
from ._store import ChangeRecord, WriteTxn
from .errors import BusyError, ClosedError, ReactorError, StorageError

__all__ = ["SQLiteStore"]

logger = logging.getLogger("reactor")

T = TypeVar("T")

LOG: Final = (
    "INSERT INTO reactor_changes (scope, key, type, old_value, new_value, ops, timestamp) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_AUTOCHECKPOINT_PAGES: Final = 10_000

SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL", "memory": "OFF"}


class _Statements(SQLStatements):
    """The write-path statements on the writer connection."""

    __slots__ = ("_conn",)

    SET_COMPACTED = "UPDATE reactor_meta SET value = MAX(value, ?) WHERE name = 'compacted'"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def _run(self, sql: str, params: tuple[Any, ...]) -> int:
        try:
            return self._conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        try:
            self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def append_log(self, records: list[ChangeRecord]) -> int:
        # SQLite numbers the records: the integer key is the revision (_schema.changes).
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


def translate(exc: sqlite3.Error) -> ReactorError:
    """The reactor error for a driver error (chain it with ``raise ... from exc``)."""
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
        return ClosedError("the database is closed")
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return BusyError(f"the database stayed locked past the busy timeout: {exc}")
    return StorageError(f"the database failed: {exc}")


class SQLiteStore(SQLStore):
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
        self._seen_version: int | None = None
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

    def checkpoint(self) -> None:
        """Copy the WAL back into the database without blocking anyone (PASSIVE)."""
        if not self._in_memory:
            self._query("PRAGMA wal_checkpoint(PASSIVE)", ())

    def await_commits(self, timeout: float) -> int | None:
        """Wait ``timeout``, then tell whether another connection committed meanwhile
        (``PRAGMA data_version`` changed): SQLite cannot say up to which revision, so a
        sign is ``sys.maxsize``; None when there is none."""
        time.sleep(timeout)
        conn = self._follower
        if conn is None:
            conn = self._follower = self._connect()
        try:
            version = int(conn.execute("PRAGMA data_version").fetchall()[0][0])
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        if version == self._seen_version:
            return None
        self._seen_version = version
        return sys.maxsize

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
