"""PostgreSQL's statements: those of a write transaction on the writer connection
(``PostgresStatements``, which sends what it can in one round trip), reads in one read
transaction (``PostgresReads``), and psycopg's errors as reactor's (``translate``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any, Final, NoReturn, Protocol

from reactor.errors import BusyError, OutcomeUnknownError, ReactorError, ReadOnlyError, StorageError

from .postgres_text import (
    ADD_JOBS,
    CHANGES,
    COMMIT_UNFLUSHED,
    FLUSH,
    ORDER_LOCK,
    PREPARED_ROWS,
    RESERVE_IDS,
    RESERVE_IDS_UNLESS,
    ROWS_ONLY,
    pg,
)
from .records import (
    ChangeRecord,
    JobRow,
    Key,
    QueueRow,
    ReadsAhead,
    RefusedError,
    Reservation,
    Row,
    Upsert,
)
from .sql_jobs import SQLJobs, first_to_take
from .sql_statements import SQLSnapshot, SQLStatements
from .sql_text import (
    DUE_JOBS,
    FIRST_PRIORITY,
    FIRST_READY,
    JOB,
    QUEUE,
    QUEUE_TO_PUT,
    STREAMED_ROWS,
    job_row,
    queue_row,
)

try:
    import psycopg
    import psycopg.errors
except ImportError:  # pragma: no cover - exercised only without the extra installed
    psycopg = None  # type: ignore[assignment]

__all__ = [
    "PostgresJobs",
    "PostgresReads",
    "PostgresStatements",
    "WriterHost",
    "connection_lost",
    "translate",
]


class WriterHost(Protocol):
    """What a write transaction needs of its store (``PostgresStore``)."""

    location: str
    channel: str  # the notification channel of the reactor database
    lock_key: int  # the advisory lock that orders revisions
    flush_after_order: bool  # a commit's WAL flush waits outside the order lock
    doubt: threading.Event  # set: a commit of this process's may be unpublished

    def reconnect_writer(self) -> psycopg.Connection[Any]: ...

    def drop_writer(self, conn: psycopg.Connection[Any]) -> None: ...

    def abandon(self, conn: psycopg.Connection[Any]) -> None: ...


# SQLSTATE classes of a statement the server refused for what it holds, on a sound
# connection: data exceptions, integrity constraints, program limits (an index entry too
# big), syntax or access rules, and errors raised by triggers (PL/pgSQL).
_REFUSALS: Final = frozenset({"22", "23", "42", "54", "P0"})


def translate(exc: Exception, location: str) -> ReactorError:
    """The reactor error for a psycopg error on the database at ``location`` (its URL,
    the password hidden, which the message names; chain it with ``raise ... from
    exc``)."""
    database = f"the database {location}"
    if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
        return BusyError(f"{database} stayed locked past the timeout: {exc}")
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return ReadOnlyError(f"{database} cannot be written: {exc}")
    if isinstance(exc, psycopg.Error) and (exc.sqlstate or "")[:2] in _REFUSALS:
        return RefusedError(f"{database} refused the statement: {exc}")
    return StorageError(f"{database} failed: {exc}")


class PostgresStatements(SQLStatements):
    """The write-path statements on the writer connection, in its transaction.

    What a flush writes (log records, rows) is held back and sent with the commit, in
    one round trip (``commit``): there the order lock is taken, the revisions follow
    the last committed one, and the commit is flushed, all on the server.

    With ``flush_after_order`` (durability "normal"), a commit under the order lock
    does not wait for its WAL flush, which would hold that lock, and every other
    process's commit, through it: a small transaction of its own that does wait
    (``FLUSH``) follows in the same round trip, and flushes the WAL up to past the
    commit. So the write is acknowledged once on disk, as before, and the processes'
    flushes overlap; another connection may see the commit a flush (about a
    millisecond) before it is on disk.

    Statements whose answer nothing waits for (the begin of a transaction that reads
    nothing ahead, the writes of work queues: ``_send``) are pending until the next
    statement that is answered, and go with it in one round trip: in order, so that
    every read sees what was sent before it.
    """

    __slots__ = (
        "_ahead",
        "_changes",
        "_conn",
        "_failed",
        "_flush_rows",
        "_pending",
        "_queued",
        "_reserved",
        "_store",
        "_unbegun",
    )

    SET_COMPACTED = "UPDATE reactor_meta SET value = GREATEST(value, ?) WHERE name = 'compacted'"

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        store: WriterHost,
        ahead: dict[tuple[str, str], Row | None],
        begin: list[tuple[str, tuple[Any, ...]]] | None = None,
        *,
        reserved: tuple[Reservation, psycopg.Cursor[Any]] | None = None,
    ) -> None:
        self._conn = conn
        self._store = store
        self._ahead = ahead  # rows read with the begin
        self._reserved = reserved  # job ids reserved with the begin (ReadsAhead)
        self._queued: list[tuple[str, list[tuple[Any, ...]]]] = []
        self._changes: tuple[Any, ...] | None = None  # CHANGES' parameters, if any
        # Sent with the next answered statement: the begin (if not sent yet), writes.
        self._pending: list[tuple[str, tuple[Any, ...]]] = list(begin or ())
        self._unbegun = bool(begin)  # nothing sent yet: a dropped connection is replaced
        self._failed = False  # the server failed a statement: the connection goes (abort)
        self._flush_rows = 0  # the most rows of one kind the flush writes

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return self._all_several([(sql, params)])[0]

    def _all_several(self, statements: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        """The rows of each of ``statements``, run after what is pending, all in one
        round trip."""
        try:
            answered = self._answer([(pg(sql), params) for sql, params in statements])
            return [cursor.fetchall() for cursor in answered]
        except psycopg.Error as exc:
            self._failed = True
            raise translate(exc, self._store.location) from exc

    def _run(self, sql: str, params: tuple[Any, ...]) -> int:
        try:
            return self._answer([(pg(sql), params)])[0].rowcount
        except psycopg.Error as exc:
            self._failed = True
            raise translate(exc, self._store.location) from exc

    def _send(self, sql: str, params: tuple[Any, ...]) -> None:
        """Run ``sql`` with the next answered statement (its errors are raised there)."""
        self._pending.append((pg(sql), params))

    def _answer(self, statements: list[tuple[str, tuple[Any, ...]]]) -> list[psycopg.Cursor[Any]]:
        """Run what is pending, then ``statements``, in one round trip; their cursors.
        A writer connection the server dropped before the transaction began is
        replaced once (nothing was applied on it)."""
        if not self._pending and len(statements) == 1:
            return [self._conn.execute(*statements[0])]
        pending, self._pending = self._pending, []
        unbegun, self._unbegun = self._unbegun, False
        try:
            return self._pipelined(pending, statements)
        except psycopg.OperationalError:
            if not unbegun or not self._conn.closed:
                raise
            self._conn = self._store.reconnect_writer()
            return self._pipelined(pending, statements)

    def _pipelined(
        self,
        pending: list[tuple[str, tuple[Any, ...]]],
        statements: list[tuple[str, tuple[Any, ...]]],
    ) -> list[psycopg.Cursor[Any]]:
        conn = self._conn
        with conn.pipeline():
            for statement, values in pending:
                conn.execute(statement, values)
            cursors = [conn.execute(sql, params) for sql, params in statements]
        return cursors

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self._queued.append((pg(sql), rows))

    def read_ahead(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], Row | None]:
        ahead, self._ahead = self._ahead, {}
        missing = [key for key in keys if key not in ahead]
        if missing:
            ahead.update(super().read_ahead(missing))
        return ahead

    def write_changes(
        self,
        records: list[ChangeRecord],
        upserts: list[Upsert],
        deletes: list[Key],
    ) -> None:
        """Hold back, for the commit, one statement (``CHANGES``) that numbers the
        records after the last committed revision and writes them with the rows."""
        for n, record in enumerate(records, 1):
            assert record.revision == -n  # provisional: the n-th change
        self._flush_rows = max(len(records), len(upserts), len(deletes))
        self._changes = (
            [r.scope for r in records],
            [r.key for r in records],
            [r.type for r in records],
            [r.old_value for r in records],
            [r.new_value for r in records],
            [r.ops for r in records],
            [r.timestamp for r in records],
            [r.version for r in records],
            [r.timer for r in records],
            [r.expires_at for r in records],
            [scope for scope, _ in deletes],
            [key for _, key in deletes],
            [row[0] for row in upserts],
            [row[1] for row in upserts],
            [row[2] for row in upserts],
            [row[3] for row in upserts],
            [row[4] for row in upserts],
            [row[5] for row in upserts],
            [row[6] for row in upserts],
            self._store.channel,
            len(records),
        )

    def commit(self, records: list[ChangeRecord]) -> None:
        """Send what is held back and the commit in one round trip. With records, the
        order lock is taken first, and held until the commit is visible: revisions are
        given, and become visible, in one order across every process. The notification
        goes at commit, and only if it commits. With ``flush_after_order``, the WAL
        flush waits outside the order lock (see the class).

        Raises:
            OutcomeUnknownError: the connection went during the commit, which may have
                been applied before it went.
        """
        if self._unbegun:  # a transaction that read nothing: begin it on its own first
            self._all("SELECT 1", ())
        conn = self._conn
        pending, self._pending = self._pending, []
        flush = bool(records) and self._store.flush_after_order
        committed: psycopg.Cursor[Any] | None = None
        written: psycopg.Cursor[Any] | None = None
        try:
            with conn.pipeline():
                for sql, values in pending:
                    conn.execute(sql, values)
                with conn.cursor() as cursor:
                    for sql, rows in self._queued:
                        cursor.executemany(sql, rows)
                if self._changes is not None:
                    if records:
                        lock = COMMIT_UNFLUSHED if flush else ORDER_LOCK
                        conn.execute(lock, (self._store.lock_key,))
                    written = conn.cursor()
                    # A few rows: the prepared plan; a big batch is planned for its size.
                    written.execute(
                        CHANGES if records else ROWS_ONLY,
                        self._changes,
                        prepare=self._flush_rows <= PREPARED_ROWS,
                    )
                committed = conn.execute("COMMIT")
                if flush:
                    conn.execute(FLUSH)
        except psycopg.Error as exc:
            if not (flush and _committed(committed)):
                self._fail_commit(exc)
            self._flush_alone(exc)  # the commit went through, not the flush after it
        if records:
            assert written is not None
            base = int(written.fetchall()[0][0])
            for record in records:
                record.revision = base - record.revision

    def _fail_commit(self, exc: psycopg.Error) -> NoReturn:
        """Raise what a commit that failed with ``exc`` raises.

        Raises:
            OutcomeUnknownError: the connection went during the commit, which may have
                been applied before it went.
            psycopg.Error: ``exc``, nothing was applied.
        """
        conn = self._conn
        self._failed = True
        if connection_lost(conn, exc):
            # Its notification, if it committed, came from this process's writer:
            # the follower reads the log instead (``await_commits``).
            self._store.doubt.set()
            raise OutcomeUnknownError(
                f"the connection to {self._store.location} was lost while the write "
                f"was committing; it may or may not have been applied: {exc}"
            ) from exc
        raise exc

    def _flush_alone(self, failed: psycopg.Error) -> None:
        """Run the transaction that waits for the WAL flush on its own: its commit went
        through, and ``failed`` came after it (what of the flush was sent is rolled
        back first).

        Raises:
            OutcomeUnknownError: that failed too: committed, maybe not on disk yet.
        """
        conn = self._conn
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
            conn.execute(FLUSH)
        except psycopg.Error as exc:
            self._failed = True
            self._store.doubt.set()
            raise OutcomeUnknownError(
                f"the write to {self._store.location} committed, but whether it is on disk "
                f"could not be known: {failed}; then {exc}"
            ) from exc

    def abort(self, interrupted: bool = False) -> None:
        # After a failed statement, or a Ctrl-C inside psycopg, its prepared statements
        # may be out of step with psycopg's list of them.
        if self._failed or interrupted:
            self._store.drop_writer(self._conn)
        else:
            self._store.abandon(self._conn)

    def jobs(self) -> SQLJobs:
        return PostgresJobs(self._all, self._send, self._all_several, self._reserved_with_begin)

    def _reserved_with_begin(self, queue: str, count: int, keys: list[str]) -> list[Any] | None:
        """The row the begin's reservation answered, if it reserved ``count`` ids in
        ``queue`` for ``keys`` (once: a later put reserves again)."""
        reserved, self._reserved = self._reserved, None
        if reserved is None or reserved[0][:3] != (queue, count, tuple(keys)):
            return None
        return reserved[1].fetchall()


# A write transaction locks the jobs it reads, so that writes holding their queue in
# shared mode (``SharedScope``: takes and acknowledgements) may run together: a take
# passes over the jobs another holds (SKIP LOCKED), and an acknowledgement waits for the
# take that holds its job, then reads it as that take left it.
_LOCKED: Final = {
    JOB: JOB + " FOR UPDATE",
    QUEUE_TO_PUT: QUEUE_TO_PUT + " FOR UPDATE",
    DUE_JOBS: DUE_JOBS + " FOR UPDATE SKIP LOCKED",
    FIRST_READY: FIRST_READY + " FOR UPDATE SKIP LOCKED",
    FIRST_PRIORITY: FIRST_PRIORITY + " FOR UPDATE SKIP LOCKED",
}


class PostgresJobs(SQLJobs):
    """The statements of work queues, with PostgreSQL's own insert of many jobs, and
    reads that lock the jobs they find (``_LOCKED``); their writes go with the next
    statement answered (``PostgresStatements._send``)."""

    __slots__ = ("_reserved",)

    def __init__(
        self,
        read: Callable[[str, tuple[Any, ...]], list[Any]],
        send: Callable[[str, tuple[Any, ...]], object],
        read_several: Callable[[list[tuple[str, tuple[Any, ...]]]], list[list[Any]]],
        reserved: Callable[[str, int, list[str]], list[Any] | None],
    ) -> None:
        self._reserved = reserved  # what the begin reserved, if it did
        super().__init__(
            lambda sql, params: read(_LOCKED.get(sql, sql), params),
            send,
            lambda statements: read_several([(_LOCKED.get(s, s), p) for s, p in statements]),
        )

    def add_jobs(self, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            self._send(ADD_JOBS, tuple(list(column) for column in zip(*rows, strict=True)))

    def take_view(
        self, queue: str, now: float, limit: int
    ) -> tuple[QueueRow | None, list[JobRow], JobRow | None]:
        """See ``SQLJobReads.take_view``: here the jobs in one statement (``_TAKE_VIEW``),
        with the queue's row in the same round trip."""
        found, rows = self._all_several(
            [(QUEUE, (queue,)), (_TAKE_VIEW, (queue, "taken", now, limit, queue, now, queue, now))]
        )
        parts: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        for part, *row in rows:
            parts[part].append(row)
        due = sorted((job_row(row) for row in parts[0]), key=lambda job: (job.ready_at, job.id))
        return (queue_row(found[0]) if found else None), due, first_to_take(*parts[1:])

    def reserve_ids(self, queue: str, count: int, keys: list[str]) -> tuple[QueueRow | None, bool]:
        """See ``statements.JobWrites.reserve_ids``: here one statement (``RESERVE_IDS``),
        sent with the begin if the write said so (``ReadsAhead``)."""
        found = self._reserved(queue, count, keys)
        if found is None:
            found = self._all(RESERVE_IDS, (count, queue, count, keys))
        if not found:
            return None, False
        *row, held = found[0]
        return queue_row(row), bool(held)


