"""The SQLite database file: created readable by its owner only, checked before
anything touches it, and opened read-only without writing a byte.

The file is checked before anything touches it (``probe``): a file that is not a reactor
database, or one from a newer reactor, is refused byte-for-byte untouched, since the
first pragma of a connection (``journal_mode = WAL``) rewrites the header; and with no
file made beside it, since even a ``mode=ro`` connection makes the -wal and -shm files
of a database in WAL mode that no connection has open (``probing``).

Read-only, nothing is ever written: not the database, not its ``-wal`` and ``-shm``
files, which SQLite creates on a first read in WAL mode (and which a read-only folder
forbids). While another connection has the database open, its ``-shm`` exists and a
``mode=ro`` connection shares it, following the commits. When neither file exists, no
connection has the database open and all of it is in the database file: the connection
opens it ``immutable=1`` (no locks, no WAL index), a snapshot that is replaced as soon
as another connection opens the database or the file changes (``outdated``), checked
before each read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final
from urllib.parse import quote

from reactor.errors import ReactorError, ReadOnlyError, StorageError

from .schema import META_TABLE, SCHEMA_VERSION, check_version
from .sqlite_statements import translate

_READONLY_ROLLBACK: Final = 776  # SQLITE_READONLY_ROLLBACK: a hot journal, read-only


_READONLY_DIRECTORY: Final = 1544  # SQLITE_READONLY_DIRECTORY: no -wal or -shm can be made


# What a mode=ro connection says when it cannot make or use the -shm file (the WAL index):
# SQLITE_CANTOPEN, SQLITE_READONLY_CANTINIT and SQLITE_READONLY_DIRECTORY.
_NO_WAL_INDEX: Final = frozenset({14, 1288, _READONLY_DIRECTORY})


VERSION: Final = f"SELECT value FROM {META_TABLE} WHERE name = 'schema_version'"


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


def cannot_connect(exc: sqlite3.Error, location: str) -> ReactorError:
    """The error for a connection SQLite could not open; it says "unable to open
    database file" whatever the reason, so the commonest one is named when it holds."""
    error = translate(exc, location)
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as probe:
        if probe.errno in (errno.EMFILE, errno.ENFILE):
            return StorageError(f"{error}: no file descriptor left ({probe.strerror})")
    else:
        os.close(fd)
    return error


def create_private(path: Path) -> None:
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


def check_writable(path: Path) -> None:
    """Refuse, before SQLite opens it, a database file this process may not write:
    SQLite would open it read-only instead, and make the -wal and -shm files beside it,
    owned by this user, in the way of the file's owner.

    Raises:
        ReadOnlyError: the file is not writable by this process.
    """
    effective = os.access in os.supports_effective_ids
    if not os.access(path, os.W_OK, effective_ids=effective):
        raise ReadOnlyError("permission denied")


def unwritable(path: Path, exc: ReactorError) -> ReadOnlyError:
    """The error for a read-write open of a database this process cannot write."""
    cause = exc.__cause__
    if getattr(cause, "sqlite_errorcode", None) == _READONLY_DIRECTORY:
        reason = "its folder is not writable, and SQLite makes the -wal and -shm files there"
    else:
        reason = str(exc).removeprefix(f"the database {path} cannot be written: ")
    return ReadOnlyError(
        f"cannot write the database {path} ({reason}); to read it, open it with "
        "readonly=True (as the command line's reading commands do)"
    )


def connect_read_only(
    path: str, timeout: float
) -> tuple[sqlite3.Connection, tuple[int, ...] | None]:
    """A connection that reads ``path`` and writes nothing, not even a -wal or -shm
    file; with the file's ``mark`` when it is an immutable snapshot (see the module's
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
    mark = file_mark(path)
    conn = sqlite3.connect(
        uri + "&immutable=1",
        uri=True,
        check_same_thread=False,
        timeout=timeout,
        isolation_level=None,
    )
    return conn, mark


def file_mark(path: str) -> tuple[int, ...]:
    """What tells a change of the file at ``path``: a checkpoint into it, or another
    file in its place. Empty when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return ()
    return found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns


