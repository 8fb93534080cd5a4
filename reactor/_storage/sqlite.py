"""The SQLite store: a file in WAL mode, or a database in memory.

Connections to a file are plain ``sqlite3`` ones (``_create_connection``: the pragmas,
and ``mode=rw``). SQLAlchemy runs the schema and migrations over them, and is imported
only to do so: a file whose schema is current opens without it (a tenth of a second of
imports, which a command-line call would spend on nothing). In memory, SQLAlchemy's
one connection serves everything. The hot statements run on the DBAPI connections, since
SQLAlchemy Core costs tens of microseconds a statement over them. The statements both
backends share are in ``sql_statements``; what only SQLite says, in ``sqlite_statements``.

Concurrency, as SQLite allows it: any number of readers, one writer at a time per file.
Readers take an idle connection from a free list (no thread hop, no lock); WAL gives
each statement a snapshot of the last commit. Writers in this process queue on one lock
(``_gate``) and share one connection, so they never meet in SQLite's busy handler,
which sleeps; other processes are waited for by ``busy_timeout``.

The file is checked before anything touches it, and opened read-only without writing a
byte (``sqlite_file``). While open, the store remembers which file it opened: a commit
that finds the path no longer leading to that file (or to its WAL) is not acknowledged
(``_check_file``), since SQLite would go on writing into an unlinked inode that no
other process can see.
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
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from reactor._base.turn import Turn
from reactor.errors import BusyError, ClosedError, ReactorError, ReadOnlyError, StorageError

from . import sqlite_file as files
from .combine import Combiner
from .schema import META_TABLE, SCHEMA_VERSION
from .sql import SQLStore
from .sql_statements import SQLSnapshot
from .sql_text import ITEMS, REVISION
from .sqlite_statements import SQLiteReads, SQLiteStatements, translate

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["SQLiteStore"]

logger = logging.getLogger("reactor")

T = TypeVar("T")

_AUTOCHECKPOINT_PAGES: Final = 10_000

SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL", "memory": "OFF"}


class SQLiteStore(SQLStore):
    """A SQLite database, as a file (``path``) or in memory (``path=None``); ``readonly``:
    a file that this store never writes (see the module's docstring).

    Raises:
        SchemaError: the database comes from a newer reactor.
        ReadOnlyError: read-write, the file cannot be written; read-only, it cannot be
            read without a write first (it does not exist, or needs creating,
            migrating or recovering).
        StorageError: it cannot be opened.
    """

    def __init__(
        self, path: Path | None, *, durability: str, timeout: float, readonly: bool = False
    ) -> None:
        self.location = str(path) if path is not None else ":memory:"
        self._wal_path = self.location + "-wal"
        self.readonly = readonly
        self._in_memory = path is None
        self._timeout = timeout
        self._synchronous = SYNCHRONOUS[durability]
        self._closed = False
        self._gate = Turn()
        # Group commit across scopes (``combine``): SQLite has one writer, so threads
        # writing at once share its transactions rather than queue for its lock.
        self._combiner: Combiner | None = (
            None if readonly else Combiner(self._write_once, timeout, self.reclaim)
        )
        self._idle: deque[sqlite3.Connection] = deque()
        self._opened: list[Any] = []  # every pool connection handed out, to close them
        self._opened_lock = threading.Lock()
        self._follower: sqlite3.Connection | None = None  # for data_version, one thread only
        self._writer: sqlite3.Connection | None = None  # None when read-only
        self._statements: SQLiteStatements | None = None  # the writer's, made once
        # Read-only: the immutable connections, each with the file as it was then (files.file_mark).
        self._snapshots: dict[sqlite3.Connection, tuple[int, ...]] = {}
        self._seen_version: int | None = None
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._wal: tuple[int, int] | None = None  # and of its WAL, and shared memory
        self._shm: tuple[int, int] | None = None
        self._moved = False  # the last commit found the path leading elsewhere
        self._engine: sa.Engine | None = None  # in memory: SQLAlchemy's one connection
        if path is not None:
            self._uri = files.uri(path)
        try:
            if path is None:
                self._open_writer(current=False)
            elif readonly:
                self._check_readable(path)
            else:
                self._open_file(path)
        except BaseException:
            self.close()
            raise

    def _open_file(self, path: Path) -> None:
        """Open the database file ``path`` to write, created if need be, and migrated.

        Raises:
            ReadOnlyError: this process cannot write it (nor make its -wal and -shm).
        """
        try:
            files.create_private(path)
            files.check_writable(path)
            self._open_writer(current=files.probe(path, self._timeout) == SCHEMA_VERSION)
        except ReadOnlyError as exc:
            raise files.unwritable(path, exc) from exc
        # After the writer connected: the connection of _migrate(), if any, was the
        # only one, and SQLite deleted the WAL when it closed.
        self._file = files.identity(self.location)
        self._wal = files.identity(self._wal_path)
        self._shm = files.identity(self.location + "-shm")

    def _open_writer(self, *, current: bool) -> None:
        """Connect the writer; create or migrate the schema unless ``current`` (the
        version ``files.probe`` saw), or unless it is current once the writer can see.

        Raises:
            SchemaError: the database comes from a newer reactor.
            StorageError: the database failed (ReadOnlyError: it cannot be written).
        """
        try:
            if not current:
                self._migrate()
            self._writer = self._connect()
            if current and self._stored_version() != SCHEMA_VERSION:
                self._migrate()  # the file changed since files.probe read it
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from exc

    def _check_readable(self, path: Path) -> None:
        """Check, reading only, that ``path`` holds a reactor database of this version.

        Raises:
            SchemaError: the database comes from a newer reactor.
            ReadOnlyError: it cannot be read without a write first (``check_regular``,
                ``check_readable_version``).
            StorageError: it is not a reactor database, or cannot be read.
        """
        files.check_regular(path)
        self._file = files.identity(self.location)
        version = files.probe(path, self._timeout, self._create_connection)
        self._snapshots.clear()  # the probe's connection, closed
        files.check_readable_version(path, version)

    def _migrate(self) -> None:
        """Create the schema, or migrate it, with SQLAlchemy (imported here). In memory,
        the engine made here stays: its one connection is the database.

        Raises:
            SchemaError: the database comes from a newer reactor.
            StorageError: the database failed (BusyError: it stayed locked).
        """
        import sqlalchemy as sa
        from sqlalchemy.pool import NullPool, StaticPool

        from .schema import migrate

        if self._in_memory:
            engine = self._engine = sa.create_engine(
                "sqlite://",
                poolclass=StaticPool,
                connect_args={"check_same_thread": False},
            )
            sa.event.listen(engine, "connect", self._on_connect)
        else:
            engine = sa.create_engine(
                "sqlite://", poolclass=NullPool, creator=self._create_connection
            )
        sa.event.listen(engine, "begin", _begin_immediate)
        try:
            migrate(engine)
        except sa.exc.DBAPIError as exc:
            raise translate(exc.orig, self.location) from exc  # type: ignore[arg-type]
        finally:
            if engine is not self._engine:
                engine.dispose()

    def _stored_version(self) -> int:
        """The schema version, read in a write transaction on the writer connection, as
        ``migrate()`` reads it: opening waits for another process's write lock (up to
        the timeout), and sees what it committed; 0 if there is none."""
        conn = self._writer
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            found = conn.execute(
                "SELECT name FROM sqlite_master WHERE name = ?", (META_TABLE,)
            ).fetchall()
            rows = conn.execute(files.VERSION).fetchall() if found else []
        finally:
            conn.execute("COMMIT")
        return int(rows[0][0]) if rows else 0

    # -- connections ---------------------------------------------------------------
    def _create_connection(self) -> sqlite3.Connection:
        if self._file is not None and files.identity(self.location) != self._file:
            # Checked before connecting, too: a connection to the file now at the path
            # would read this store's WAL still there, and its close would checkpoint
            # that WAL into the other file (the check after connecting is for a file
            # replaced while connecting).
            self.leave_path()
            raise StorageError(
                f"the database file {self.location} was removed or replaced while open: reopen it"
            )
        if self.readonly:
            conn, mark = files.connect_read_only(self.location, self._timeout)
            if mark is not None:
                self._snapshots[conn] = mark
        else:
            # mode=rw: a connection never creates the file (files.create_private did), so one
            # opened after the file was removed fails instead of starting an empty database.
            conn = sqlite3.connect(
                self._uri, uri=True, check_same_thread=False, timeout=self._timeout
            )
        try:
            self._on_connect(conn, None)
        except BaseException:
            self._snapshots.pop(conn, None)
            conn.close()  # not left to the garbage collector: descriptors may be short
            raise
        if self._file is not None and files.identity(self.location) != self._file:
            # Another file is at the path now: this connection may have opened it, with
            # this store's WAL (a mix of two databases).
            self._snapshots.pop(conn, None)
            conn.close()
            self.leave_path()
            raise StorageError(
                f"the database file {self.location} was removed or replaced while open: reopen it"
            )
        return conn

    def _on_connect(self, dbapi_conn: sqlite3.Connection, _record: object) -> None:
        # Take control of transactions: the driver's legacy mode does not BEGIN before
        # a SELECT, so a read-then-write would not be atomic. We BEGIN ourselves.
        dbapi_conn.isolation_level = None
        dbapi_conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        if self.readonly:
            return  # the other pragmas are for writers (journal_mode would write)
        if not self._in_memory:
            files.use_wal(dbapi_conn, self._timeout)
            # The sweeper checkpoints the WAL in the background (checkpoint()): a writer
            # only does it itself past a much larger WAL than SQLite's default 1,000 pages.
            dbapi_conn.execute(f"PRAGMA wal_autocheckpoint = {_AUTOCHECKPOINT_PAGES}")
        dbapi_conn.execute(f"PRAGMA synchronous = {self._synchronous}")

    def _connect(self) -> sqlite3.Connection:
        """A new connection (pragmas set), closed by ``close()``.

        Raises:
            StorageError: it could not be opened (no file descriptor left, say).
        """
        proxy: Any  # what close() closes
        if self._engine is not None:  # in memory: SQLAlchemy's one connection
            proxy = self._engine.raw_connection()
            conn = proxy.driver_connection
            assert isinstance(conn, sqlite3.Connection)
        else:
            try:
                proxy = conn = self._create_connection()
            except sqlite3.Error as exc:
                raise files.cannot_connect(exc, self.location) from exc
        with self._opened_lock:
            if self._closed:  # close() ran meanwhile: it would never close this one
                proxy.close()
                raise ClosedError("the database is closed")
            self._opened.append(proxy)
        return conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        if self._closed:
            raise ClosedError("the database is closed")
        if self._in_memory:
            # One connection serves everything in memory; the gate keeps a reader out
            # of a write transaction in progress.
            assert self._writer is not None
            self._enter_gate()
            try:
                yield self._writer
            finally:
                self._gate.give_back()
            return
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connect()
        if self._snapshots:
            conn = self._renewed(conn)
        try:
            yield conn
        finally:
            self._idle.append(conn)
            if self._closed:  # close() may have come meanwhile (another thread)
                self._close_idle()  # type: ignore[unreachable]

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        if self._in_memory or self._closed or self._snapshots:
            try:
                with self._reading() as conn:
                    return conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise translate(exc, self.location) from exc
        # The hot path of every read: _reading() inlined (a generator costs a microsecond).
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._connect()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from exc
        finally:
            self._idle.append(conn)
            # close() may have come meanwhile (another thread: mypy cannot know), and
            # left this one to its reader: closing it under a running statement crashes
            # the interpreter.
            if self._closed:
                self._close_idle()  # type: ignore[unreachable]

    _query_often = _query  # nothing prepared apart: a get is one call fewer than SQLStore's

    def _renewed(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """``conn``, or (read-only) a new connection in its place if it is a snapshot
        that another connection has outdated since (see ``files.outdated``).

        Raises:
            StorageError: the new connection could not be opened.
        """
        mark = self._snapshots.get(conn)
        if mark is None or not files.outdated(self.location, mark):
            return conn
        self._retire(conn)
        return self._connect()

    def _retire(self, conn: sqlite3.Connection) -> None:
        """Close a connection this thread holds, off every list."""
        self._snapshots.pop(conn, None)
        with self._opened_lock, contextlib.suppress(ValueError):
            self._opened.remove(conn)
        with contextlib.suppress(Exception):
            conn.close()

    def _close_idle(self) -> None:
        """Close the idle reader connections (each by whoever takes it off the list)."""
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return
            with contextlib.suppress(Exception):
                conn.close()

    def checkpoint(self) -> None:
        """Copy the WAL back into the database without blocking anyone (PASSIVE)."""
        if not self._in_memory and not self.readonly:
            self._query("PRAGMA wal_checkpoint(PASSIVE)", ())

    def await_commits(self, timeout: float) -> int | None:
        """Wait ``timeout``, then tell whether another connection committed meanwhile
        (``PRAGMA data_version`` changed): SQLite cannot say up to which revision, so a
        sign is ``sys.maxsize``; None when there is none."""
        time.sleep(timeout)
        conn = self._follower
        renewed = False
        mark = None if conn is None else self._snapshots.get(conn)
        if conn is not None and mark is not None and files.outdated(self.location, mark):
            self._follower = None
            self._retire(conn)
            conn, renewed = None, True
        if conn is None:
            conn = self._follower = self._connect()
        if conn in self._snapshots:
            # A snapshot's data_version never moves; the file did if it was renewed.
            return sys.maxsize if renewed else None
        try:
            version = int(conn.execute("PRAGMA data_version").fetchall()[0][0])
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from exc
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
            raise translate(exc, self.location) from exc
        return rows, revision

    @contextlib.contextmanager
    def consistent_reads(self) -> Iterator[SQLSnapshot]:
        """Reads in one read transaction: WAL gives every statement the snapshot of
        its first, and writers go on (in memory, writers wait for the block's end)."""
        with self._reading() as conn:
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise translate(exc, self.location) from exc
            try:
                yield SQLiteReads(conn, self.location)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("COMMIT")

    def size_bytes(self) -> int:
        if self._in_memory:
            pages = self._query("PRAGMA page_count", ())[0][0]
            return int(pages) * int(self._query("PRAGMA page_size", ())[0][0])
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(self.location + suffix).st_size
        return total

    # -- writes (the protocol is SQLStore._write_once) -------------------------------
    _driver_error = sqlite3.Error

    def _begin_write(
        self,
        scopes: Collection[str] | None,  # noqa: ARG002 - one lock for all
        reads: Collection[tuple[str, str]],  # noqa: ARG002 - no round trip to save
    ) -> SQLiteStatements:
        """``BEGIN IMMEDIATE`` on the one writer connection: SQLite's one write lock,
        whatever the ``scopes``, from the start (a deferred transaction that reads,
        then writes, fails with ``SQLITE_BUSY_SNAPSHOT`` when another process wrote
        meanwhile)."""
        writer = self._writer
        if writer is None:
            raise ReadOnlyError(
                f"cannot write {self.location}: it is open read-only (readonly=True)"
            )
        statements = self._statements
        if statements is None or statements.connection is not writer:  # made once a writer
            statements = self._statements = SQLiteStatements(writer, self.location)
        if writer.in_transaction:  # a write a Ctrl-C interrupted left it open: undo it
            writer.rollback()
        writer.execute("BEGIN IMMEDIATE")
        if self._moved:
            try:
                self._check_file(committed=False)  # back in place?
            except BaseException:
                statements.abort()
                raise
        return statements

    def _translate(self, exc: Exception) -> ReactorError:
        assert isinstance(exc, sqlite3.Error)
        return translate(exc, self.location)

    def _committed(self) -> None:
        """After the commit, before acknowledging it: an unlink or rename a moment
        before the COMMIT is seen too.

        Raises:
            StorageError: the database file was removed or replaced: the commit, if it
                happened, went into the file reactor opened, no longer at its path.
        """
        if self._file is None:
            return
        # The usual case inline (two stats, nothing more); anything else, at length.
        try:
            found, wal = os.stat(self.location), os.stat(self._wal_path)
        except OSError:
            self._check_file(committed=True)
            return
        if (found.st_dev, found.st_ino) != self._file or (wal.st_dev, wal.st_ino) != self._wal:
            self._check_file(committed=True)

    def _check_file(self, *, committed: bool) -> None:
        """Raise unless the path still leads to the file (and WAL) this store opened.

        ``committed``: called right after a commit (else inside a write transaction).
        The writer still holds the files it opened: at the first sign, a checkpoint
        copies what the WAL holds into the database file it opened. When only the WAL
        is gone, that file is still at the path: the commit stands, and later writes
        fail. When the database file is gone, this store's WAL and shared memory are
        taken off the path (``leave_path``): a file now there would read them.

        Raises:
            StorageError: it was removed, renamed or replaced.
        """
        found = files.identity(self.location)
        wal = files.identity(self._wal_path) if self._wal is not None else None
        if self._wal is None and found == self._file:
            self._wal = wal = files.identity(self._wal_path)  # SQLite made it just now
        if found == self._file and wal == self._wal:
            self._moved = False
            return
        self._moved = True
        if found != self._file:
            if committed:
                self._save_orphaned_wal()  # a renamed file keeps what was acknowledged
            self.leave_path()
            raise StorageError(
                f"the database file {self.location} was removed or replaced while open"
                + (
                    ": this write is not in the database at that path (it went into the "
                    "file reactor opened, which no other process can see); reopen it"
                    if committed
                    else "; nothing was written: reopen it"
                )
            )
        if committed and self._save_orphaned_wal():
            return
        raise StorageError(
            f"the write-ahead log of {self.location} (its -wal file) was removed or "
            "replaced while open; nothing was written: close every handle and reopen it"
        )

    def _save_orphaned_wal(self) -> bool:
        """Checkpoint the WAL the writer holds into the database file; whether all of
        it went."""
        assert self._writer is not None
        try:
            busy, log, done = self._writer.execute("PRAGMA wal_checkpoint(FULL)").fetchall()[0]
        except sqlite3.Error:
            logger.exception("saving the WAL of %s, removed while open, failed", self.location)
            return False
        return bool(busy == 0 and log == done)

    def moved(self) -> bool:
        """Whether the path no longer leads to the database file this store opened."""
        if self._file is None:
            return False
        return files.identity(self.location) != self._file

    def leave_path(self) -> None:
        """Take this store's WAL and shared memory off a path whose database file was
        removed or replaced: SQLite would replay that WAL into whatever database file
        is created or moved there next (it never deletes them itself once the file
        has moved). Nothing when the file is still there, or when read-only (those
        files are not this store's)."""
        if self.readonly or not self.moved():
            return
        for suffix, mine in (("-wal", self._wal), ("-shm", self._shm)):
            if mine is not None and files.identity(self.location + suffix) == mine:
                with contextlib.suppress(OSError):
                    os.unlink(self.location + suffix)
                    logger.warning(
                        "removed %s%s: its database file was removed or replaced while open",
                        self.location,
                        suffix,
                    )

    def _enter_gate(self) -> None:
        if not self._gate.take(self._timeout):
            raise BusyError(f"this process's writer stayed busy for more than {self._timeout} s")

    def _close_all(self, opened: list[Any]) -> None:
        # A reader's connection is closed off the idle list, here or by the reader as it
        # gives it back: never under a statement another thread is running (sqlite3
        # crashes the interpreter then).
        self._close_idle()
        for proxy in opened:
            if self._engine is not None or proxy is self._writer or proxy is self._follower:
                with contextlib.suppress(Exception):
                    proxy.close()
        if self._engine is not None:
            self._engine.dispose()
        self.leave_path()


def _begin_immediate(conn: sa.Connection) -> None:
    # BEGIN IMMEDIATE: a deferred read-then-write transaction can fail with
    # SQLITE_BUSY_SNAPSHOT when another connection commits in between.
    conn.exec_driver_sql("BEGIN IMMEDIATE")