# A take's jobs in one statement: those whose lease ran out (0), the first ready of
# priority 0 (1) and of the others (2), each locked as found (passed over if another
# transaction holds it), as the three statements of ``_LOCKED`` did one by one.
_TAKE_VIEW: Final = pg(
    f"SELECT 0, d.* FROM ({DUE_JOBS} FOR UPDATE SKIP LOCKED) AS d "
    f"UNION ALL SELECT 1, z.* FROM ({FIRST_READY} FOR UPDATE SKIP LOCKED) AS z "
    f"UNION ALL SELECT 2, o.* FROM ({FIRST_PRIORITY} FOR UPDATE SKIP LOCKED) AS o"
)


def reserve_ids(
    conn: psycopg.Connection[Any], reads: Collection[Key]
) -> tuple[Reservation, psycopg.Cursor[Any]] | None:
    """Send ``RESERVE_IDS_UNLESS`` for the ids that ``reads`` reserves, if it is a
    ``ReadsAhead`` (in the begin's pipeline): what it asked, and its cursor."""
    if not isinstance(reads, ReadsAhead):
        return None
    queue, count, keys, (scope, key) = asked = reads.reserve
    return asked, conn.execute(RESERVE_IDS_UNLESS, (count, queue, scope, key, count, list(keys)))