def outdated(path: str, mark: tuple[int, ...]) -> bool:
    """Whether an immutable snapshot of ``path`` taken at ``mark`` may no longer read
    what is committed: another connection opened the database (it made the -shm or
    -wal file), or the file changed."""
    return os.path.exists(path + "-shm") or os.path.exists(path + "-wal") or file_mark(path) != mark


def uri(path: Path) -> str:
    """The SQLite URI of an existing database file, opened read-write, never created."""
    return f"file:{quote(str(path))}?mode=rw"


def probe(
    path: Path, timeout: float, connect: Callable[[], sqlite3.Connection] | None = None
) -> int | None:
    """Refuse a file that is not a reactor database, or one from a newer reactor;
    return its schema version (0: a new database; None: unknown until a hot journal
    is rolled back).

    It reads through a connection that writes nothing, neither the database file (a
    read-write one would rewrite the header to WAL mode, and checkpoint a WAL left
    over into it when it closes) nor files beside it: ``probing``'s, or what
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
                conn, mark = probing(location, timeout)
        except sqlite3.Error as exc:
            raise translate(exc, location) from exc
        try:
            version = read_version(path, conn)
        except ReactorError:
            if mark is None or not opened_since(location, mark):
                raise
            continue  # what it read may be torn: read again, as the other connection does
        finally:
            conn.close()
        if mark is None or not opened_since(location, mark):
            return version


def probing(path: str, timeout: float) -> tuple[sqlite3.Connection, tuple[int, ...] | None]:
    """A connection that reads ``path`` once and creates nothing beside it; with the
    file's ``mark`` when it reads the file alone, ``immutable=1``.

    A ``mode=ro`` connection to a database in WAL mode makes its -wal and -shm files
    when they are missing, and may not delete them when it closes: a database refused
    would be left with two new files. With no -wal file, every commit is in the
    database file and no connection has the database open: it is read alone, with no
    lock and no WAL index (``probe`` reads again if a connection opened it
    meanwhile). A database in rollback mode (or a file that is none) is read
    ``mode=ro``, which makes no file, and which sees a hot journal; so is a database
    whose WAL is there, which it shares (it makes the -shm file only if that one is
    gone alone).
    """
    uri = f"file:{quote(path)}?mode=ro"
    mark = None
    if in_wal_mode(path) and not os.path.exists(path + "-wal"):
        mark = file_mark(path)  # before connecting: a change in between is seen
        uri += "&immutable=1"
    return sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None), mark


def in_wal_mode(path: str) -> bool:
    """Whether the header of the SQLite database at ``path`` says WAL mode (its read
    and write versions are 2)."""
    try:
        with open(path, "rb") as file:
            header = file.read(20)
    except OSError:
        return False
    return header[:16] == b"SQLite format 3\0" and header[18:20] == b"\x02\x02"


def opened_since(path: str, mark: tuple[int, ...]) -> bool:
    """Whether a connection may have opened the database at ``path`` (it made the WAL)
    or changed the file since ``mark``: an immutable read of it may be torn."""
    return os.path.exists(path + "-wal") or file_mark(path) != mark


def read_version(path: Path, conn: sqlite3.Connection) -> int | None:
    """``probe``'s reading, on ``conn``."""
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
            found = conn.execute(VERSION).fetchall()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) == _READONLY_ROLLBACK:
            return None  # a hot journal to roll back first: migrate() will see what it holds
        raise translate(exc, str(path)) from exc
    if not found or type(found[0][0]) is not int:
        shown = ", ".join(sorted(tables)[:5]) or "no table"
        raise StorageError(f"{path} is not a reactor database ({shown}); it was left untouched")
    version: int = found[0][0]
    check_version(version)
    return version


def identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at ``path``; None if there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def check_regular(path: Path) -> None:
    """Refuse, reading only, a path where no database file is.

    Raises:
        ReadOnlyError: there is no file (a read-only open does not create one).
        StorageError: it cannot be read, or is not a regular file.
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


def check_readable_version(path: Path, version: int | None) -> None:
    """Refuse a read-only open of a database that ``probe`` found at ``version``,
    unless it can be read as it is.

    Raises:
        ReadOnlyError: it cannot be read without a write first: it holds no reactor
            database yet, or one that needs migrating, or a hot journal to roll back.
    """
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
