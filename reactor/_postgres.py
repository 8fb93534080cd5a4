"""The PostgreSQL store: one database (schema) shared by processes on several hosts.

SQLAlchemy (with psycopg 3) opens every connection and runs the schema and migrations;
the hot statements run on the psycopg connections it made, in autocommit mode, with
transactions begun and committed here. The statements both backends share are in
``_sql`` (``?`` placeholders, turned into psycopg's ``%s`` once per statement).

Writers serialize on one transaction-scoped advisory lock per reactor database (the key
is derived from the schema's name), taken by every write transaction as it begins and
released by PostgreSQL when it commits or rolls back — also when its client dies. It
plays the part of SQLite's write lock, for the same reasons: a read-then-write of a
scope (``increment``, update ops, a transaction's commit check) sees every write
committed before it, so no update is lost across processes and hosts; and revisions
are given in commit order, so whoever reads the change log after revision N never
finds N+2 committed before N+1. Row locks would serialize writes to one key, but not
the numbering of the log across keys.

Other processes learn of a commit from a notification (``NOTIFY``, sent in the
committing transaction, so only if it commits) that carries only the last revision
committed; a listener reads the change log from the last revision it handed on, so a
notification lost with a connection costs nothing: after reconnecting, the listener
catches up from the log.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from ._combine import Combiner
from ._schema import migrate
from ._sql import DELETE, ITEMS, REVISION, UPSERT, SQLStatements, SQLStore
from ._store import ChangeRecord, WriteTxn
from .errors import BusyError, ClosedError, OutcomeUnknownError, ReactorError, StorageError

try:
    import psycopg
    import psycopg.errors
except ImportError:  # pragma: no cover - exercised only without the extra installed
    psycopg = None  # type: ignore[assignment]

__all__ = ["PostgresStore"]

logger = logging.getLogger("reactor")

T = TypeVar("T")

LOG: Final = (
    "INSERT INTO reactor_changes "
    "(revision, scope, key, type, old_value, new_value, ops, timestamp) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
SIZE: Final = (
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
    "AND c.relkind = 'r' AND c.relname IN ('reactor_meta', 'reactor_kv', 'reactor_changes', "
    "'reactor_locks', 'reactor_subscribers', 'reactor_failures')"
)
MIGRATION_LOCK: Final = int.from_bytes(b"reactor", "big")  # one advisory lock key
SYNCHRONOUS_COMMIT: Final = {"normal": "on", "full": "on", "memory": "off"}

_converted: dict[str, str] = {}


def _pg(sql: str) -> str:
    """``sql`` with psycopg's placeholders (our statements hold no other ``?`` or ``%``)."""
    found = _converted.get(sql)
    if found is None:
        found = _converted[sql] = sql.replace("?", "%s")
    return found


def is_postgres_url(url: sa.URL) -> bool:
    return url.get_backend_name() == "postgresql"


def normalize_url(target: str) -> sa.URL:
    """A SQLAlchemy URL for ``target`` that uses psycopg 3.

    Raises:
        InvalidArgumentError: another driver is named, or psycopg is not installed.
    """
    from .errors import InvalidArgumentError

    try:
        url = sa.make_url(target)
    except (sa.exc.ArgumentError, ValueError) as exc:  # ValueError: a malformed host
        raise InvalidArgumentError(f"not a database URL: {exc}") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    elif url.drivername != "postgresql+psycopg":
        raise InvalidArgumentError(
            f"reactor talks to PostgreSQL through psycopg 3: use postgresql+psycopg://, "
            f"not {url.drivername}://"
        )
    if psycopg is None:
        raise InvalidArgumentError("PostgreSQL needs psycopg 3: pip install 'reactor[postgresql]'")
    return url


def translate(exc: Exception) -> ReactorError:
    """The reactor error for a psycopg error (chain it with ``raise ... from exc``)."""
    if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
        return BusyError(f"the database stayed locked past the timeout: {exc}")
    return StorageError(f"the database failed: {exc}")


