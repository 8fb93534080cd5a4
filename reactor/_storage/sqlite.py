"""The SQLite store: a file in WAL mode, or a database in memory.

Connections to a file are plain ``sqlite3`` ones (``_create_connection``: the pragmas,
and ``mode=rw``). SQLAlchemy runs the schema and migrations over them, and is imported
only to do so: a file whose schema is current opens without it (a tenth of a second of
imports, which a command-line call would spend on nothing). In memory, SQLAlchemy's
one connection serves everything. The hot statements run on the DBAPI connections, since
SQLAlchemy Core costs tens of microseconds a statement over them. The statements both
backends share are in ``_sql``; what only SQLite says is here.

Concurrency, as SQLite allows it: any number of readers, one writer at a time per file.
Readers take an idle connection from a free list (no thread hop, no lock); WAL gives
each statement a snapshot of the last commit. Writers in this process queue on one lock
(``_gate``) and share one connection, so they never meet in SQLite's busy handler,
which sleeps; other processes are waited for by ``busy_timeout``.

The file is checked before anything touches it (``_probe``): a file that is not a reactor
database, or one from a newer reactor, is refused byte-for-byte untouched, since the
first pragma of a connection (``journal_mode = WAL``) rewrites the header; and with no
file made beside it, since even a ``mode=ro`` connection makes the -wal and -shm files
of a database in WAL mode that no connection has open (``_probing``). While open,
the store remembers which file it opened: a commit that finds the path no longer
leading to that file (or to its WAL) is not acknowledged (``_check_file``), since
SQLite would go on writing into an unlinked inode that no other process can see.

Read-only (``readonly=True``), nothing is ever written: not the database, not its
``-wal`` and ``-shm`` files, which SQLite creates on a first read in WAL mode (and which
a read-only folder forbids). While another connection has the database open, its
``-shm`` exists and a ``mode=ro`` connection shares it, following the commits. When
neither file exists, no connection has the database open and all of it is in the
database file: the connection opens it ``immutable=1`` (no locks, no WAL index), a
snapshot that is replaced as soon as another connection opens the database or the file
changes (``_outdated``), checked before each read.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import quote

from reactor._base.turn import Turn
from reactor.errors import BusyError, ClosedError, ReactorError, ReadOnlyError, StorageError

from .combine import Combiner
from .records import ChangeRecord, RefusedError
from .schema import META_TABLE, SCHEMA_VERSION, check_version
from .sql import SQLStatements, SQLStore
from .sql_text import ITEMS, REVISION, STREAMED_ROWS
from .store import Reads

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["SQLiteStore"]

logger = logging.getLogger("reactor")

T = TypeVar("T")

LOG: Final = (
    "INSERT INTO reactor_changes (scope, key, type, old_value, new_value, ops, timestamp, "
    "version, timer, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_AUTOCHECKPOINT_PAGES: Final = 10_000

SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL", "memory": "OFF"}
_READONLY_ROLLBACK: Final = 776  # SQLITE_READONLY_ROLLBACK: a hot journal, read-only
_READONLY: Final = 8  # SQLITE_READONLY, the primary code of every "cannot write" error
_READONLY_DIRECTORY: Final = 1544  # SQLITE_READONLY_DIRECTORY: no -wal or -shm can be made
# What a mode=ro connection says when it cannot make or use the -shm file (the WAL index):
# SQLITE_CANTOPEN, SQLITE_READONLY_CANTINIT and SQLITE_READONLY_DIRECTORY.
_NO_WAL_INDEX: Final = frozenset({14, 1288, _READONLY_DIRECTORY})
_VERSION: Final = f"SELECT value FROM {META_TABLE} WHERE name = 'schema_version'"


class _Statements(SQLStatements):
    """The write-path statements on the writer connection."""

    __slots__ = ("_conn",)

    SET_COMPACTED = "UPDATE reactor_meta SET value = MAX(value, ?) WHERE name = 'compacted'"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return _fetch_all(self._conn, sql, params)

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
                    LOG,
                    (
                        r.scope,
                        r.key,
                        r.type,
                        r.old_value,
                        r.new_value,
                        r.ops,
                        r.timestamp,
                        r.version,
                        r.timer,
                        r.expires_at,
                    ),
                )
                assert cursor.lastrowid is not None
                return cursor.lastrowid
            self._conn.executemany(
                LOG,
                [
                    (
                        r.scope,
                        r.key,
                        r.type,
                        r.old_value,
                        r.new_value,
                        r.ops,
                        r.timestamp,
                        r.version,
                        r.timer,
                        r.expires_at,
                    )
                    for r in records
                ],
            )
            # This transaction holds the write lock: its revisions follow one another.
            return int(self._conn.execute(REVISION).fetchall()[0][0]) - len(records) + 1
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def commit(self, records: list[ChangeRecord]) -> None:  # noqa: ARG002 - none to send
        self._conn.execute("COMMIT")

    def abort(self, interrupted: bool = False) -> None:  # noqa: ARG002 - rolled back alike
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


def use_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Put the database of ``conn`` in WAL mode, retrying while another connection
    holds it up, for up to ``timeout`` seconds.

    SQLite answers "database is locked" at once, without its busy handler, when two
    connections switch a new file to WAL together (each holds the read lock the
    other's switch waits for), so the busy timeout alone does not cover it.

    Raises:
        sqlite3.OperationalError: still locked after ``timeout``, or another failure.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def translate(exc: sqlite3.Error) -> ReactorError:
    """The reactor error for a driver error (chain it with ``raise ... from exc``)."""
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
        return ClosedError("the database is closed")
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return BusyError(f"the database stayed locked past the busy timeout: {exc}")
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _READONLY:
        return ReadOnlyError(f"the database cannot be written: {exc}")
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError):
        # A constraint or trigger (SQLITE_CONSTRAINT), a value too big (SQLITE_TOOBIG).
        return RefusedError(f"the database refused the write: {exc}")
    return StorageError(f"the database failed: {exc}")


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
        self.readonly = readonly
        self._in_memory = path is None
        self._timeout = timeout
        self._synchronous = SYNCHRONOUS[durability]
        self._closed = False
        self._gate = Turn()
        # No group commit across scopes: a SQLite commit (WAL, no fsync at "normal") is
        # cheap, and handing work between threads costs more under the GIL than it
        # saves: measured, 4 threads on 4 scopes went from 12.6k to 6.9k sets/s with it.
        self._combiner: Combiner | None = None
        self._idle: deque[sqlite3.Connection] = deque()
        self._opened: list[Any] = []  # every pool connection handed out, to close them
        self._opened_lock = threading.Lock()
        self._follower: sqlite3.Connection | None = None  # for data_version, one thread only
        self._writer: sqlite3.Connection | None = None  # None when read-only
        # Read-only: the immutable connections, each with the file as it was then (_mark).
        self._snapshots: dict[sqlite3.Connection, tuple[int, ...]] = {}
        self._seen_version: int | None = None
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._wal: tuple[int, int] | None = None  # and of its WAL, and shared memory
        self._shm: tuple[int, int] | None = None
        self._moved = False  # the last commit found the path leading elsewhere
        self._engine: sa.Engine | None = None  # in memory: SQLAlchemy's one connection
        if path is not None:
            self._uri = _uri(path)
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
            _create_private(path)
            _check_writable(path)
            self._open_writer(current=_probe(path, self._timeout) == SCHEMA_VERSION)
        except ReadOnlyError as exc:
            raise _unwritable(path, exc) from exc
        # After the writer connected: the connection of _migrate(), if any, was the
        # only one, and SQLite deleted the WAL when it closed.
        self._file = _identity(self.location)
        self._wal = _identity(self.location + "-wal")
        self._shm = _identity(self.location + "-shm")

    def _open_writer(self, *, current: bool) -> None:
        """Connect the writer; create or migrate the schema unless ``current`` (the
        version ``_probe`` saw), or unless it is current once the writer can see.

        Raises:
            SchemaError: the database comes from a newer reactor.
            StorageError: the database failed (ReadOnlyError: it cannot be written).
        """
        try:
            if not current:
                self._migrate()
            self._writer = self._connect()
            if current and self._stored_version() != SCHEMA_VERSION:
                self._migrate()  # the file changed since _probe read it
        except sqlite3.Error as exc:
            raise translate(exc) from exc

    def _check_readable(self, path: Path) -> None:
        """Check, reading only, that ``path`` holds a reactor database of this version.

        Raises:
            SchemaError: the database comes from a newer reactor.
            ReadOnlyError: it cannot be read without a write first: there is no file, or
                it holds no reactor database yet, or one that needs migrating, or a hot
                journal to roll back.
            StorageError: it is not a reactor database, or cannot be read.
        """
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise ReadOnlyError(
                f"no database at {path}: a read-only open does not create one"
            ) from None
        except OSError as exc:
            raise StorageError(f"cannot open the database {path}: {exc}") from exc
        if not stat.S_ISREG(mode):
            raise StorageError(f"{path} is not a database file (nor a regular file)")
        self._file = _identity(self.location)
        version = _probe(path, self._timeout, self._create_connection)
        self._snapshots.clear()  # the probe's connection, closed
        if version == SCHEMA_VERSION:
            return
        hint = "open it read-write once (reactor.open, or a writing command) first"
        if version is None:
            raise ReadOnlyError(
                f"{path} has a hot journal to roll back (a write that did not finish), "
                f"which writes: {hint}"
            )
        if version == 0:
            raise ReadOnlyError(
                f"{path} holds no reactor database yet: a read-only open does not create one"
            )
        raise ReadOnlyError(
            f"{path} was written by an older reactor (schema version {version}, this one "
            f"reads {SCHEMA_VERSION}); migrating it writes: {hint}"
        )

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
            raise translate(exc.orig) from exc  # type: ignore[arg-type]
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
            rows = conn.execute(_VERSION).fetchall() if found else []
        finally:
            conn.execute("COMMIT")
        return int(rows[0][0]) if rows else 0

    # -- connections ---------------------------------------------------------------
    def _create_connection(self) -> sqlite3.Connection:
        if self._file is not None and _identity(self.location) != self._file:
            # Checked before connecting, too: a connection to the file now at the path
            # would read this store's WAL still there, and its close would checkpoint
            # that WAL into the other file (the check after connecting is for a file
            # replaced while connecting).
            self.leave_path()
            raise StorageError(
                f"the database file {self.location} was removed or replaced while open: reopen it"
            )
        if self.readonly:
            conn, mark = _connect_read_only(self.location, self._timeout)
            if mark is not None:
                self._snapshots[conn] = mark
        else:
            # mode=rw: a connection never creates the file (_create_private did), so one
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
        if self._file is not None and _identity(self.location) != self._file:
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
            use_wal(dbapi_conn, self._timeout)
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
                raise _cannot_connect(exc) from exc
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
            if self._closed_since():
                self._close_idle()

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        if self._in_memory or self._closed or self._snapshots:
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
            if self._closed_since():  # close() left this one to its reader: closing it
                self._close_idle()  # under a running statement crashes the interpreter

    def _closed_since(self) -> bool:
        """Whether the store is closed now (it may have been closed since a check)."""
        return self._closed

    def _renewed(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """``conn``, or (read-only) a new connection in its place if it is a snapshot
        that another connection has outdated since (see ``_outdated``).

        Raises:
            StorageError: the new connection could not be opened.
        """
        mark = self._snapshots.get(conn)
        if mark is None or not _outdated(self.location, mark):
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
        if conn is not None and mark is not None and _outdated(self.location, mark):
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

    @contextlib.contextmanager
    def consistent_reads(self) -> Iterator[Reads]:
        """Reads in one read transaction: WAL gives every statement the snapshot of
        its first, and writers go on (in memory, writers wait for the block's end)."""
        with self._reading() as conn:
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                raise translate(exc) from exc
            try:
                yield _Reads(conn)
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
    ) -> _Statements:
        """``BEGIN IMMEDIATE`` on the one writer connection: SQLite's one write lock,
        whatever the ``scopes``, from the start (a deferred transaction that reads,
        then writes, fails with ``SQLITE_BUSY_SNAPSHOT`` when another process wrote
        meanwhile)."""
        writer = self._writer
        if writer is None:
            raise ReadOnlyError(
                f"cannot write {self.location}: it is open read-only (readonly=True)"
            )
        statements = _Statements(writer)
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
        return translate(exc)

    def _committed(self) -> None:
        """After the commit, before acknowledging it: an unlink or rename a moment
        before the COMMIT is seen too.

        Raises:
            StorageError: the database file was removed or replaced: the commit, if it
                happened, went into the file reactor opened, no longer at its path.
        """
        if self._file is not None:
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
        found = _identity(self.location)
        wal = _identity(self.location + "-wal") if self._wal is not None else None
        if self._wal is None and found == self._file:
            self._wal = wal = _identity(self.location + "-wal")  # SQLite made it just now
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
        return _identity(self.location) != self._file

    def leave_path(self) -> None:
        """Take this store's WAL and shared memory off a path whose database file was
        removed or replaced: SQLite would replay that WAL into whatever database file
        is created or moved there next (it never deletes them itself once the file
        has moved). Nothing when the file is still there, or when read-only (those
        files are not this store's)."""
        if self.readonly or not self.moved():
            return
        for suffix, mine in (("-wal", self._wal), ("-shm", self._shm)):
            if mine is not None and _identity(self.location + suffix) == mine:
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

    def close(self) -> None:
        """Close every connection; later calls raise ``ClosedError``. Idempotent."""
        gated = self._gate.take(self._timeout)
        if not gated:
            logger.warning("closing %s while a write is still running", self.location)
        try:
            self._closed = True
            with self._opened_lock:
                opened, self._opened = self._opened, []
            # A reader's connection is closed off the idle list, here or by the reader
            # as it gives it back: never under a statement another thread is running
            # (sqlite3 crashes the interpreter then).
            self._close_idle()
            for proxy in opened:
                if self._engine is not None or proxy is self._writer or proxy is self._follower:
                    with contextlib.suppress(Exception):
                        proxy.close()
            if self._engine is not None:
                self._engine.dispose()
            self.leave_path()
        finally:
            if gated:
                self._gate.give_back()


