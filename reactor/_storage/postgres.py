"""The PostgreSQL store: one database (schema) shared by processes on several hosts.

SQLAlchemy (with psycopg 3) opens every connection and runs the schema and migrations;
the hot statements run on the psycopg connections it made, in autocommit mode, with
transactions begun and committed here. The statements both backends share are in
``sql_statements`` (``?`` placeholders, turned into psycopg's ``%s`` once per statement:
``postgres_text``); PostgreSQL's own, in ``postgres_statements``.

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

Names (scopes, keys, queues, locks, durable subscribers) may have 1,024 characters, 4 KB
of UTF-8, more than a B-tree entry holds (2,704 bytes): every index over names holds
``reactor_name(name)`` instead, the name itself up to 256 characters, else its start and
its SHA-256 (``_schema._REACTOR_NAME``), and every statement looks names up in that form
(``indexed_names``).

Read-only (``readonly=True``), the store never migrates, every connection is in
read-only transactions (``default_transaction_read_only``), and writes are refused
before anything is sent.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from reactor._base.turn import Turn
from reactor.errors import ClosedError, ReactorError, ReadOnlyError, StorageError

from .combine import Combiner
from .postgres_statements import PostgresReads, PostgresStatements, reserve_ids, translate
from .postgres_text import (
    END_FROZEN_WRITERS,
    FLUSH,
    MIGRATION_LOCK,
    ORDER_LOCK,
    PREPARED_ROWS,
    READ_AHEAD,
    SIZE,
    SYNCHRONOUS_COMMIT,
    WRITER_NAME,
    WRITER_PREPARE_THRESHOLD,
    pg,
)
from .records import Row, SharedScope
from .schema import META_TABLE, SCHEMA_VERSION, check_version, migrate
from .sql import SQLStore
from .sql_statements import SQLSnapshot
from .sql_text import ITEMS, REVISION

try:
    import psycopg
    import psycopg.errors
except ImportError:  # pragma: no cover - exercised only without the extra installed
    psycopg = None  # type: ignore[assignment]

__all__ = ["PostgresStore"]

logger = logging.getLogger("reactor")

T = TypeVar("T")


def normalize_url(target: str) -> sa.URL:
    """A SQLAlchemy URL for ``target`` that uses psycopg 3.

    Raises:
        InvalidArgumentError: another driver is named, or psycopg is not installed.
    """
    from reactor.errors import InvalidArgumentError

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
        raise InvalidArgumentError(
            "PostgreSQL needs psycopg 3: pip install 'reactor-state[postgresql]'"
        )
    return url


# Reader connections prepare only the reads asked (``_query_often``: each follower reads
# the log at others' commits, and parsing and planning it each time cost the server as
# much again as running it). None would keep psycopg from preparing any.
NEVER_BY_COUNT: Final = 2**62

# Seconds the follower waits after waking for this process's own commits only.
OWN_NOTES_PAUSE: Final = 0.01


class PostgresStore(SQLStore):
    """A reactor database in a PostgreSQL schema (the first of the ``search_path``);
    ``readonly``: one this store never writes."""

    def __init__(
        self, url: sa.URL, *, durability: str, timeout: float, readonly: bool = False
    ) -> None:
        self.location = url.render_as_string(hide_password=True)
        self.readonly = readonly
        self._timeout = timeout
        self._synchronous_commit = SYNCHRONOUS_COMMIT[durability]
        # "normal": a commit under the order lock does not wait for its WAL flush, a
        # transaction of its own right after it does (``PostgresStatements.commit``).
        self.flush_after_order = durability == "normal"
        self._closed = False
        self._gate = Turn()
        self._driver_error = psycopg.Error
        # Group commit across scopes: a commit is a round trip and a WAL flush, and the
        # database's write lock is held through it; threads writing together share it
        # (measured, 4 threads on 4 scopes: 0.99x one thread without, 1.72x with).
        self._combiner: Combiner | None = Combiner(self._write_once, timeout, self.reclaim)
        self._idle: deque[psycopg.Connection[Any]] = deque()
        self._opened: list[Any] = []  # every connection handed out, to close them
        self._opened_lock = threading.Lock()
        self._listener: psycopg.Connection[Any] | None = None  # the follower thread's own
        self._engine = sa.create_engine(url, poolclass=NullPool)
        sa.event.listen(self._engine, "connect", self._on_connect)
        sa.event.listen(self._engine, "begin", _lock_migrations)
        self._writer: psycopg.Connection[Any] | None = None
        self._writer_pid: int | None = None  # its server process: its notes are our own
        self.doubt = threading.Event()  # set: a commit of this process's may be unpublished
        try:
            if readonly:
                self._check_readable()
            else:
                migrate(self._engine)
                self.reconnect_writer()
            schema, database = self._query("SELECT current_schema(), current_database()", ())[0]
        except psycopg.Error as exc:
            self.close()
            raise translate(exc, self.location) from exc
        except sa.exc.DBAPIError as exc:
            self.close()
            raise _open_error(self.location, exc.orig) from exc
        except BaseException:
            self.close()
            raise
        digest = hashlib.blake2b(f"{database}/{schema}".encode(), digest_size=8).digest()
        # The advisory lock key and the notification channel of this reactor database.
        self.lock_key = int.from_bytes(digest, "big", signed=True)
        self.channel = f"reactor_{digest.hex()}"
        self._scope_keys = functools.lru_cache(maxsize=4096)(functools.partial(_scope_key, digest))

    def _check_readable(self) -> None:
        """Check, reading only, that the schema holds a reactor database of this version.

        Raises:
            SchemaError: the database comes from a newer reactor.
            ReadOnlyError: it holds no reactor database yet, or one that needs migrating.
            StorageError: it cannot be read.
        """
        sql = f"SELECT value FROM {META_TABLE} WHERE name = 'schema_version'"
        try:
            found = self._query(sql, ())
        except StorageError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                raise
            found = []
        version = int(found[0][0]) if found else 0
        check_version(version)
        if version == 0:
            raise ReadOnlyError(
                f"{self.location} holds no reactor database yet: a read-only open does not "
                "create one"
            )
        if version < SCHEMA_VERSION:
            raise ReadOnlyError(
                f"{self.location} was written by an older reactor (schema version {version}, "
                f"this one reads {SCHEMA_VERSION}); migrating it writes: open it read-write "
                "once first"
            )

    # -- connections ---------------------------------------------------------------
    def _on_connect(self, dbapi_conn: Any, _record: object) -> None:
        with dbapi_conn.cursor() as cursor:
            if self.readonly:  # the server refuses writes too, whatever sends them
                cursor.execute("SET default_transaction_read_only = on")
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
        # No server-side prepared statements but the writer's (``reconnect_writer``) and
        # the reads prepared on purpose (``_query_often``): none prepared by count.
        conn.prepare_threshold = NEVER_BY_COUNT
        return conn

    def _keep(self, proxy: Any) -> bool:
        """Remember ``proxy`` to close it with the store, unless the store is closed."""
        if self._closed:
            return False
        self._opened.append(proxy)
        return True

    def _discard(self, conn: psycopg.Connection[Any]) -> None:
        """Close ``conn``, a connection that failed, and forget it (``close()`` would
        keep it until the store closes: one a refused statement, for ever)."""
        with self._opened_lock:
            proxy = next((p for p in self._opened if p.driver_connection is conn), None)
            if proxy is not None:
                self._opened.remove(proxy)
        with contextlib.suppress(psycopg.Error):
            conn.close()
        if proxy is not None:
            with contextlib.suppress(Exception):
                proxy.invalidate()  # the pool's record of it goes too

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        statement = pg(sql)
        return self._reading(lambda conn: conn.execute(statement, params).fetchall())

    def _query_often(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        statement = pg(sql)
        return self._reading(lambda conn: conn.execute(statement, params, prepare=True).fetchall())

    def _reading(self, read: Callable[[psycopg.Connection[Any]], T], keep: bool = True) -> T:
        """``read`` on an idle reader connection (a new one if none is idle); with
        ``keep=False``, the connection stays the caller's when ``read`` succeeds."""
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
                    raise translate(exc, self.location) from exc
                while self._idle:
                    self._discard(self._idle.pop())
                continue
            except psycopg.Error as exc:
                self.abandon(conn)
                if not conn.closed:
                    self._idle.append(conn)
                raise translate(exc, self.location) from exc
            if keep:
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
            rows = conn.execute(pg(ITEMS) + " ORDER BY key", (scope, now)).fetchall()
            conn.execute("COMMIT")
            return rows, revision

        return self._reading(read)

    @contextlib.contextmanager
    def consistent_reads(self) -> Iterator[SQLSnapshot]:
        """Reads in one REPEATABLE READ transaction, on a reader connection of its own
        for the block: every statement sees the snapshot of the first."""
        conn = self._reading(_begin_snapshot, keep=False)
        try:
            yield PostgresReads(conn)
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.closed:  # the server dropped it
                self._discard(conn)
            else:
                self.abandon(conn)
                if not conn.closed:
                    self._idle.append(conn)
            if isinstance(exc, psycopg.Error):
                raise translate(exc, self.location) from exc
            raise
        else:
            self._idle.append(conn)

    def await_commits(self, timeout: float) -> int | None:
        """Wait at most ``timeout`` for a notification of another connection's commit;
        return the revision it announces (``sys.maxsize`` after (re)connecting the
        listener: what was missed meanwhile is read from the log)."""
        if self.doubt.is_set():
            self.doubt.clear()
            return sys.maxsize
        conn = self._listener
        if conn is None or conn.closed:
            try:
                conn = self._connect()
                conn.execute(f"LISTEN {self.channel}")
            except ClosedError:
                raise
            except (psycopg.Error, StorageError) as exc:
                logger.warning("listening to %s failed (%s); trying again", self.location, exc)
                threading.Event().wait(max(timeout, 0.5))
                return None
            self._listener = conn
            return sys.maxsize
        try:
            announced: int | None = None
            woken = False
            for note in conn.notifies(timeout=timeout, stop_after=1):
                woken = True
                announced = self._announced(note, announced)
            if woken:
                # Take every notification already here in one go: busy writers send
                # one per commit.
                for note in conn.notifies(timeout=0):
                    announced = self._announced(note, announced)
            if woken and announced is None:
                # Only this process's own commits (published as they commit): while it
                # writes fast, look again a little later, all at once, rather than wake
                # at each of its commits (another process's commit waits that long).
                time.sleep(min(timeout, OWN_NOTES_PAUSE))
                for note in conn.notifies(timeout=0):
                    announced = self._announced(note, announced)
            return announced
        except psycopg.Error as exc:
            if self._closed:
                raise ClosedError("the database is closed") from exc
            logger.warning("the listener of %s lost its connection: %s", self.location, exc)
            self._discard(conn)
            self._listener = None
        return None

    def _announced(self, note: psycopg.Notify, before: int | None) -> int | None:
        """The revision ``note`` announces, joined with those ``before`` it; this
        process's own commits (from its writer connection) are published as they commit
        (``Dispatcher.committed``), so their notes announce nothing."""
        if note.pid == self._writer_pid:
            return before
        revision = int(note.payload) if note.payload.isdigit() else sys.maxsize
        return revision if before is None else max(before, revision)

    # -- writes (the protocol is SQLStore._write_once) -------------------------------
    def _translate(self, exc: Exception) -> ReactorError:
        return translate(exc, self.location)

    def _begin_write(
        self, scopes: Collection[str] | None, reads: Collection[tuple[str, str]]
    ) -> PostgresStatements:
        """Begin a write transaction holding the locks of ``scopes`` (None: the order
        lock, which keeps out every other writer's commit), and read the rows of
        ``reads`` (and reserve a ``ReadsAhead``'s ids): one round trip (with no
        ``reads``, none: the begin goes with the
        transaction's first statement). A writer connection the server dropped is
        replaced (once: nothing was sent on it yet).

        Two processes writing one scope take turns; writers of other scopes go on at
        once, and meet only at commit, on the order lock (``PostgresStatements.commit``).
        Locks are taken in one order (sorted keys), so that writers never deadlock.
        """
        if self.readonly:
            raise ReadOnlyError(
                f"cannot write {self.location}: it is open read-only (readonly=True)"
            )
        self._drop_unfinished_writer()
        locks = self._locks(scopes)
        if not reads:  # nothing to read: the begin goes with the first statement
            conn = self._writer
            if conn is None or conn.closed:
                conn = self.reconnect_writer()
            return PostgresStatements(conn, self, {}, begin=[("BEGIN", ()), locks])
        for attempt in (1, 2):
            conn = self._writer
            if conn is None or conn.closed:
                conn = self.reconnect_writer()
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    conn.execute(*locks)
                    cursor = conn.execute(
                        READ_AHEAD,
                        ([scope for scope, _ in reads], [key for _, key in reads]),
                        prepare=len(reads) <= PREPARED_ROWS,
                    )
                    reserved = reserve_ids(conn, reads)  # a start's job id, asked now
                ahead: dict[tuple[str, str], Row | None] = dict.fromkeys(reads)
                for scope, key, *row in cursor.fetchall():
                    ahead[(scope, key)] = Row(*row)
                return PostgresStatements(conn, self, ahead, reserved=reserved)
            except psycopg.OperationalError as exc:
                lost = conn.closed
                self.drop_writer(conn)
                if attempt == 2 or not lost:
                    raise translate(exc, self.location) from exc
            except psycopg.Error as exc:
                self.drop_writer(conn)
                raise translate(exc, self.location) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _locks(self, scopes: Collection[str] | None) -> tuple[str, tuple[int, ...]]:
        """The statement that takes the locks of ``scopes`` (None: the order lock), one
        after another in one order (sorted keys), so that writers never deadlock; its
        text names only their modes, so that the writer prepares it once."""
        if scopes is None:
            return ORDER_LOCK, (self.lock_key,)
        shared: dict[int, bool] = {}  # key -> held in shared mode (only if every time)
        for scope in scopes:
            key = self._scope_keys(scope)
            shared[key] = shared.get(key, True) and isinstance(scope, SharedScope)
        keys = sorted(shared)
        calls = ", ".join(
            f"pg_advisory_xact_lock{'_shared' if shared[key] else ''}(%s)" for key in keys
        )
        return f"SELECT {calls}", tuple(keys)

    def _drop_unfinished_writer(self) -> None:
        """Drop a writer connection still in a transaction: a write that a Ctrl-C
        interrupted (this thread has the turn now, so no write of it is running)."""
        left = self._writer
        if (
            left is not None
            and not left.closed
            and (
                left.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
                or left.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF
            )
        ):
            self.drop_writer(left)

    def reconnect_writer(self) -> psycopg.Connection[Any]:
        """A new writer connection, in place of the one the server dropped (if any).

        The writer prepares the statements it runs again and again on the server (the
        flush at commit is a long one to plan): a statement that failed in a pipeline
        can leave psycopg's list of prepared statements out of step with the server's,
        so a writer connection on which a statement failed is dropped (``drop_writer``).

        Raises:
            psycopg.Error: the server cannot be reached.
        """
        conn = self._writer = self._connect()
        conn.prepare_threshold = WRITER_PREPARE_THRESHOLD
        # A write transaction runs reactor's code only (a transaction's body is staged in
        # memory first): one idle longer than the timeout belongs to a process that is
        # stopped (SIGSTOP) or wedged, and the server ends it, freeing its locks, before
        # a writer that waits for them gives up (each waits up to the timeout).
        conn.execute(f"SET idle_in_transaction_session_timeout = {int(self._timeout * 1000)}")
        conn.execute(f"SET application_name = '{WRITER_NAME}'")  # see end_frozen_writers
        self._writer_pid = conn.info.backend_pid
        if self.flush_after_order:
            self._check_flush(conn)
        return conn

    def end_frozen_writers(self) -> bool:
        """End the sessions of reactor writers (of any process) idle in a transaction
        for more than half the timeout: reactor runs only its own code between the round
        trips of a transaction, so such a writer is stopped or wedged, and holds locks
        that others wait for. The server's ``idle_in_transaction_session_timeout``
        misses some: psycopg ends a pipeline with a flush request after its sync, and the
        server does not time a session out after such a message."""
        try:
            found = self._query(END_FROZEN_WRITERS, (WRITER_NAME, self._timeout / 2))
        except StorageError:
            return False
        ended = int(found[0][0])
        if ended:
            logger.warning(
                "ended %d writer(s) of %s frozen in a transaction for more than %s s",
                ended,
                self.location,
                self._timeout / 2,
            )
        return ended > 0

    def _check_flush(self, conn: psycopg.Connection[Any]) -> None:
        """Whether this role may run the transaction that waits for a commit's WAL
        flush (``FLUSH``); if not (a server that revoked it), commits wait for their
        flush under the order lock, as with durability "full"."""
        try:
            conn.execute(FLUSH)
        except psycopg.errors.InsufficientPrivilege as exc:
            self.flush_after_order = False
            reason = exc.diag.message_primary
            logger.info("commits to %s flush under the order lock (%s)", self.location, reason)

    def drop_writer(self, conn: psycopg.Connection[Any]) -> None:
        """Close ``conn``, the writer connection a failed statement left in doubt; the
        next write connects again."""
        self._discard(conn)
        if self._writer is conn:
            self._writer = None

    def abandon(self, conn: psycopg.Connection[Any]) -> None:
        """Roll back what a failed write began (or drop the connection if it cannot)."""
        if conn.closed:
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                self._discard(conn)

    def _close_all(self, opened: list[Any]) -> None:
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


def _scope_key(database: bytes, scope: str) -> int:
    """The advisory lock key of ``scope`` in the reactor database ``database`` (the
    digest of its name). Two scopes that share a key only take turns."""
    name = database + b"/" + scope.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "big", signed=True)


def _lock_migrations(conn: sa.Connection) -> None:
    # Processes opening a new database at once take turns to migrate it.
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")


def _begin_snapshot(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    return conn


def _open_error(location: str, cause: BaseException | None) -> StorageError:
    """The error of an open that failed with ``cause``: one that names the database,
    and says what to do when the schema it names does not exist."""
    if isinstance(cause, psycopg.errors.InvalidSchemaName):
        return StorageError(
            f"cannot open {location}: the schema it names (its search_path) does not "
            "exist; create it first (CREATE SCHEMA name), or name one that exists"
        )
    return StorageError(f"cannot open {location}: {cause}")