class _Statements(SQLStatements):
    """The write-path statements on the writer connection, in its transaction.

    The writes of a flush (log records, rows) are held back and sent with the commit,
    in one round trip (``finish``); revisions follow the largest one when the
    transaction began (it holds the write lock, and compaction keeps the newest record).
    """

    __slots__ = ("_conn", "_next", "_queued")

    SET_COMPACTED = "UPDATE reactor_meta SET value = GREATEST(value, ?) WHERE name = 'compacted'"

    def __init__(self, conn: psycopg.Connection[Any], last_revision: int) -> None:
        self._conn = conn
        self._next = last_revision + 1
        self._queued: list[tuple[str, list[tuple[Any, ...]]]] = []

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        try:
            return self._conn.execute(_pg(sql), params).fetchall()
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def _run(self, sql: str, params: tuple[Any, ...]) -> int:
        try:
            return self._conn.execute(_pg(sql), params).rowcount
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self._queued.append((_pg(sql), rows))

    def write_rows(
        self, upserts: list[tuple[str, str, str, float | None, int]], deletes: list[tuple[str, str]]
    ) -> None:
        if deletes:
            self._many(DELETE, deletes)
        if upserts:
            self._many(UPSERT, upserts)

    def current_revision(self) -> int:
        return self._next - 1

    def append_log(self, records: list[ChangeRecord]) -> int:
        first = self._next
        self._next += len(records)
        self._queued.append(
            (
                LOG,
                [
                    (
                        first + n,
                        r.scope,
                        r.key,
                        r.type,
                        r.old_value,
                        r.new_value,
                        r.ops,
                        r.timestamp,
                    )
                    for n, r in enumerate(records)
                ],
            )
        )
        return first

    def finish(self, notify: str | None) -> None:
        """Send what is held back, the notification and the commit, in one round trip."""
        conn = self._conn
        with conn.pipeline(), conn.cursor() as cursor:
            for sql, rows in self._queued:
                cursor.executemany(sql, rows)
            if notify is not None:
                cursor.execute(notify)
            cursor.execute("COMMIT")