def _cannot_connect(exc: sqlite3.Error) -> ReactorError:
    """The error for a connection SQLite could not open; it says "unable to open
    database file" whatever the reason, so the commonest one is named when it holds."""
    error = translate(exc)
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as probe:
        if probe.errno in (errno.EMFILE, errno.ENFILE):
            return StorageError(f"{error}: no file descriptor left ({probe.strerror})")
    else:
        os.close(fd)
    return error


def _begin_immediate(conn: sa.Connection) -> None:
    # BEGIN IMMEDIATE: a deferred read-then-write transaction can fail with
    # SQLITE_BUSY_SNAPSHOT when another connection commits in between.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _create_private(path: Path) -> None:
    """Create the database file, and its folder, readable by its owner only.

    Raises:
        StorageError: it cannot be created, or what is there is not a regular file.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # O_EXCL: a file that exists is never opened here, since closing a
            # descriptor drops the POSIX locks SQLite holds on that file in this process
            # (another engine of this process may have it open while it closes).
            # SQLite gives the -wal and -shm files the mode of the database file.
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            if path.is_symlink() and not path.exists():  # a link to a file to create
                fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
                os.close(fd)
        else:
            os.close(fd)
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise StorageError(f"cannot create the database {path}: {exc}") from exc
    if not stat.S_ISREG(mode):
        raise StorageError(f"{path} is not a database file (nor a regular file)")


def _check_writable(path: Path) -> None:
    """Refuse, before SQLite opens it, a database file this process may not write:
    SQLite would open it read-only instead, and make the -wal and -shm files beside it,
    owned by this user, in the way of the file's owner.

    Raises:
        ReadOnlyError: the file is not writable by this process.
    """
    effective = os.access in os.supports_effective_ids
    if not os.access(path, os.W_OK, effective_ids=effective):
        raise ReadOnlyError("permission denied")


def _unwritable(path: Path, exc: ReactorError) -> ReadOnlyError:
    """The error for a read-write open of a database this process cannot write."""
    cause = exc.__cause__
    if getattr(cause, "sqlite_errorcode", None) == _READONLY_DIRECTORY:
        reason = "its folder is not writable, and SQLite makes the -wal and -shm files there"
    else:
        reason = str(exc).removeprefix("the database cannot be written: ")
    return ReadOnlyError(
        f"cannot write the database {path} ({reason}); to read it, open it with "
        "readonly=True (as the command line's reading commands do)"
    )


def _connect_read_only(
    path: str, timeout: float
) -> tuple[sqlite3.Connection, tuple[int, ...] | None]:
    """A connection that reads ``path`` and writes nothing, not even a -wal or -shm
    file; with the file's ``_mark`` when it is an immutable snapshot (see the module's
    docstring).

    Raises:
        ReadOnlyError: the WAL holds commits that only a writer can recover (its -shm is
            gone, and cannot be made here).
        sqlite3.Error: it could not be opened.
    """
    uri = f"file:{quote(path)}?mode=ro"
    if os.path.exists(path + "-shm") or os.path.exists(path + "-wal"):
        conn = sqlite3.connect(
            uri, uri=True, check_same_thread=False, timeout=timeout, isolation_level=None
        )
        try:
            conn.execute("PRAGMA schema_version").fetchall()  # opens the WAL index
        except sqlite3.Error as exc:
            conn.close()
            if getattr(exc, "sqlite_errorcode", None) not in _NO_WAL_INDEX:
                raise
            with contextlib.suppress(OSError):
                if os.stat(path + "-wal").st_size > 0:
                    raise ReadOnlyError(
                        f"the write-ahead log of {path} holds commits that only a read-write "
                        "open can recover (its -shm file is missing and cannot be made here)"
                    ) from exc
        else:
            return conn, None
    # Marked before connecting: a change in between outdates the snapshot at once.
    mark = _mark(path)
    conn = sqlite3.connect(
        uri + "&immutable=1",
        uri=True,
        check_same_thread=False,
        timeout=timeout,
        isolation_level=None,
    )
    return conn, mark


def _mark(path: str) -> tuple[int, ...]:
    """What tells a change of the file at ``path``: a checkpoint into it, or another
    file in its place. Empty when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return ()
    return found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns


def _outdated(path: str, mark: tuple[int, ...]) -> bool:
    """Whether an immutable snapshot of ``path`` taken at ``mark`` may no longer read
    what is committed: another connection opened the database (it made the -shm or
    -wal file), or the file changed."""
    return os.path.exists(path + "-shm") or os.path.exists(path + "-wal") or _mark(path) != mark


def _uri(path: Path) -> str:
    """The SQLite URI of an existing database file, opened read-write, never created."""
    return f"file:{quote(str(path))}?mode=rw"


def _probe(
    path: Path, timeout: float, connect: Callable[[], sqlite3.Connection] | None = None
) -> int | None:
    """Refuse a file that is not a reactor database, or one from a newer reactor;
    return its schema version (0: a new database; None: unknown until a hot journal
    is rolled back).

    It reads through a connection that writes nothing, neither the database file (a
    read-write one would rewrite the header to WAL mode, and checkpoint a WAL left
    over into it when it closes) nor files beside it: ``_probing``'s, or what
    ``connect`` makes. An empty file, or a SQLite database with nothing in it, is a
    new database.

    Raises:
        SchemaError: the database comes from a newer reactor.
        StorageError: it is not a reactor database, or cannot be read.
    """
    location = str(path)
    while True:
        mark: tuple[int, ...] | None = None
        try:
            if connect is not None:
                conn = connect()
            else:
                conn, mark = _probing(location, timeout)
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        try:
            version = _read_version(path, conn)
        except ReactorError:
            if mark is None or not _opened_since(location, mark):
                raise
            continue  # what it read may be torn: read again, as the other connection does
        finally:
            conn.close()
        if mark is None or not _opened_since(location, mark):
            return version


