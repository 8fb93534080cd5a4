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
first pragma of a connection (``journal_mode = WAL``) rewrites the header. While open,
the store remembers which file it opened: a commit that finds the path no longer
leading to that file (or to its WAL) is not acknowledged (``_check_file``), since
SQLite would go on writing into an unlinked inode that no other process can see.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import quote

from ._combine import Combiner
from ._schema import META_TABLE, SCHEMA_VERSION, check_version
from ._sql import ITEMS, REVISION, SQLStatements, SQLStore
from ._store import ChangeRecord, WriteTxn
from .errors import BusyError, ClosedError, ReactorError, StorageError

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["SQLiteStore"]

logger = logging.getLogger("reactor")

T = TypeVar("T")

LOG: Final = (
    "INSERT INTO reactor_changes (scope, key, type, old_value, new_value, ops, timestamp) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_AUTOCHECKPOINT_PAGES: Final = 10_000

SYNCHRONOUS: Final = {"normal": "NORMAL", "full": "FULL", "memory": "OFF"}
_READONLY_ROLLBACK: Final = 776  # SQLITE_READONLY_ROLLBACK: a hot journal, read-only
_VERSION: Final = f"SELECT value FROM {META_TABLE} WHERE name = 'schema_version'"


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
        # No group commit across scopes: a SQLite commit (WAL, no fsync at "normal") is
        # cheap, and handing work between threads costs more under the GIL than it
        # saves: measured, 4 threads on 4 scopes went from 12.6k to 6.9k sets/s with it.
        self._combiner: Combiner | None = None
        self._idle: deque[sqlite3.Connection] = deque()
        self._opened: list[Any] = []  # every pool connection handed out, to close them
        self._opened_lock = threading.Lock()
        self._follower: sqlite3.Connection | None = None  # for data_version, one thread only
        self._seen_version: int | None = None
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._wal: tuple[int, int] | None = None  # and of its WAL, and shared memory
        self._shm: tuple[int, int] | None = None
        self._moved = False  # the last commit found the path leading elsewhere
        self._engine: sa.Engine | None = None  # in memory: SQLAlchemy's one connection
        current = False
        if path is not None:
            _create_private(path)
            current = _probe(path, timeout) == SCHEMA_VERSION
            self._uri = _uri(path)
        try:
            if not current:
                self._migrate()
            self._writer = self._connect()
            if current and self._stored_version() != SCHEMA_VERSION:
                self._migrate()  # the file changed since _probe read it
            if path is not None:
                # After the writer connected: the connection of _migrate(), if any, was
                # the only one, and SQLite deleted the WAL when it closed.
                self._file = _identity(self.location)
                self._wal = _identity(self.location + "-wal")
                self._shm = _identity(self.location + "-shm")
        except sqlite3.Error as exc:
            self.close()
            raise translate(exc) from exc
        except BaseException:
            self.close()
            raise

    def _migrate(self) -> None:
        """Create the schema, or migrate it, with SQLAlchemy (imported here). In memory,
        the engine made here stays: its one connection is the database.

        Raises:
            SchemaError: the database comes from a newer reactor.
            StorageError: the database failed (BusyError: it stayed locked).
        """
        import sqlalchemy as sa
        from sqlalchemy.pool import NullPool, StaticPool

        from ._schema import migrate

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
        # mode=rw: a connection never creates the file (_create_private did), so one
        # opened after the file was removed fails instead of starting an empty database.
        conn = sqlite3.connect(self._uri, uri=True, check_same_thread=False, timeout=self._timeout)
        try:
            self._on_connect(conn, None)
        except BaseException:
            conn.close()  # not left to the garbage collector: descriptors may be short
            raise
        if self._file is not None and _identity(self.location) != self._file:
            # Another file is at the path now: this connection may have opened it, with
            # this store's WAL (a mix of two databases).
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
        if not self._in_memory:
            dbapi_conn.execute("PRAGMA journal_mode = WAL")
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
            if self._closed_since():
                self._close_idle()

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
            if self._closed_since():  # close() left this one to its reader: closing it
                self._close_idle()  # under a running statement crashes the interpreter

    def _closed_since(self) -> bool:
        """Whether the store is closed now (it may have been closed since a check)."""
        return self._closed

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
    def _write_once(
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
            StorageError: the database failed; nothing was committed. Also when the
                database file was removed or replaced: then the commit, if it happened,
                went into the file reactor opened, which is no longer at its path.
        """
        self._enter_gate()
        try:
            if self._closed:
                raise ClosedError("the database is closed")
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if self._moved:
                        self._check_file(committed=False)  # back in place?
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
            if self._file is not None:
                # After the commit, before acknowledging it: an unlink or rename a moment
                # before the COMMIT is seen too.
                self._check_file(committed=True)
            if records and on_commit is not None:
                try:
                    on_commit(records)
                except Exception:  # the write stands: it is committed
                    logger.exception("publishing the changes of a commit failed")
            return result, records
        finally:
            self._gate.release()

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
        has moved). Nothing when the file is still there."""
        if not self.moved():
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
                self._gate.release()


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


def _uri(path: Path) -> str:
    """The SQLite URI of an existing database file, opened read-write, never created."""
    return f"file:{quote(str(path))}?mode=rw"


def _probe(path: Path, timeout: float) -> int | None:
    """Refuse a file that is not a reactor database, or one from a newer reactor;
    return its schema version (0: a new database; None: unknown until a hot journal
    is rolled back).

    It reads through a read-only connection, which never changes the database file
    (a read-write one would rewrite the header to WAL mode, and checkpoint a WAL left
    over into it when it closes). An empty file, or a SQLite database with nothing in
    it, is a new database.

    Raises:
        SchemaError: the database comes from a newer reactor.
        StorageError: it is not a reactor database, or cannot be read.
    """
    try:
        conn = sqlite3.connect(
            f"file:{quote(str(path))}?mode=ro", uri=True, timeout=timeout, isolation_level=None
        )
    except sqlite3.Error as exc:
        raise translate(exc) from exc
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
    finally:
        conn.close()
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