def _committed(cursor: psycopg.Cursor[Any] | None) -> bool:
    """Whether the ``COMMIT`` of ``cursor``, sent in a pipeline that failed after it,
    committed (then its flush failed: committed, perhaps not on disk yet)."""
    result = None if cursor is None else cursor.pgresult
    return (
        result is not None
        and result.status == psycopg.pq.ExecStatus.COMMAND_OK
        and result.command_status == b"COMMIT"
    )


def connection_lost(conn: psycopg.Connection[Any], exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the connection went (so a commit in flight may have been
    applied), rather than the server refusing a statement (so nothing was)."""
    if conn.broken or conn.closed:
        return True
    state = exc.sqlstate
    if state is None:  # raised by the client: only the connection fails that way here
        return isinstance(exc, psycopg.OperationalError)
    # Class 08, connection exception; 57P01-57P03, the server shutting the session down.
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


class PostgresReads(SQLSnapshot):
    """An export's reads (``SQLSnapshot``) on a reader connection, in the transaction
    it is in; ``each`` reads through a server-side cursor (``DECLARE``),
    ``STREAMED_ROWS`` rows a fetch."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return self._conn.execute(pg(sql), params).fetchall()

    def each(self, sql: str, params: tuple[Any, ...]) -> Iterator[Any]:
        with self._conn.cursor(name="reactor_reads") as cursor:
            cursor.itersize = STREAMED_ROWS
            cursor.execute(pg(sql), params)
            yield from cursor