def _probing(path: str, timeout: float) -> tuple[sqlite3.Connection, tuple[int, ...] | None]:
    """A connection that reads ``path`` once and creates nothing beside it; with the
    file's ``_mark`` when it reads the file alone, ``immutable=1``.

    A ``mode=ro`` connection to a database in WAL mode makes its -wal and -shm files
    when they are missing, and may not delete them when it closes: a database refused
    would be left with two new files. With no -wal file, every commit is in the
    database file and no connection has the database open: it is read alone, with no
    lock and no WAL index (``_probe`` reads again if a connection opened it
    meanwhile). A database in rollback mode (or a file that is none) is read
    ``mode=ro``, which makes no file, and which sees a hot journal; so is a database
    whose WAL is there, which it shares (it makes the -shm file only if that one is
    gone alone).
    """
    uri = f"file:{quote(path)}?mode=ro"
    mark = None
    if _in_wal_mode(path) and not os.path.exists(path + "-wal"):
        mark = _mark(path)  # before connecting: a change in between is seen
        uri += "&immutable=1"
    return sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None), mark


def _in_wal_mode(path: str) -> bool:
    """Whether the header of the SQLite database at ``path`` says WAL mode (its read
    and write versions are 2)."""
    try:
        with open(path, "rb") as file:
            header = file.read(20)
    except OSError:
        return False
    return header[:16] == b"SQLite format 3\0" and header[18:20] == b"\x02\x02"


