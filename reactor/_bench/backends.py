"""Where ``reactor bench`` keeps reactor's database: SQLite files, or PostgreSQL schemas.

Only the reactor peer changes with the backend; the other peers always keep their files
in the mode's directory. A location is what ``ReactorPeer`` (and its process workers)
open: a directory on SQLite, a ``postgresql+psycopg://`` URL whose ``search_path``
names a fresh schema on PostgreSQL.
"""

from __future__ import annotations

import os
import re
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Final

import sqlalchemy as sa

__all__ = [
    "DEFAULT_POSTGRES_URL",
    "POSTGRES_URL_ENV",
    "Backend",
    "BackendUnavailable",
    "PostgresBackend",
    "SQLiteBackend",
    "connect_backend",
    "default_postgres_url",
    "libpq_environment",
]

DEFAULT_POSTGRES_URL: Final = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
POSTGRES_URL_ENV: Final = ("REACTOR_BENCH_POSTGRES_URL", "REACTOR_TEST_POSTGRES_URL")
_CONNECT_TIMEOUT: Final = 3  # seconds


class BackendUnavailable(Exception):
    """The backend asked for cannot be used here (the message says why)."""


class Backend:
    """Where reactor's database lives during a run."""

    name: str
    leftovers: list[str]
    """What could not be removed after the run, each with the reason."""

    def describe(self) -> str:
        """One line for the report: where reactor's database lives."""
        raise NotImplementedError

    def about(self) -> dict[str, Any]:
        """The backend, for the JSON file."""
        raise NotImplementedError

    def location(self, directory: str, tag: str) -> AbstractContextManager[str]:
        """Where reactor opens a fresh database for ``tag`` (``directory`` is the mode's
        fresh directory), removed afterwards."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds."""


class SQLiteBackend(Backend):
    """SQLite: reactor's database is a file in the mode's directory."""

    name = "sqlite"

    def __init__(self) -> None:
        self.leftovers = []

    def describe(self) -> str:
        return f"SQLite {sqlite3.sqlite_version} files (fresh per mode)"

    def about(self) -> dict[str, Any]:
        return {"name": self.name, "version": sqlite3.sqlite_version, "describe": self.describe()}

    @contextmanager
    def location(self, directory: str, tag: str) -> Iterator[str]:  # noqa: ARG002 - same call as Backend.location
        yield directory


class PostgresBackend(Backend):
    """PostgreSQL: each location is a fresh schema, dropped (with its tables) after."""

    name = "postgresql"

    def __init__(self, url: str) -> None:
        import psycopg

        try:
            self._url = sa.make_url(url)
        except sa.exc.ArgumentError as exc:
            raise BackendUnavailable(f"not a database URL: {url!r} ({exc})") from None
        if self._url.get_backend_name() != "postgresql":
            raise BackendUnavailable(
                f"--backend postgresql needs a postgresql+psycopg:// URL, "
                f"not {self._url.drivername}://"
            )
        self._url = self._url.set(drivername="postgresql+psycopg")
        admin = self._url.set(drivername="postgresql").difference_update_query(["options"])
        try:
            self._admin = psycopg.connect(
                admin.render_as_string(hide_password=False),
                autocommit=True,
                connect_timeout=_CONNECT_TIMEOUT,
            )
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BackendUnavailable(
                f"no PostgreSQL server answered at {self.address()}: {reason}"
            ) from None
        self._admin.execute("SET lock_timeout = '10s'")
        self._version = _version(self._admin.info.server_version)
        self._run = uuid.uuid4().hex[:8]
        self._schemas: list[str] = []
        self._made = 0
        self.leftovers = []

    def address(self) -> str:
        """``host:port/database`` of the server (no user, no password)."""
        url = self._url
        return f"{url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}"

    def describe(self) -> str:
        return f"PostgreSQL {self._version} at {self.address()} (schema per mode)"

    def about(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self._version,
            "url": self._url.render_as_string(hide_password=True),
            "describe": self.describe(),
        }

    @contextmanager
    def location(self, directory: str, tag: str) -> Iterator[str]:  # noqa: ARG002 - same call as Backend.location
        safe = re.sub(r"[^a-z0-9]+", "_", tag.lower())[:24]
        self._made += 1
        schema = f"reactor_bench_{self._run}_{self._made}_{safe}"
        self._admin.execute(f'CREATE SCHEMA "{schema}"')
        self._schemas.append(schema)
        try:
            yield self._url_for(schema)
        finally:
            self._drop(schema)

    def _url_for(self, schema: str) -> str:
        """The URL of a reactor database in ``schema`` (other ``options`` kept)."""
        given = self._url.query.get("options")
        before = f"{given} " if isinstance(given, str) and given else ""
        url = self._url.update_query_dict({"options": f"{before}-csearch_path={schema}"})
        return url.render_as_string(hide_password=False)

    def _drop(self, schema: str) -> None:
        import psycopg

        try:
            self._admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        except psycopg.Error as exc:
            self.leftovers.append(f"{schema}: {str(exc).strip()}")
        else:
            self._schemas.remove(schema)

    def close(self) -> None:
        """Drop what is left (again, for what failed before), then disconnect."""
        self.leftovers.clear()
        for schema in list(self._schemas):
            self._drop(schema)
        self._admin.close()


def _version(number: int) -> str:
    """``150020`` as ``15.20`` (PostgreSQL 10 and later)."""
    return f"{number // 10_000}.{number % 10_000}"


def connect_backend(name: str, url: str | None = None) -> Backend:
    """The backend ``name`` (``sqlite`` or ``postgresql``, the latter on ``url``).

    Raises:
        BackendUnavailable: psycopg is missing, or no server answers at ``url``.
    """
    if name == "sqlite":
        return SQLiteBackend()
    try:
        import psycopg  # noqa: F401 - only to say it is missing
    except ImportError:
        raise BackendUnavailable(
            "--backend postgresql needs psycopg 3: pip install 'reactor-state[postgresql]'"
        ) from None
    return PostgresBackend(url or default_postgres_url())


def default_postgres_url() -> str:
    """The URL from the environment, else the local server's."""
    for variable in POSTGRES_URL_ENV:
        found = os.environ.get(variable)
        if found:
            return found
    return DEFAULT_POSTGRES_URL


def libpq_environment(url: str) -> dict[str, str]:
    """The ``PG*`` variables that point a libpq program (pgbench) at ``url``, its
    ``options`` (the schema's ``search_path``) and ``host`` query included."""
    parsed = sa.make_url(url)
    found = {"PGCONNECT_TIMEOUT": str(_CONNECT_TIMEOUT)}
    for variable, value in (
        ("PGHOST", parsed.host or parsed.query.get("host")),
        ("PGPORT", parsed.port),
        ("PGUSER", parsed.username),
        ("PGPASSWORD", parsed.password),
        ("PGDATABASE", parsed.database),
        ("PGOPTIONS", parsed.query.get("options")),
    ):
        if isinstance(value, (str, int)) and value != "":
            found[variable] = str(value)
    return found
