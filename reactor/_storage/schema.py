"""The database schema, its version, and the migrations between versions.

Tables are portable SQLAlchemy Core, one builder a table; each migration creates or alters
what its version added, so a database of any older version reaches the current one step
by step. A table that a later version alters is built in its old shape, and the
current one is that shape with the columns added since (``_kv``, ``_changes``): the old
shape never changes.

SQLAlchemy is imported, and the tables built, on first use (``tables()``, or an attribute
such as ``_schema.kv``): opening a SQLite database whose schema is current needs only
the version and ``check_version``, and skips the import's tenth of a second.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from reactor.errors import SchemaError

from .postgres_names import NAME_INDEXED, NAME_INDEXES, NAMED_PRIMARY_KEYS, REACTOR_NAME

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = [
    "META_TABLE",
    "NAME_INDEXED",
    "SCHEMA_VERSION",
    "Tables",
    "check_version",
    "migrate",
    "tables",
]

SCHEMA_VERSION: Final = 9
META_TABLE: Final = "reactor_meta"  # every version has it, with its "schema_version"


def _name() -> sa.types.TypeEngine[str]:
    """A key, scope or lock name: compared and sorted by code point on every backend
    (SQLite's BINARY; PostgreSQL's "C" collation, whatever the database's default), so
    that the key ranges of glob patterns and the order of ``keys()`` agree. On
    PostgreSQL, indexes hold names as ``reactor_name(name)`` (``_to_v6``)."""
    import sqlalchemy as sa

    return sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql")


def _meta(metadata: sa.MetaData) -> sa.Table:
    """name -> integer: "schema_version", "compacted" (see _to_v4), "compacted_at"
    (see _to_v5)."""
    import sqlalchemy as sa

    return sa.Table(
        META_TABLE,
        metadata,
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )


def _kv(metadata: sa.MetaData, *added: sa.Column[Any]) -> sa.Table:
    """One row per live (or expired, not yet swept) key; value is JSON text. As
    versions 1 to 4 had it, with the columns ``added`` since."""
    import sqlalchemy as sa

    return sa.Table(
        "reactor_kv",
        metadata,
        sa.Column("scope", _name(), primary_key=True),
        sa.Column("key", _name(), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),  # epoch seconds; NULL: no expiry
        sa.Column("revision", sa.BigInteger, nullable=False),  # revision of the last change
        *added,
        sqlite_with_rowid=False,
    )


def _kv_v5() -> tuple[sa.Column[Any], ...]:
    """The columns version 5 adds to reactor_kv."""
    import sqlalchemy as sa

    return (
        sa.Column("created_revision", sa.BigInteger, nullable=False),  # of its creation
        sa.Column("version", sa.BigInteger, nullable=False),  # 1 at creation, +1 a change
    )


def _changes(metadata: sa.MetaData, *added: sa.Column[Any]) -> sa.Table:
    """The change log: one row per committed change, written in the write's transaction,
    as versions 2 to 4 had it, with the columns ``added`` since.

    A new record's revision is the largest one so far plus one (SQLite's INTEGER PRIMARY
    KEY does it itself; on PostgreSQL the writer computes it), and compaction always
    keeps the newest record, so no revision is ever used twice (AUTOINCREMENT would cost
    an extra table write per commit). Writes hold the database's write lock (SQLite's,
    or an advisory lock on PostgreSQL), so revisions come in commit order, with no gaps.
    """
    import sqlalchemy as sa

    return sa.Table(
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
        *added,
    )


def _changes_v5() -> tuple[sa.Column[Any], ...]:
    """The columns version 5 adds to reactor_changes."""
    import sqlalchemy as sa

    return (
        # The key's version after the change (0: the key is gone); NULL before v5.
        sa.Column("version", sa.BigInteger, nullable=True),
        sa.Column("timer", sa.String(64), nullable=True),  # the timer that made it
        # The deadline of the value it shows: the new value's, or for "expired" the
        # one that passed (get(at_revision=) tells whether it had passed by then).
        sa.Column("expires_at", sa.Float, nullable=True),
    )


def _locks(metadata: sa.MetaData) -> sa.Table:
    """Lock leases. A released lock keeps its row: the next token follows the last one."""
    import sqlalchemy as sa

    return sa.Table(
        "reactor_locks",
        metadata,
        sa.Column("name", _name(), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=True),  # NULL: free
        sa.Column("token", sa.BigInteger, nullable=False),  # fencing token of the last holder
        sa.Column("expires_at", sa.Float, nullable=True),
    )


def _timers(metadata: sa.MetaData, *, version: int = SCHEMA_VERSION) -> sa.Table:
    """Timers: scheduled writes (value, or ops), due at an absolute time; when
    recurring, ``every`` seconds apart or at the times a ``cron`` expression names in
    zone ``tz`` (from version 8). The sweeper of any process fires those due."""
    import sqlalchemy as sa

    cron = (
        [sa.Column("cron", sa.Text, nullable=True), sa.Column("tz", sa.Text, nullable=True)]
        if version >= 8
        else []
    )
    return sa.Table(
        "reactor_timers",
        metadata,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("scope", _name(), nullable=False),
        sa.Column("key", _name(), nullable=False),
        sa.Column("due", sa.Float, nullable=False),
        sa.Column("every", sa.Float, nullable=True),
        sa.Column("value", sa.Text, nullable=True),  # JSON text to set, or
        sa.Column("ops", sa.Text, nullable=True),  # update ops to apply
        *cron,
        sa.Column("created_at", sa.Float, nullable=False),
    )


def _queues(metadata: sa.MetaData, *, version: int = SCHEMA_VERSION) -> sa.Table:
    """Work queues: each queue's settings and the id its next job takes (ids never come
    back, so an old job's id never names a new one). From version 9, flow control and
    backoff (NULL: none)."""
    import sqlalchemy as sa

    flow: list[sa.Column[Any]] = (
        [
            sa.Column("concurrency", sa.Integer, nullable=True),
            sa.Column("group_concurrency", sa.Integer, nullable=True),
            sa.Column("rate_limit", sa.Integer, nullable=True),
            sa.Column("rate_seconds", sa.Float, nullable=True),
            sa.Column("backoff_base", sa.Float, nullable=True),
            sa.Column("backoff_max", sa.Float, nullable=True),
        ]
        if version >= 9
        else []
    )
    return sa.Table(
        "reactor_queues",
        metadata,
        sa.Column("name", _name(), primary_key=True),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("next_id", sa.BigInteger, nullable=False),
        *flow,
    )


def _jobs(metadata: sa.MetaData, *, version: int = SCHEMA_VERSION) -> sa.Table:
    """Jobs: "ready" (from ready_at on), "taken" (by owner, until ready_at: the lease's
    end) or "dead"; attempts counts takes. key: a put's idempotency key. From version
    9: priority, group (grp), the errors of its attempts (a JSON list) and its taker
    (worker: JSON host, pid, thread)."""
    import sqlalchemy as sa

    added: list[sa.Column[Any]] = (
        [
            sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
            sa.Column("grp", _name(), nullable=True),
            sa.Column("errors", sa.Text, nullable=True),
            sa.Column("worker", sa.Text, nullable=True),
        ]
        if version >= 9
        else []
    )
    return sa.Table(
        "reactor_jobs",
        metadata,
        sa.Column("queue", _name(), primary_key=True),
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("item", sa.Text, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("ready_at", sa.Float, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("key", _name(), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        *added,
    )


def _takes(metadata: sa.MetaData) -> sa.Table:
    """The takes of queues with a rate limit, within their window (older ones are
    pruned at each take): the sliding window's count (from version 9)."""
    import sqlalchemy as sa

    return sa.Table(
        "reactor_takes",
        metadata,
        sa.Column("queue", _name(), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("job", sa.BigInteger, nullable=False),
    )


def _subscribers(metadata: sa.MetaData) -> sa.Table:
    """Durable subscribers: where each is in the change log, and what it did."""
    import sqlalchemy as sa

    return sa.Table(
        "reactor_subscribers",
        metadata,
        sa.Column("name", _name(), primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),  # the last revision acknowledged
        sa.Column("delivered", sa.BigInteger, nullable=False),
        sa.Column("failed", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def _failures(metadata: sa.MetaData) -> sa.Table:
    """Events a durable subscriber gave up on after its retries."""
    import sqlalchemy as sa

    return sa.Table(
        "reactor_failures",
        metadata,
        sa.Column("name", _name(), primary_key=True),
        sa.Column("revision", sa.BigInteger, primary_key=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("failed_at", sa.Float, nullable=False),
    )


class Tables:
    """The tables of the current version (``tables()`` builds them once, one builder a
    table). On PostgreSQL, the primary keys and indexes over names are those of
    ``_to_v6`` instead."""

    def __init__(self) -> None:
        import sqlalchemy as sa

        self.metadata = metadata = sa.MetaData()
        self.meta = _meta(metadata)
        self.kv = kv = _kv(metadata, *_kv_v5())
        self.kv_expiry = sa.Index(
            "reactor_kv_expiry",
            kv.c.expires_at,
            sqlite_where=kv.c.expires_at.is_not(None),
            postgresql_where=kv.c.expires_at.is_not(None),
        )
        self.changes = changes = _changes(metadata, *_changes_v5())
        # Made by version 3, dropped by version 7 (``_to_v7``).
        self.changes_by_scope = sa.Index(
            "reactor_changes_scope", changes.c.scope, changes.c.revision
        )
        # A key's history (history(), get(at_revision=)) and the changes of some keys
        # since a revision (if_revision= on a write of several keys).
        self.changes_by_key = sa.Index(
            "reactor_changes_key", changes.c.scope, changes.c.key, changes.c.revision
        )
        self.locks = _locks(metadata)
        self.timers = timers = _timers(metadata)
        self.timers_due = sa.Index("reactor_timers_due", timers.c.due, timers.c.id)
        self.queues = _queues(metadata)
        self.jobs = _jobs(metadata)
        self.takes = _takes(metadata)
        # The indexes of jobs and takes are made by _to_v5 and _to_v9 (by hand: on
        # PostgreSQL they hold reactor_name(queue), and one is partial).
        self.subscribers = _subscribers(metadata)
        self.failures = _failures(metadata)


_built: Tables | None = None
_building = threading.Lock()


def tables() -> Tables:
    """The tables (SQLAlchemy imported, and the tables built, on the first call)."""
    global _built  # noqa: PLW0603 - built once, on demand
    with _building:
        if _built is None:
            _built = Tables()
        return _built


_TABLES: Final = (
    "metadata",
    "meta",
    "kv",
    "changes",
    "locks",
    "subscribers",
    "failures",
    "timers",
    "queues",
    "jobs",
    "takes",
)


def __getattr__(name: str) -> Any:
    # _schema.kv and the like (the attributes of Tables), built on first use.
    if name in _TABLES:
        return getattr(tables(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _to_v1(conn: sa.Connection, t: Tables) -> None:
    import sqlalchemy as sa

    t.meta.create(conn)
    _kv(sa.MetaData()).create(conn)  # as version 1 made it
    t.kv_expiry.create(conn)


def _to_v2(conn: sa.Connection, t: Tables) -> None:  # noqa: ARG001 - every step takes both
    import sqlalchemy as sa

    _changes(sa.MetaData()).create(conn)  # as version 2 made it


def _to_v3(conn: sa.Connection, t: Tables) -> None:
    import sqlalchemy as sa

    t.locks.create(conn)
    conn.execute(sa.schema.CreateIndex(t.changes_by_scope, if_not_exists=True))


def _to_v4(conn: sa.Connection, t: Tables) -> None:
    t.subscribers.create(conn)
    t.failures.create(conn)
    # "compacted": every change-log record up to this revision may be gone.
    conn.execute(t.meta.insert().values(name="compacted", value=0))


def _to_v5(conn: sa.Connection, t: Tables) -> None:
    import sqlalchemy as sa

    # A key written before version 5: its history is unknown, so it counts from its last
    # change (created then, version 1); the records before carry no version (NULL).
    for statement in (
        "ALTER TABLE reactor_kv ADD COLUMN created_revision BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE reactor_kv ADD COLUMN version BIGINT NOT NULL DEFAULT 1",
        "UPDATE reactor_kv SET created_revision = revision",
        "ALTER TABLE reactor_changes ADD COLUMN version BIGINT",
        "ALTER TABLE reactor_changes ADD COLUMN timer VARCHAR(64)",
        "ALTER TABLE reactor_changes ADD COLUMN expires_at FLOAT",
    ):
        conn.exec_driver_sql(statement)
    # When the record at the compaction horizon was made (µs); -1: not known.
    conn.execute(t.meta.insert().values(name="compacted_at", value=-1))
    t.changes_by_key.create(conn)
    timers = _timers(sa.MetaData(), version=5)  # as version 5 made it
    timers.create(conn)
    sa.Index("reactor_timers_due", timers.c.due, timers.c.id).create(conn)
    _queues(sa.MetaData(), version=5).create(conn)  # as version 5 made them
    jobs = _jobs(sa.MetaData(), version=5)
    jobs.create(conn)
    # The next job to take (and the next lease to run out): O(log n) in a queue.
    sa.Index("reactor_jobs_ready", jobs.c.queue, jobs.c.state, jobs.c.ready_at, jobs.c.id).create(
        conn
    )
    sa.Index(
        "reactor_jobs_key",
        jobs.c.queue,
        jobs.c.key,
        unique=True,
        sqlite_where=jobs.c.key.is_not(None),
        postgresql_where=jobs.c.key.is_not(None),
    ).create(conn)


def _to_v6(conn: sa.Connection, t: Tables) -> None:  # noqa: ARG001 - every step takes both
    # PostgreSQL: every index over names holds reactor_name(name), which takes a name of
    # any length the spec allows (SQLite's indexes take any length already).
    if conn.dialect.name != "postgresql":
        return

    conn.exec_driver_sql(REACTOR_NAME)
    # The primary keys' names, in one look at the catalog (the inspector takes one a table).
    primary: dict[str, str] = dict(
        conn.exec_driver_sql(
            "SELECT c.relname, k.conname FROM pg_constraint AS k JOIN pg_class AS c "
            "ON c.oid = k.conrelid WHERE k.contype = 'p' "
            "AND c.relnamespace = current_schema()::regnamespace"
        ).all()
    )
    for table in NAMED_PRIMARY_KEYS:
        conn.exec_driver_sql(f'ALTER TABLE {table} DROP CONSTRAINT "{primary[table]}"')
    for statement in NAME_INDEXES:
        conn.exec_driver_sql(statement)


def _to_v7(conn: sa.Connection, t: Tables) -> None:  # noqa: ARG001 - every step takes both
    # The change log's index by scope goes: it cost every write a page of its own (5.3
    # pages of WAL a set, 4.25 without it), for one question, "did this scope change
    # since revision R?" (a transaction's commit), which the revisions after R answer
    # (``sql_text.CHANGED_SINCE``): few, for a transaction's own span.
    conn.exec_driver_sql("DROP INDEX IF EXISTS reactor_changes_scope")


def _to_v8(conn: sa.Connection, t: Tables) -> None:  # noqa: ARG001 - every step takes both
    # Cron timers (SPEC §13): the expression and its zone; NULL for the others.
    conn.exec_driver_sql("ALTER TABLE reactor_timers ADD COLUMN cron TEXT")
    conn.exec_driver_sql("ALTER TABLE reactor_timers ADD COLUMN tz TEXT")


_V9_COLUMNS: Final = (
    "ALTER TABLE reactor_queues ADD COLUMN concurrency INTEGER",
    "ALTER TABLE reactor_queues ADD COLUMN group_concurrency INTEGER",
    "ALTER TABLE reactor_queues ADD COLUMN rate_limit INTEGER",
    "ALTER TABLE reactor_queues ADD COLUMN rate_seconds FLOAT",
    "ALTER TABLE reactor_queues ADD COLUMN backoff_base FLOAT",
    "ALTER TABLE reactor_queues ADD COLUMN backoff_max FLOAT",
    "ALTER TABLE reactor_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE reactor_jobs ADD COLUMN grp {name}",
    "ALTER TABLE reactor_jobs ADD COLUMN errors TEXT",
    "ALTER TABLE reactor_jobs ADD COLUMN worker TEXT",
    "DROP INDEX reactor_jobs_key",
    # Not unique any more: a debounced put adds a job beside a taken one of its key.
    "CREATE INDEX reactor_jobs_key ON reactor_jobs ({queue}, {key}) WHERE key IS NOT NULL",
    # The first job of a priority other than 0: an empty index unless priorities are used.
    (
        "CREATE INDEX reactor_jobs_priority ON reactor_jobs "
        "({queue}, priority DESC, ready_at, id) WHERE state = 'ready' AND priority <> 0"
    ),
    "CREATE INDEX reactor_takes_at ON reactor_takes ({queue}, at)",
)


def _to_v9(conn: sa.Connection, t: Tables) -> None:
    # Flow control on queues, job management (SPEC §13): the queues' settings, the jobs'
    # priority, group, errors and taker, and the takes of the rate windows.
    t.takes.create(conn)
    postgres = conn.dialect.name == "postgresql"
    names = {
        "name": 'VARCHAR(1024) COLLATE "C"' if postgres else "VARCHAR(1024)",
        "queue": "reactor_name(queue)" if postgres else "queue",
        "key": "reactor_name(key)" if postgres else "key",
    }
    for statement in _V9_COLUMNS:
        conn.exec_driver_sql(statement.format(**names))


MIGRATIONS: Final[dict[int, Callable[[sa.Connection, Tables], None]]] = {
    1: _to_v1,
    2: _to_v2,
    3: _to_v3,
    4: _to_v4,
    5: _to_v5,
    6: _to_v6,
    7: _to_v7,
    8: _to_v8,
    9: _to_v9,
}


def stored_version(conn: sa.Connection) -> int:
    """The schema version a database holds; 0 for an empty database."""
    import sqlalchemy as sa

    meta = tables().meta
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
    t = tables()
    with engine.begin() as conn:
        version = stored_version(conn)
        check_version(version)
        for step in range(version + 1, target + 1):
            MIGRATIONS[step](conn, t)
        if target > version:
            if version == 0:
                conn.execute(t.meta.insert().values(name="schema_version", value=target))
            else:
                conn.execute(
                    t.meta.update().where(t.meta.c.name == "schema_version").values(value=target)
                )
    return version
