"""SQLite's statements: those of a write transaction on the writer connection
(``SQLiteStatements``), reads in one read transaction (``SQLiteReads``), and its errors
as reactor's (``translate``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from operator import attrgetter
from typing import Any, Final

from reactor.errors import BusyError, ClosedError, ReactorError, ReadOnlyError, StorageError

from .records import ChangeRecord, RefusedError
from .sql_statements import SQLSnapshot, SQLStatements
from .sql_text import REVISION, STREAMED_ROWS

__all__ = ["SQLiteReads", "SQLiteStatements", "fetch_all", "translate"]

LOG: Final = (
    "INSERT INTO reactor_changes (scope, key, type, old_value, new_value, ops, timestamp, "
    "version, timer, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


# A record's columns as LOG takes them (a C call: no Python frame on the hot path).
_logged: Final = attrgetter(
    "scope",
    "key",
    "type",
    "old_value",
    "new_value",
    "ops",
    "timestamp",
    "version",
    "timer",
    "expires_at",
)
_READONLY: Final = 8  # SQLITE_READONLY, the primary code of every "cannot write" error
# What a failure says of the database, by primary result code.
_FAILURES: Final = {
    11: "is damaged",  # SQLITE_CORRUPT: "database disk image is malformed"
    26: "is not a SQLite database, or it is damaged",  # SQLITE_NOTADB
}


class SQLiteStatements(SQLStatements):
    """The write-path statements on the writer connection."""

    __slots__ = ("_conn", "_location", "connection")

    SET_COMPACTED = "UPDATE reactor_meta SET value = MAX(value, ?) WHERE name = 'compacted'"
    # One key is read where the work asks for it: reading it ahead saves no round trip.
    READS_ONE_AHEAD = False

    def __init__(self, conn: sqlite3.Connection, location: str) -> None:
        self._conn = conn
        self._location = location  # the database's path, for the errors
        self.connection = conn  # which connection these are: read as is, no call

    def _all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        try:  # fetch_all inline: every read of a write transaction comes here
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise translate(exc, self._location) from exc

    def _run(self, sql: str, params: tuple[Any, ...]) -> int:
        try:
            return self._conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise translate(exc, self._location) from exc

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        try:
            self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise translate(exc, self._location) from exc

    def append_log(self, records: list[ChangeRecord]) -> int:
        # SQLite numbers the records: the integer key is the revision (_schema.changes).
        try:
            if len(records) == 1:  # execute(), not executemany(): a few microseconds less
                cursor = self._conn.execute(LOG, _logged(records[0]))
                assert cursor.lastrowid is not None
                return cursor.lastrowid
            self._conn.executemany(LOG, map(_logged, records))
            # This transaction holds the write lock: its revisions follow one another.
            return int(self._conn.execute(REVISION).fetchall()[0][0]) - len(records) + 1
        except sqlite3.Error as exc:
            raise translate(exc, self._location) from exc

    def commit(self, records: list[ChangeRecord]) -> None:  # noqa: ARG002 - none to send
        self._conn.execute("COMMIT")

    def abort(self, interrupted: bool = False) -> None:  # noqa: ARG002 - rolled back alike
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


class SQLiteReads(SQLSnapshot):
    """An export's reads (``SQLSnapshot``) on a SQLite connection, in the read
    transaction it is in."""

    __slots__ = ("_conn", "_location")

    def __init__(self, conn: sqlite3.Connection, location: str) -> None:
        self._conn = conn
        self._location = location

    def all(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        return fetch_all(self._conn, sql, params, self._location)

    def each(self, sql: str, params: tuple[Any, ...]) -> Iterator[Any]:
        try:
            cursor = self._conn.execute(sql, params)
            while rows := cursor.fetchmany(STREAMED_ROWS):
                yield from rows
        except sqlite3.Error as exc:
            raise translate(exc, self._location) from exc


def translate(exc: sqlite3.Error, location: str) -> ReactorError:
    """The reactor error for a driver error on the database at ``location`` (its
    path, which the message names; chain it with ``raise ... from exc``)."""
    database = f"the database {location}"
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
        return ClosedError(f"{database} is closed")
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return BusyError(f"{database} stayed locked past the busy timeout: {exc}")
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == _READONLY:
        return ReadOnlyError(f"{database} cannot be written: {exc}")
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError):
        # A constraint or trigger (SQLITE_CONSTRAINT), a value too big (SQLITE_TOOBIG).
        return RefusedError(f"{database} refused the write: {exc}")
    failed = _FAILURES.get((code or 0) & 0xFF, "failed")
    return StorageError(f"{database} {failed}: {exc}")


def fetch_all(
    conn: sqlite3.Connection, sql: str, params: tuple[Any, ...], location: str
) -> list[Any]:
    """The rows of ``sql`` on ``conn``, a connection to ``location``; its errors as
    reactor's."""
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.Error as exc:
        raise translate(exc, location) from exc