class PostgresStore(SQLStore):
    """A reactor database in a PostgreSQL schema (the first of the ``search_path``)."""

    def __init__(self, url: sa.URL, *, durability: str, timeout: float) -> None:
        self.location = url.render_as_string(hide_password=True)
        self._timeout = timeout
        self._synchronous_commit = SYNCHRONOUS_COMMIT[durability]
        self._closed = False
        self._gate = threading.Lock()
        # Group commit across scopes: a commit is a round trip and a WAL flush, and the
        # database's write lock is held through it; threads writing together share it
        # (measured, 4 threads on 4 scopes: 0.99x one thread without, 1.72x with).
        self._combiner: Combiner | None = Combiner(self._write_once, timeout)
        self._idle: deque[psycopg.Connection[Any]] = deque()
        self._opened: list[Any] = []  # every connection handed out, to close them
        self._opened_lock = threading.Lock()
        self._listener: psycopg.Connection[Any] | None = None  # the follower thread's own
        self._engine = sa.create_engine(url, poolclass=NullPool)
        sa.event.listen(self._engine, "connect", self._on_connect)
        sa.event.listen(self._engine, "begin", _lock_migrations)
        self._writer: psycopg.Connection[Any] | None = None
        try:
            migrate(self._engine)
            self._writer = self._connect()
            schema, database = self._writer.execute(
                "SELECT current_schema(), current_database()"
            ).fetchall()[0]
        except psycopg.Error as exc:
            self.close()
            raise translate(exc) from exc
        except sa.exc.DBAPIError as exc:
            self.close()
            raise StorageError(f"cannot open {self.location}: {exc.orig}") from exc
        except BaseException:
            self.close()
            raise
        digest = hashlib.blake2b(f"{database}/{schema}".encode(), digest_size=8).digest()
        # The advisory lock key and the notification channel of this reactor database.
        self._lock_key = int.from_bytes(digest, "big", signed=True)
        self._channel = f"reactor_{digest.hex()}"
        self._begin = f"BEGIN; SELECT pg_advisory_xact_lock({self._lock_key}); {REVISION}"

    # -- connections ---------------------------------------------------------------
    def _on_connect(self, dbapi_conn: Any, _record: object) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute(f"SET synchronous_commit = {self._synchronous_commit}")
            # How long a writer waits for another's advisory lock (then BusyError).
            cursor.execute(f"SET lock_timeout = {int(self._timeout * 1000)}")
        dbapi_conn.commit()

    def _connect(self) -> psycopg.Connection[Any]:
        """A new connection of reactor's own.

        Raises:
            StorageError: the server cannot be reached, or this process is out of file
                descriptors.
            ClosedError: the store is closed (or closed meanwhile).
        """
        if self._closed:
            raise ClosedError("the database is closed")
        try:
            proxy = self._engine.raw_connection()
        except sa.exc.DBAPIError as exc:
            raise StorageError(f"cannot connect to {self.location}: {exc.orig}") from exc
        except (psycopg.Error, OSError) as exc:
            raise StorageError(f"cannot connect to {self.location}: {exc}") from exc
        with self._opened_lock:
            kept = self._keep(proxy)
        if not kept:  # close() ran meanwhile: it would never close this one
            with contextlib.suppress(Exception):
                proxy.close()
            raise ClosedError("the database is closed")
        conn = proxy.driver_connection
        assert isinstance(conn, psycopg.Connection)
        conn.autocommit = True  # transactions are begun and committed here
        # No server-side prepared statements: a pipeline that fails part-way leaves
        # psycopg believing in statements the server never prepared.
        conn.prepare_threshold = None
        return conn

    def _keep(self, proxy: Any) -> bool:
        """Remember ``proxy`` to close it with the store, unless the store is closed."""
        if self._closed:
            return False
        self._opened.append(proxy)
        return True

    def _discard(self, conn: psycopg.Connection[Any]) -> None:
        with contextlib.suppress(psycopg.Error):
            conn.close()

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        statement = _pg(sql)
        return self._reading(lambda conn: conn.execute(statement, params).fetchall())

    def _reading(self, read: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``read`` on an idle reader connection (a new one if none is idle)."""
        if self._closed:
            raise ClosedError("the database is closed")
        for attempt in (1, 2):
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = self._connect()
            try:
                result = read(conn)
            except psycopg.OperationalError as exc:
                # The server dropped the connection (restarted, or killed it): the idle
                # ones are likely gone too. A read may try once more, on a new one.
                self._discard(conn)
                if attempt == 2 or not conn.closed:
                    raise translate(exc) from exc
                while self._idle:
                    self._discard(self._idle.pop())
                continue
            except psycopg.Error as exc:
                self._abandon(conn)
                if not conn.closed:
                    self._idle.append(conn)
                raise translate(exc) from exc
            self._idle.append(conn)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    # -- what only this backend says ------------------------------------------------
    def checkpoint(self) -> None:
        """PostgreSQL checkpoints on its own."""

    def size_bytes(self) -> int:
        return int(self._query(SIZE, ())[0][0])

    def snapshot(self, scope: str, now: float) -> tuple[list[tuple[str, str]], int]:
        """Every live key-value of ``scope`` and the revision they are current at."""

        def read(conn: psycopg.Connection[Any]) -> tuple[list[tuple[str, str]], int]:
            # One REPEATABLE READ transaction: both statements see the same snapshot.
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            revision = int(conn.execute(REVISION).fetchall()[0][0])
            rows = conn.execute(_pg(ITEMS) + " ORDER BY key", (scope, now)).fetchall()
            conn.execute("COMMIT")
            return rows, revision

        return self._reading(read)

    def await_commits(self, timeout: float) -> int | None:
        """Wait at most ``timeout`` for a notification of another connection's commit;
        return the revision it announces (``sys.maxsize`` after (re)connecting the
        listener: what was missed meanwhile is read from the log)."""
        conn = self._listener
        if conn is None or conn.closed:
            try:
                conn = self._connect()
                conn.execute(f"LISTEN {self._channel}")
            except ClosedError:
                raise
            except (psycopg.Error, StorageError) as exc:
                logger.warning("listening to %s failed (%s); trying again", self.location, exc)
                threading.Event().wait(max(timeout, 0.5))
                return None
            self._listener = conn
            return sys.maxsize
        try:
            for note in conn.notifies(timeout=timeout, stop_after=1):
                return int(note.payload) if note.payload.isdigit() else sys.maxsize
        except psycopg.Error as exc:
            if self._closed:
                raise ClosedError("the database is closed") from exc
            logger.warning("the listener of %s lost its connection: %s", self.location, exc)
            self._discard(conn)
            self._listener = None
        return None

    # -- writes --------------------------------------------------------------------
    def _write_once(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        on_commit: Callable[[list[ChangeRecord]], None] | None = None,
    ) -> tuple[T, list[ChangeRecord]]:
        """Run ``work`` in one write transaction and commit; return its result and the
        change records it committed (see ``SQLiteStore.write``).

        Raises:
            BusyError: another process held the write lock past the timeout.
            StorageError: the database failed; nothing was committed (or, if the
                connection was lost during the commit itself, it cannot be known).
        """
        if not self._gate.acquire(timeout=self._timeout):
            raise BusyError(f"this process's writer stayed busy for more than {self._timeout} s")
        try:
            conn, last_revision = self._begin_writing()
            try:
                try:
                    statements = _Statements(conn, last_revision)
                    txn = WriteTxn(statements, now)
                    result = work(txn)
                    records = txn.flush()
                    # NOTIFY is sent at commit, and only if it commits.
                    notify = (
                        f"NOTIFY {self._channel}, '{records[-1].revision}'" if records else None
                    )
                    try:
                        statements.finish(notify)
                    except psycopg.Error as exc:
                        if _connection_lost(conn, exc):
                            # The commit was sent with the writes: it may have been
                            # applied before the connection went.
                            raise OutcomeUnknownError(
                                f"the connection to {self.location} was lost while the "
                                f"write was committing; it may or may not have been "
                                f"applied: {exc}"
                            ) from exc
                        raise
                except BaseException:
                    self._abandon(conn)
                    raise
            except psycopg.Error as exc:
                raise translate(exc) from exc
            if records and on_commit is not None:
                try:
                    on_commit(records)
                except Exception:  # the write stands: it is committed
                    logger.exception("publishing the changes of a commit failed")
            return result, records
        finally:
            self._gate.release()

    def _begin_writing(self) -> tuple[psycopg.Connection[Any], int]:
        """Begin a write transaction holding the write lock; return the connection and
        the last revision. A writer connection the server dropped is replaced (once:
        nothing was sent on it yet)."""
        if self._closed:
            raise ClosedError("the database is closed")
        for attempt in (1, 2):
            conn = self._writer
            if conn is None or conn.closed:
                conn = self._writer = self._connect()
            try:
                # One round trip: begin, take the write lock, read the last revision.
                cursor = conn.execute(self._begin)
                cursor.nextset()
                cursor.nextset()
                return conn, int(cursor.fetchall()[0][0])
            except psycopg.OperationalError as exc:
                self._abandon(conn)
                if attempt == 2 or not conn.closed:
                    raise translate(exc) from exc
            except psycopg.Error as exc:
                self._abandon(conn)
                raise translate(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _abandon(self, conn: psycopg.Connection[Any]) -> None:
        """Roll back what a failed write began (or drop the connection if it cannot)."""
        if conn.closed:
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                self._discard(conn)

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
                try:
                    if proxy.driver_connection.closed:
                        proxy.invalidate()  # no reset (and no logged error) on a dead one
                    else:
                        proxy.close()
                except Exception:
                    logger.debug("closing a connection failed", exc_info=True)
            self._idle.clear()
            self._engine.dispose()
        finally:
            if gated:
                self._gate.release()


def _connection_lost(conn: psycopg.Connection[Any], exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the connection went (so a commit in flight may have been
    applied), rather than the server refusing a statement (so nothing was)."""
    if conn.broken or conn.closed:
        return True
    state = exc.sqlstate
    if state is None:  # raised by the client: only the connection fails that way here
        return isinstance(exc, psycopg.OperationalError)
    # Class 08, connection exception; 57P01-57P03, the server shutting the session down.
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _lock_migrations(conn: sa.Connection) -> None:
    # Processes opening a new database at once take turns to migrate it.
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
