"""The SQL only PostgreSQL runs, and the statements both backends share as PostgreSQL
takes them (``pg``): names in the form its indexes hold them (``indexed_names``), and
psycopg's placeholders."""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "ADD_JOBS",
    "CHANGES",
    "COMMIT_UNFLUSHED",
    "END_FROZEN_WRITERS",
    "FLUSH",
    "MIGRATION_LOCK",
    "ORDER_LOCK",
    "PREPARED_ROWS",
    "READ_AHEAD",
    "RESERVE_IDS",
    "RESERVE_IDS_UNLESS",
    "ROWS_ONLY",
    "SIZE",
    "SYNCHRONOUS_COMMIT",
    "WRITER_NAME",
    "WRITER_PREPARE_THRESHOLD",
    "indexed_names",
    "pg",
]

_converted: dict[str, str] = {}

# A name compared equal to placeholders: [key] = ?, or [key] IN (?, ?, ...).
_NAME_EQUALS: Final = re.compile(r"((?:\w+\.)?)\[(\w+)\] (=|IN) (\?|\((?:\?, )*\?\))")

_NAME: Final = re.compile(r"((?:\w+\.)?)\[(\w+)\]")  # [key], k.[key]


def pg(sql: str) -> str:
    """``sql`` with its names as PostgreSQL indexes them (``indexed_names``) and psycopg's
    placeholders (our statements hold no other ``?`` or ``%``)."""
    found = _converted.get(sql)
    if found is None:
        found = _converted[sql] = indexed_names(sql).replace("?", "%s")
    return found


def indexed_names(sql: str) -> str:
    """``sql`` with each name in brackets (``sql``) as the indexes hold it:
    ``reactor_name(name)`` (``_schema._REACTOR_NAME``). A name compared equal to
    placeholders is compared with ``reactor_name(?)``, the form of the value given; a
    name compared with a bound (``[key] >= ?``, ``[key] < ?``) is compared with the bound
    itself, which is right for bounds of up to ``NAME_INDEXED`` characters, the only ones
    ``sql_text.ranged`` gives: a name that long or shorter is its own form, and a longer one
    sorts among them as its first ``NAME_INDEXED`` characters do."""

    def equals(found: re.Match[str]) -> str:
        table, column, operator, values = found.groups()
        return f"reactor_name({table}{column}) {operator} " + values.replace("?", "reactor_name(?)")

    sql = _NAME_EQUALS.sub(equals, sql)
    return _NAME.sub(r"reactor_name(\1\2)", sql)


# A flush, in one statement run at commit under the order lock: the records take the
# revisions after the last committed one (b.base + n for the n-th), rows staged with a
# provisional revision (-n) take theirs, deleted rows go, and the notification says
# the last revision. Compaction always keeps the newest record (``_schema.changes``).
# The arrays go in binary (``%b``): psycopg's text form escapes every quote and
# backslash of a JSON text through a regular expression, seconds for a few megabytes.
_FLUSH: Final = indexed_names("""
WITH b AS (SELECT COALESCE(MAX(revision), 0) AS base FROM reactor_changes),
logged AS (
    INSERT INTO reactor_changes
        (revision, scope, key, type, old_value, new_value, ops, timestamp, version, timer,
         expires_at)
    SELECT b.base + v.n, v.scope, v.key, v.type, v.old_value, v.new_value, v.ops, v.ts,
           v.version, v.timer, v.expires_at
    FROM b, unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
                   %b::text[], %b::float8[], %b::bigint[], %b::text[], %b::float8[])
        WITH ORDINALITY
        AS v(scope, key, type, old_value, new_value, ops, ts, version, timer, expires_at, n)
),
gone AS (
    DELETE FROM reactor_kv AS k USING unnest(%b::text[], %b::text[]) AS d(scope, key)
    WHERE k.[scope] = d.[scope] AND k.[key] = d.[key]
),
kept AS (
    INSERT INTO reactor_kv (scope, key, value, expires_at, revision, created_revision, version)
    SELECT u.scope, u.key, u.value, u.expires_at,
           CASE WHEN u.revision < 0 THEN b.base - u.revision ELSE u.revision END,
           CASE WHEN u.created < 0 THEN b.base - u.created ELSE u.created END,
           u.version
    FROM b, unnest(%b::text[], %b::text[], %b::text[], %b::float8[], %b::bigint[],
                   %b::bigint[], %b::bigint[])
        AS u(scope, key, value, expires_at, revision, created, version)
    ON CONFLICT ([scope], [key]) DO UPDATE SET value = excluded.value,
        expires_at = excluded.expires_at, revision = excluded.revision,
        created_revision = excluded.created_revision, version = excluded.version
)
""")

# Jobs in one statement of a few arrays: many rows of ?-placeholders would be parsed by
# the driver, every time, at about 6 ms a hundred rows.
ADD_JOBS: Final = (
    "INSERT INTO reactor_jobs (queue, id, item, state, ready_at, attempts, owner, key, "
    "created_at, priority, grp, errors) SELECT * FROM unnest(%b::text[], %b::bigint[], "
    "%b::text[], %b::text[], %b::float8[], %b::int[], %b::text[], %b::text[], %b::float8[], "
    "%b::int[], %b::text[], %b::text[])"
)

