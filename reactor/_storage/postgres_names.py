"""How PostgreSQL indexes names (schema version 6): ``reactor_name(name)``, a bounded
form of any name the spec allows, and the indexes built over it."""

from __future__ import annotations

from typing import Final

__all__ = ["NAMED_PRIMARY_KEYS", "NAME_INDEXED", "NAME_INDEXES", "REACTOR_NAME"]

# A PostgreSQL index holds a name (scope, key, queue, lock, durable subscriber) as
# reactor_name(name): the name itself up to this many characters, else its first ones
# and the SHA-256 of the whole.
NAME_INDEXED: Final = 256

# The bounded form of a name that PostgreSQL indexes: a B-tree entry holds at most 2,704
# bytes, and a name may have 1,024 characters of up to 4 bytes each (two of them in the
# index of keys). A name of up to NAME_INDEXED characters is itself, so the index keeps
# the order of names, and a range of names up to that length is a range of the index
# (``sql_text.ranged``). A longer name is its first NAME_INDEXED characters followed by the
# hex SHA-256 of its bytes: 1,088 bytes at most, distinct for distinct names (SHA-256 is
# collision-resistant), in the order of the names' first NAME_INDEXED characters.
# decode(..., 'escape') of the text with its backslashes doubled is its bytes, as
# convert_to() would give them in a UTF-8 database, but immutable, as an index needs.
# PL/pgSQL, not SQL: PostgreSQL would inline an SQL function, parsing its body again in
# every statement it plans (a tenth of a millisecond a lookup, measured); PL/pgSQL is
# compiled once per connection.
REACTOR_NAME: Final = rf"""
CREATE FUNCTION reactor_name(text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    IF pg_catalog.length($1) <= {NAME_INDEXED} THEN
        RETURN $1;
    END IF;
    RETURN pg_catalog.left($1, {NAME_INDEXED}) OPERATOR(pg_catalog.||) pg_catalog.encode(
        pg_catalog.sha256(pg_catalog.decode(
            pg_catalog.replace($1, E'\\', E'\\\\'), 'escape')), 'hex');
END
$$"""
# The tables whose primary key holds a name: it goes (a PostgreSQL primary key is a
# B-tree over the columns themselves), and a unique index in NAME_INDEXES takes its place.
NAMED_PRIMARY_KEYS: Final = (
    "reactor_kv",
    "reactor_locks",
    "reactor_queues",
    "reactor_jobs",
    "reactor_subscribers",
    "reactor_failures",
)
# The indexes over names, built anew over reactor_name(name).
NAME_INDEXES: Final = (
    "CREATE UNIQUE INDEX reactor_kv_name ON reactor_kv (reactor_name(scope), reactor_name(key))",
    "DROP INDEX reactor_changes_scope",
    "CREATE INDEX reactor_changes_scope ON reactor_changes (reactor_name(scope), revision)",
    "DROP INDEX reactor_changes_key",
    (
        "CREATE INDEX reactor_changes_key ON reactor_changes "
        "(reactor_name(scope), reactor_name(key), revision)"
    ),
    "CREATE UNIQUE INDEX reactor_locks_name ON reactor_locks (reactor_name(name))",
    "CREATE UNIQUE INDEX reactor_queues_name ON reactor_queues (reactor_name(name))",
    "CREATE UNIQUE INDEX reactor_jobs_id ON reactor_jobs (reactor_name(queue), id)",
    "DROP INDEX reactor_jobs_ready",
    "CREATE INDEX reactor_jobs_ready ON reactor_jobs (reactor_name(queue), state, ready_at, id)",
    "DROP INDEX reactor_jobs_key",
    (
        "CREATE UNIQUE INDEX reactor_jobs_key ON reactor_jobs "
        "(reactor_name(queue), reactor_name(key)) WHERE key IS NOT NULL"
    ),
    "CREATE UNIQUE INDEX reactor_subscribers_name ON reactor_subscribers (reactor_name(name))",
    "CREATE UNIQUE INDEX reactor_failures_name ON reactor_failures (reactor_name(name), revision)",
)
