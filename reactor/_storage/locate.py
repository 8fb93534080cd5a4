"""Where ``open()``'s target points: a SQLite file, a PostgreSQL URL, or memory; the
key under which this process shares one engine for it; and the store that opens it
(``open_store``: nothing outside ``_storage`` names a backend)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

from reactor.errors import (
    BusyError,
    InvalidArgumentError,
    ReadOnlyError,
    SchemaError,
    StorageError,
)

if TYPE_CHECKING:  # SQLAlchemy is imported when used: only for PostgreSQL
    import sqlalchemy as sa

    from .store import Store, StoreReads

__all__ = ["DEFAULT_PATH", "default_folder", "leave_if_moved", "locate", "open_store"]

DEFAULT_PATH: Final = Path("~/.reactor/state.db")


def locate(
    target: str | os.PathLike[str] | None, durability: str
) -> tuple[str | None, Path | sa.URL | None]:
    """The registry key and location (a file path, a PostgreSQL URL, or None in memory)
    for what ``open`` was given. The key is None for a private in-memory database.

    Raises:
        InvalidArgumentError: ``target`` is not a path or a supported URL.
        StorageError: it starts with ``~`` and there is no home folder.
    """
    if target is None:
        target = os.environ.get("REACTOR_DB") or DEFAULT_PATH
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if not isinstance(target, str) or not target:
        raise InvalidArgumentError(f"open() takes a path or URL, not {target!r}")
    if target in (":memory:", "sqlite://", "sqlite:///:memory:"):
        return None, None
    if target.startswith(":memory:"):
        return f"memory:{target[len(':memory:') :]}", None
    if "://" in target:
        scheme, _, rest = target.partition("://")
        if scheme.partition("+")[0] in ("postgresql", "postgres"):
            from .postgres import normalize_url

            url = normalize_url(target)
            return f"postgresql:{url.render_as_string(hide_password=True)}", url
        if scheme not in ("sqlite", "sqlite+pysqlite"):
            raise InvalidArgumentError(
                f"unsupported database URL scheme {scheme!r}: use a file path, "
                "':memory:', a sqlite:/// URL or a postgresql+psycopg:// URL"
            )
        if not rest.startswith("/"):
            raise InvalidArgumentError(f"a sqlite URL needs three slashes: {target!r}")
        target = rest[1:].partition("?")[0]
        if target in ("", ":memory:"):
            return None, None
    path = _file_path(target)
    if durability == "memory":
        return f"memory-file:{path}", None
    return f"file:{os.path.realpath(path)}", path


def open_store(
    location: Path | sa.URL | None, *, durability: str, timeout: float, readonly: bool
) -> Store:
    """The store of ``location`` (``locate``'s), opened.

    Raises:
        SchemaError: the database comes from a newer reactor.
        ReadOnlyError: it cannot be written (read-only: it cannot be read as it is).
        StorageError: it cannot be opened.
    """
    from .sqlite import SQLiteStore

    if location is None or isinstance(location, Path):
        try:
            return SQLiteStore(location, durability=durability, timeout=timeout, readonly=readonly)
        except (ReadOnlyError, SchemaError, BusyError):
            raise
        except StorageError as exc:
            if location is None or str(location) in str(exc):
                raise
            raise StorageError(f"cannot open {location}: {exc}") from exc
    from .postgres import PostgresStore  # SQLAlchemy and psycopg: only for PostgreSQL

    return PostgresStore(location, durability=durability, timeout=timeout, readonly=readonly)


def leave_if_moved(store: StoreReads) -> bool:
    """Whether ``store`` is a SQLite database whose file was removed or replaced while
    open: then its files are taken off the path (``SQLiteStore.leave_path``)."""
    from .sqlite import SQLiteStore

    if isinstance(store, SQLiteStore) and store.moved():
        store.leave_path()
        return True
    return False


def default_folder() -> Path | None:
    """The folder of ``DEFAULT_PATH``, or None when there is no home folder."""
    try:
        return DEFAULT_PATH.expanduser().parent
    except RuntimeError:  # no home folder: the default path is not in use either
        return None


def _file_path(target: str) -> Path:
    """The absolute path of a SQLite database file.

    Raises:
        InvalidArgumentError: it holds NUL, or is not valid UTF-8 (SQLite cannot name it).
        StorageError: it starts with ``~`` and there is no home folder.
    """
    if "\x00" in target:
        raise InvalidArgumentError(f"a database path cannot hold a NUL character: {target!r}")
    try:
        target.encode()
    except UnicodeEncodeError:
        # A file name that is not UTF-8 (os.fsdecode's surrogates): SQLite cannot name it.
        raise InvalidArgumentError(
            f"a database path must be valid UTF-8 for SQLite: {target!r}"
        ) from None
    try:
        return Path(target).expanduser().absolute()
    except RuntimeError as exc:  # "~" with neither $HOME nor a passwd entry
        raise StorageError(
            f"cannot find the home folder for {target!r} (set HOME, or REACTOR_DB)"
        ) from exc