def _opened_since(path: str, mark: tuple[int, ...]) -> bool:
    """Whether a connection may have opened the database at ``path`` (it made the WAL)
    or changed the file since ``mark``: an immutable read of it may be torn."""
    return os.path.exists(path + "-wal") or _mark(path) != mark


def _read_version(path: Path, conn: sqlite3.Connection) -> int | None:
    """``_probe``'s reading, on ``conn``."""
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        marks = (
            conn.execute("PRAGMA user_version").fetchall()[0][0]
            or conn.execute("PRAGMA application_id").fetchall()[0][0]
        )
        if not tables and not marks:
            return 0  # new
        found = []
        if META_TABLE in tables:
            found = conn.execute(_VERSION).fetchall()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) == _READONLY_ROLLBACK:
            return None  # a hot journal to roll back first: migrate() will see what it holds
        raise translate(exc) from exc
    if not found or type(found[0][0]) is not int:
        shown = ", ".join(sorted(tables)[:5]) or "no table"
        raise StorageError(f"{path} is not a reactor database ({shown}); it was left untouched")
    version: int = found[0][0]
    check_version(version)
    return version


def _identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at ``path``; None if there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class _Reads:
    """``Reads`` on a SQLite connection, in the read transaction it is in."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return _fetch_all(self._conn, sql, params)

    def each(self, sql: str, params: tuple[Any, ...]) -> Iterator[Any]:
        try:
            cursor = self._conn.execute(sql, params)
            while rows := cursor.fetchmany(STREAMED_ROWS):
                yield from rows
        except sqlite3.Error as exc:
            raise translate(exc) from exc


def _fetch_all(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """The rows of ``sql`` on ``conn``; its errors as reactor's."""
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.Error as exc:
        raise translate(exc) from exc
