"""The database schema, its version, and the migrations between versions.

Tables are portable SQLAlchemy Core; each migration creates or alters what its version
added, so a database of any older version reaches the current one step by step. A table
that a later version alters must get a frozen copy of its old shape in its migration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import sqlalchemy as sa

from .errors import SchemaError

__all__ = [
    "META_TABLE",
    "SCHEMA_VERSION",
    "changes",
    "check_version",
    "kv",
    "locks",
    "meta",
    "migrate",
]

SCHEMA_VERSION: Final = 4
META_TABLE: Final = "reactor_meta"  # every version has it, with its "schema_version"

metadata = sa.MetaData()


def _name() -> sa.types.TypeEngine[str]:
    """A key, scope or lock name: compared and sorted by code point on every backend
    (SQLite's BINARY; PostgreSQL's "C" collation, whatever the database's default), so
    that the key ranges of glob patterns and the order of ``keys()`` agree."""
    return sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql")


# name -> integer: "schema_version", and "compacted" (see _to_v4).
meta = sa.Table(
    META_TABLE,
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

# One row per live (or expired, not yet swept) key. value is JSON text.
kv = sa.Table(
    "reactor_kv",
    metadata,
    sa.Column("scope", _name(), primary_key=True),
    sa.Column("key", _name(), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),  # epoch seconds; NULL: no expiry
    sa.Column("revision", sa.BigInteger, nullable=False),  # revision of the last change
    sqlite_with_rowid=False,
)
_kv_expiry = sa.Index(
    "reactor_kv_expiry",
    kv.c.expires_at,
    sqlite_where=kv.c.expires_at.is_not(None),
    postgresql_where=kv.c.expires_at.is_not(None),
)

# The change log: one row per committed change, written in the write's transaction.
# A new record's revision is the largest one so far plus one (SQLite's INTEGER PRIMARY
# KEY does it itself; on PostgreSQL the writer computes it), and compaction always keeps
# the newest record, so no revision is ever used twice (AUTOINCREMENT would cost an
# extra table write per commit). Writes hold the database's write lock (SQLite's, or
# an advisory lock on PostgreSQL), so revisions come in commit order, with no gaps.
changes = sa.Table(
    "reactor_changes",
    metadata,
    sa.Column(
        "revision",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=False,
    ),
    sa.Column("scope", _name(), nullable=False),
    sa.Column("key", _name(), nullable=False),
    sa.Column("type", sa.String(16), nullable=False),
    sa.Column("old_value", sa.Text, nullable=True),
    sa.Column("new_value", sa.Text, nullable=True),
    sa.Column("ops", sa.Text, nullable=True),
    sa.Column("timestamp", sa.Float, nullable=False),
)


# Lock leases. A released lock keeps its row: the next token follows the last one.
locks = sa.Table(
    "reactor_locks",
    metadata,
    sa.Column("name", _name(), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=True),  # NULL: free
    sa.Column("token", sa.BigInteger, nullable=False),  # fencing token of the last holder
    sa.Column("expires_at", sa.Float, nullable=True),
)
# A transaction's commit asks whether its scope changed since it began.
_changes_by_scope = sa.Index("reactor_changes_scope", changes.c.scope, changes.c.revision)


# Durable subscribers: where each is in the change log, and what it did.
subscribers = sa.Table(
    "reactor_subscribers",
    metadata,
    sa.Column("name", _name(), primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),  # the last revision acknowledged
    sa.Column("delivered", sa.BigInteger, nullable=False),
    sa.Column("failed", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)
# Events a durable subscriber gave up on after its retries.
failures = sa.Table(
    "reactor_failures",
    metadata,
    sa.Column("name", _name(), primary_key=True),
    sa.Column("revision", sa.BigInteger, primary_key=True),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("failed_at", sa.Float, nullable=False),
)


def _to_v1(conn: sa.Connection) -> None:
    meta.create(conn)
    kv.create(conn)


def _to_v2(conn: sa.Connection) -> None:
    changes.create(conn)  # with its index of version 3, hence checkfirst below


def _to_v3(conn: sa.Connection) -> None:
    locks.create(conn)
    _changes_by_scope.create(conn, checkfirst=True)


def _to_v4(conn: sa.Connection) -> None:
    subscribers.create(conn)
    failures.create(conn)
    # "compacted": every change-log record up to this revision may be gone.
    conn.execute(meta.insert().values(name="compacted", value=0))


MIGRATIONS: Final[dict[int, Callable[[sa.Connection], None]]] = {
    1: _to_v1,
    2: _to_v2,
    3: _to_v3,
    4: _to_v4,
}


def stored_version(conn: sa.Connection) -> int:
    """The schema version a database holds; 0 for an empty database."""
    if not sa.inspect(conn).has_table(meta.name):
        return 0
    found = conn.execute(
        sa.select(meta.c.value).where(meta.c.name == "schema_version")
    ).scalar_one_or_none()
    return int(found) if found is not None else 0


def check_version(version: int) -> None:
    """Raise unless this reactor understands schema ``version``.

    Raises:
        SchemaError: the database is from a newer version of reactor.
    """
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"the database has schema version {version}, newer than this reactor "
            f"understands ({SCHEMA_VERSION}); upgrade reactor to open it"
        )


def migrate(engine: sa.Engine, target: int = SCHEMA_VERSION) -> int:
    """Bring the database to version ``target`` in one transaction; return the old version.

    Raises:
        SchemaError: the database is from a newer version of reactor (nothing is written).
    """
    with engine.begin() as conn:
        version = stored_version(conn)
        check_version(version)
        for step in range(version + 1, target + 1):
            MIGRATIONS[step](conn)
        if target > version:
            if version == 0:
                conn.execute(meta.insert().values(name="schema_version", value=target))
            else:
                conn.execute(
                    meta.update().where(meta.c.name == "schema_version").values(value=target)
                )
    return version
