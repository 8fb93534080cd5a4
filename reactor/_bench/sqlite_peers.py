"""Raw sqlite3 as ``reactor bench`` measures it: a commit per operation, a commit per
100 operations, and the floor of reactor's own guarantees (``SQLiteFloorPeer``)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from .peer import Peer, apply_update

__all__ = ["SQLiteBatchPeer", "SQLiteFloorPeer", "SQLitePeer"]

_UPSERT = "INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
_DELETE = "DELETE FROM kv WHERE k = ?"


class SQLitePeer(Peer):
    """Raw sqlite3: WAL, ``synchronous=NORMAL``, one connection per thread, a commit
    for every operation."""

    name = "sqlite3"
    batch = 1
    notes = (
        (
            "WAL, synchronous=NORMAL, one connection per thread; increment and update "
            "read and write in one BEGIN IMMEDIATE transaction; asyncio calls it inline "
            "on the loop's thread (sqlite3 has no asyncio API)"
        ),
    )
    aio = "inline"

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._path = os.path.join(location, "sqlite3.db")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._conn().execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v)")

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self._path, isolation_level=None, timeout=60.0, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            self._local.pending = 0
            with self._guard:
                self._connections.append(conn)
        return conn

    def _run(self, work: Callable[[sqlite3.Connection], Any], write: bool) -> Any:
        """``work`` in a transaction: its own, or every ``batch`` operations one."""
        conn = self._conn()
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = work(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            self._local.pending = 0
            raise
        self._local.pending += 1
        if self._local.pending >= self.batch:
            conn.execute("COMMIT")
            self._local.pending = 0
        return result

    def flush(self) -> None:
        conn = self._conn()
        if conn.in_transaction:
            conn.execute("COMMIT")
        self._local.pending = 0

    def set(self, key: str, value: dict[str, Any]) -> None:
        params = (key, json.dumps(value))
        if self.batch == 1:  # one statement: its own transaction
            self._conn().execute(_UPSERT, params)
            return
        self._run(lambda conn: conn.execute(_UPSERT, params), write=True)

    def get(self, key: str) -> Any:
        def read(conn: sqlite3.Connection) -> Any:
            row = conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
            return None if row is None else json.loads(row[0])

        if self.batch == 1:
            return read(self._conn())
        return self._run(read, write=False)

    def increment(self, key: str) -> int:
        def add(conn: sqlite3.Connection) -> int:
            if conn.execute("UPDATE kv SET v = v + 1 WHERE k = ?", (key,)).rowcount == 0:
                conn.execute("INSERT INTO kv (k, v) VALUES (?, 1)", (key,))
            return int(conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()[0])

        return int(self._run(add, write=True))

    def update(self, key: str) -> Any:
        def change(conn: sqlite3.Connection) -> Any:
            row = conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
            value = apply_update(json.loads(row[0]))
            conn.execute("UPDATE kv SET v = ? WHERE k = ?", (json.dumps(value), key))
            return value

        return self._run(change, write=True)

    def delete(self, key: str) -> None:
        if self.batch == 1:
            self._conn().execute(_DELETE, (key,))
            return
        self._run(lambda conn: conn.execute(_DELETE, (key,)), write=True)

    def count(self, key: str) -> int:
        self.flush()
        row = self._conn().execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return 0 if row is None else int(row[0])

    async def acall(self, verb: str, *args: Any) -> Any:
        return getattr(self, verb)(*args)

    def close(self) -> None:
        with self._guard:
            connections, self._connections = self._connections, []
        for conn in connections:
            if conn.in_transaction:
                conn.execute("COMMIT")
            conn.close()


class SQLiteBatchPeer(SQLitePeer):
    """Raw sqlite3 as above, committing once every 100 operations per connection."""

    name = "sqlite3x100"
    batch = 100
    notes = (
        (
            "as sqlite3, but each connection commits once per 100 operations (reads too "
            "run in transactions of 100); every phase ends with a commit, which is timed"
        ),
    )


class SQLiteFloorPeer(SQLitePeer):
    """What reactor's guarantees cost in bare sqlite3, with nothing of reactor's: each
    write one ``BEGIN IMMEDIATE`` transaction that reads the old row, appends a change
    record to an indexed log and writes the row, then commits; old and new value
    decoded for the caller, as reactor returns them (orjson, as reactor's)."""

    name = "sqlite3+log"
    notes = (
        (
            "the floor of reactor's guarantees: each write reads the old row, appends a "
            "change record (an AUTOINCREMENT revision, indexed by key) and writes the "
            "row in one BEGIN IMMEDIATE transaction, and returns old and new value"
        ),
    )

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._conn().executescript(_FLOOR_SCHEMA)

    def _write(self, key: str, change: Callable[[Any], Any]) -> tuple[Any, Any]:
        """The row of ``key`` changed by ``change(old value)`` (None: deleted), with
        its change record, in one transaction; the old and the new value."""

        def work(conn: sqlite3.Connection) -> tuple[Any, Any]:
            row = conn.execute(_FLOOR_ROW, (key,)).fetchone()
            old_text, version = (None, 0) if row is None else row
            old = None if old_text is None else orjson.loads(old_text)
            new = change(old)
            if new is None and row is None:
                return None, None  # nothing to delete
            new_text = None if new is None else orjson.dumps(new).decode()
            kind = "deleted" if new is None else "created" if row is None else "updated"
            record = (key, kind, old_text, new_text, version + 1, time.time())
            revision = conn.execute(_FLOOR_LOG, record).lastrowid
            if new is None:
                conn.execute(_FLOOR_DELETE, (key,))
            else:
                conn.execute(_FLOOR_UPSERT, (key, new_text, revision, version + 1))
            return old, None if new_text is None else orjson.loads(new_text)

        result: tuple[Any, Any] = self._run(work, write=True)
        return result

    def set(self, key: str, value: dict[str, Any]) -> None:
        self._write(key, lambda _old: value)

    def get(self, key: str) -> Any:
        row = self._conn().execute("SELECT v FROM floor_kv WHERE k = ?", (key,)).fetchone()
        return None if row is None else orjson.loads(row[0])

    def increment(self, key: str) -> int:
        return int(self._write(key, lambda old: (old or 0) + 1)[1])

    def update(self, key: str) -> Any:
        return self._write(key, apply_update)[1]

    def delete(self, key: str) -> None:
        self._write(key, lambda _old: None)

    def count(self, key: str) -> int:
        return int(self.get(key) or 0)


_FLOOR_SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_kv (
    k TEXT PRIMARY KEY, v TEXT NOT NULL, revision INTEGER NOT NULL, version INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS floor_log (
    revision INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT NOT NULL, type TEXT NOT NULL,
    old TEXT, new TEXT, version INTEGER NOT NULL, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS floor_log_key ON floor_log (k, revision);
"""
_FLOOR_ROW = "SELECT v, version FROM floor_kv WHERE k = ?"
_FLOOR_LOG = "INSERT INTO floor_log (k, type, old, new, version, at) VALUES (?, ?, ?, ?, ?, ?)"
_FLOOR_UPSERT = (
    "INSERT INTO floor_kv (k, v, revision, version) VALUES (?, ?, ?, ?) ON CONFLICT (k) "
    "DO UPDATE SET v = excluded.v, revision = excluded.revision, version = excluded.version"
)
_FLOOR_DELETE = "DELETE FROM floor_kv WHERE k = ?"