# A put of new jobs in one statement (``PostgresJobs.reserve_ids``): the queue's row as
# it was, its next_id moved on (the row locked until the commit), and whether a job holds
# one of the keys (a seek of the index reactor_jobs_key for each, as in READ_AHEAD).
_RESERVED: Final = (
    "RETURNING q.max_attempts, q.next_id - ?, q.concurrency, q.group_concurrency, "
    "q.rate_limit, q.rate_seconds, q.backoff_base, q.backoff_max, EXISTS (SELECT 1 FROM "
    "unnest(?::text[]) AS w(key) CROSS JOIN LATERAL (SELECT 1 FROM reactor_jobs AS j "
    "WHERE j.[queue] = q.[name] AND j.[key] = w.[key] LIMIT 1) AS h)"
)
RESERVE_IDS: Final = pg(
    "UPDATE reactor_queues AS q SET next_id = q.next_id + ? WHERE q.[name] = ? " + _RESERVED
)
# The same, asked as a start begins, before it knows whether its run exists: nothing
# if the run's row does (``Reservation.unless``), so that no id goes unused.
RESERVE_IDS_UNLESS: Final = pg(
    "UPDATE reactor_queues AS q SET next_id = q.next_id + ? WHERE q.[name] = ? AND NOT "
    "EXISTS (SELECT 1 FROM reactor_kv AS k WHERE k.[scope] = ? AND k.[key] = ?) " + _RESERVED
)

# The rows of some keys, of one scope or several, in one statement: one seek of the
# index of names a key. The subquery (LIMIT 1: never merged into a join) makes that the
# plan whatever the statistics say: a plan prepared while the table was new and small
# once read a whole scope for each key (a hash join), the longer the more it held.
READ_AHEAD: Final = pg(
    "SELECT w.scope, w.key, k.value, k.expires_at, k.revision, k.created_revision, "
    "k.version FROM unnest(?::text[], ?::text[]) AS w(scope, key) CROSS JOIN LATERAL "
    "(SELECT r.value, r.expires_at, r.revision, r.created_revision, r.version "
    "FROM reactor_kv AS r WHERE r.[scope] = w.[scope] AND r.[key] = w.[key] LIMIT 1) AS k"
)

CHANGES: Final = _FLUSH + "SELECT b.base, pg_notify(%s, (b.base + %s)::text) FROM b"

# Rows only (a deadline changed, no record): no revision, no notification, no lock.
ROWS_ONLY: Final = _FLUSH + "SELECT b.base, %s, %s FROM b"

SIZE: Final = (
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
    "AND c.relkind = 'r' AND c.relname IN ('reactor_meta', 'reactor_kv', 'reactor_changes', "
    "'reactor_locks', 'reactor_subscribers', 'reactor_failures', 'reactor_timers', "
    "'reactor_queues', 'reactor_jobs')"
)

MIGRATION_LOCK: Final = int.from_bytes(b"reactor", "big")  # one advisory lock key

# The writer prepares a statement on the server at its second run (planning the flush
# took a quarter of a commit); see PostgresStore.reconnect_writer.
WRITER_PREPARE_THRESHOLD: Final = 1

# A statement of more rows than this (the rows read as a write begins, the rows of a
# flush) is planned for its size, not prepared: the prepared plan, made for a few rows,
# made batches of 100 asyncio writes half as fast again to begin.
PREPARED_ROWS: Final = 8

# The order lock, taken as a commit with records begins; with COMMIT_UNFLUSHED it also
# makes the commit under that lock return before its WAL flush, and the transaction
# that then waits for the flush (FLUSH) writes a WAL record (a logical decoding message,
# which any role may write, whatever wal_level), so its commit flushes the WAL, which
# holds the commit before it. FLUSH needs no BEGIN: sent after the COMMIT in the same
# pipeline, it is an implicit transaction that ends at the pipeline's sync; alone, one
# in autocommit mode. (One statement each: every statement is a few dozen microseconds
# of the client's CPU.)
COMMIT_UNFLUSHED: Final = (
    "SELECT pg_advisory_xact_lock(%s), set_config('synchronous_commit', 'off', true)"
)
FLUSH: Final = "SELECT pg_logical_emit_message(true, 'reactor', '')"
ORDER_LOCK: Final = "SELECT pg_advisory_xact_lock(%s)"

# The application_name of reactor's writer connections, and the statement that ends
# those that wait for their client inside a transaction for longer than some seconds
# (``end_frozen_writers``): idle in it, or in the middle of a pipeline the client
# stopped sending (active, waiting to read from the client).
WRITER_NAME: Final = "reactor writer"
END_FROZEN_WRITERS: Final = (
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name = %s "
    "AND (state = 'idle in transaction' OR (state = 'active' AND wait_event = 'ClientRead')) "
    "AND xact_start IS NOT NULL AND pid <> pg_backend_pid() "
    "AND state_change < clock_timestamp() - make_interval(secs => %s)"
)

SYNCHRONOUS_COMMIT: Final = {"normal": "on", "full": "on", "memory": "off"}
