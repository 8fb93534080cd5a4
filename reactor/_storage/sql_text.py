"""The SQL that both backends run, written once with ``?`` placeholders (see ``sql``
for the bracketed names), and the helpers that assemble it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, TypeVar

from reactor._base.keys import successor

from .records import JobRow, QueueRow
from .schema import NAME_INDEXED

T = TypeVar("T")

_LIVE: Final = "(expires_at IS NULL OR expires_at > ?)"
GET: Final = f"SELECT value FROM reactor_kv WHERE [scope] = ? AND [key] = ? AND {_LIVE}"
GET_ENTRY: Final = (
    f"SELECT value, expires_at FROM reactor_kv WHERE [scope] = ? AND [key] = ? AND {_LIVE}"
)
ITEMS: Final = f"SELECT key, value FROM reactor_kv WHERE [scope] = ? AND {_LIVE}"
KEYS: Final = f"SELECT key FROM reactor_kv WHERE [scope] = ? AND {_LIVE}"
RANGE: Final = " AND [key] >= ?"
RANGE_END: Final = " AND [key] < ?"
SCOPES: Final = f"SELECT DISTINCT scope FROM reactor_kv WHERE {_LIVE} ORDER BY scope"
COUNTS: Final = f"SELECT scope, COUNT(*) FROM reactor_kv WHERE {_LIVE} GROUP BY scope"
# Every live key, in the order of the primary key (an export's, streamed).
ALL_LIVE_ROWS: Final = (
    f"SELECT scope, key, value, expires_at FROM reactor_kv WHERE {_LIVE} ORDER BY scope, key"
)
STREAMED_ROWS: Final = 100  # rows a streamed read (``Reads.each``) fetches at a time
EXPIRED: Final = (
    "SELECT scope, key FROM reactor_kv WHERE expires_at IS NOT NULL AND expires_at <= ?"
)
ROW_COLUMNS: Final = "value, expires_at, revision, created_revision, version"
ROW: Final = f"SELECT {ROW_COLUMNS} FROM reactor_kv WHERE [scope] = ? AND [key] = ?"
LIVE_ROW: Final = f"{ROW} AND {_LIVE}"
ROWS: Final = f"SELECT key, {ROW_COLUMNS} FROM reactor_kv WHERE [scope] = ?"
UPSERT: Final = (
    "INSERT INTO reactor_kv (scope, key, value, expires_at, revision, created_revision, "
    "version) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT ([scope], [key]) DO UPDATE SET value = excluded.value, "
    "expires_at = excluded.expires_at, revision = excluded.revision, "
    "created_revision = excluded.created_revision, version = excluded.version"
)
DELETE: Final = "DELETE FROM reactor_kv WHERE [scope] = ? AND [key] = ?"
REVISION: Final = "SELECT COALESCE(MAX(revision), 0) FROM reactor_changes"
# Whether a scope changed after a revision: on the revisions after it (the primary key),
# the scope compared in each record. "scope || ''" keeps any index of names out (there
# is none by scope: see _schema._to_v7); ORDER BY the key makes PostgreSQL walk it too.
CHANGED_SINCE: Final = (
    "SELECT 1 FROM reactor_changes WHERE revision > ? AND scope || '' = ? ORDER BY revision LIMIT 1"
)
COMPACT_UPTO: Final = "DELETE FROM reactor_changes WHERE revision <= ?"
# The failures of durable subscribers go with the log's events (a failed event gone from
# the log can be replayed no more), but each subscriber's latest, which says why it failed.
PRUNE_FAILURES: Final = (
    "DELETE FROM reactor_failures WHERE revision <= ? AND revision < "
    "(SELECT MAX(g.revision) FROM reactor_failures g WHERE g.[name] = reactor_failures.[name])"
)
# By age: everything below the oldest revision still young enough, so that the log
# stays a contiguous range even if timestamps do not rise with revisions; the newest
# record always stays (it holds the revision counter: see _schema.changes).
YOUNGEST_KEPT: Final = (
    "SELECT COALESCE((SELECT MIN(revision) FROM reactor_changes WHERE timestamp >= ?), "
    "(SELECT MAX(revision) FROM reactor_changes))"
)
LAST_TO_GO: Final = (
    "SELECT revision, timestamp FROM reactor_changes WHERE revision <= ? "
    "ORDER BY revision DESC LIMIT 1"
)
# The revisions the change log holds (a contiguous range: compaction deletes from the
# oldest): two seeks of the primary key, where COUNT(*) would read the whole log.
LOG_SPAN: Final = "SELECT MIN(revision), MAX(revision) FROM reactor_changes"
COMPACTED: Final = "SELECT value FROM reactor_meta WHERE name = 'compacted'"
# When the record at the horizon was made, in microseconds (-1: not known, a database
# compacted before version 5).
SET_COMPACTED_AT: Final = "UPDATE reactor_meta SET value = ? WHERE name = 'compacted_at'"
SLOWEST: Final = "SELECT MIN(position) FROM reactor_subscribers"
RECORD_COLUMNS: Final = (
    "scope, key, type, old_value, new_value, ops, revision, timestamp, version, timer"
)
LOG_AFTER: Final = (
    f"SELECT {RECORD_COLUMNS} "
    "FROM reactor_changes WHERE revision > ? AND revision <= ? ORDER BY revision LIMIT ?"
)
# The same, of some scopes only ({}: their placeholders).
LOG_AFTER_IN: Final = (
    f"SELECT {RECORD_COLUMNS} FROM reactor_changes "
    "WHERE revision > ? AND revision <= ? AND [scope] IN ({}) ORDER BY revision LIMIT ?"
)
POSITION: Final = "SELECT position FROM reactor_subscribers WHERE [name] = ?"
SUBSCRIBERS: Final = "SELECT name, position, delivered, failed FROM reactor_subscribers"
# Each durable subscriber's last failure: how many it has on record, and the latest one.
LAST_FAILURES: Final = (
    "SELECT f.[name], f.revision, f.error, f.failed_at, "
    "(SELECT COUNT(*) FROM reactor_failures c WHERE c.[name] = f.[name]) "
    "FROM reactor_failures f WHERE f.revision = "
    "(SELECT MAX(g.revision) FROM reactor_failures g WHERE g.[name] = f.[name])"
)
SAVE_POSITION: Final = (
    "INSERT INTO reactor_subscribers (name, position, delivered, failed, updated_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT ([name]) DO UPDATE SET position = excluded.position, "
    "delivered = excluded.delivered, failed = excluded.failed, updated_at = excluded.updated_at"
)
RECORD_FAILURE: Final = (
    "INSERT INTO reactor_failures (name, revision, error, failed_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT ([name], revision) DO UPDATE SET error = excluded.error, "
    "failed_at = excluded.failed_at"
)
LOCK: Final = "SELECT owner, token, expires_at FROM reactor_locks WHERE [name] = ?"
SAVE_LOCK: Final = (
    "INSERT INTO reactor_locks (name, owner, token, expires_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT ([name]) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
    "expires_at = excluded.expires_at"
)
LOCKS_HELD: Final = "SELECT COUNT(*) FROM reactor_locks WHERE owner IS NOT NULL AND expires_at > ?"
HELD_LOCKS: Final = (
    "SELECT name, owner, token, expires_at FROM reactor_locks "
    "WHERE owner IS NOT NULL AND expires_at > ? ORDER BY name LIMIT ?"
)
# On the index reactor_changes_key (scope, key, revision): a key's records, in order.
HISTORY: Final = (
    f"SELECT {RECORD_COLUMNS} "
    "FROM reactor_changes WHERE [scope] = ? AND [key] = ? ORDER BY revision DESC LIMIT ?"
)
KEY_HISTORY: Final = (
    f"SELECT {RECORD_COLUMNS} "
    "FROM reactor_changes WHERE [scope] = ? AND [key] = ? AND revision > ? ORDER BY revision "
    "LIMIT ?"
)
# The value of a key at revision R, in one statement (one snapshot): the old value of
# its first change after R if there is one, else its row now; and the time of R, since
# a deadline passed by then made the key absent although no record says so yet.
VALUE_AT: Final = (
    "SELECT 0, type, old_value, expires_at FROM (SELECT type, old_value, expires_at "
    "FROM reactor_changes "
    "WHERE [scope] = ? AND [key] = ? AND revision > ? ORDER BY revision LIMIT 1) AS first_after "
    "UNION ALL SELECT 1, NULL, value, expires_at FROM reactor_kv WHERE [scope] = ? AND [key] = ? "
    "UNION ALL SELECT 2, NULL, NULL, timestamp FROM reactor_changes WHERE revision = ? "
    "UNION ALL SELECT 3, NULL, NULL, value FROM reactor_meta WHERE name = 'compacted' "
    "UNION ALL SELECT 4, NULL, NULL, MAX(revision) FROM reactor_changes "
    "UNION ALL SELECT 5, NULL, NULL, value FROM reactor_meta WHERE name = 'compacted_at'"
)
SCOPE_CHANGED_KEYS: Final = (
    "SELECT DISTINCT key FROM reactor_changes WHERE [scope] = ? AND revision > ?"
)
# The same for any key of the scope: on the revisions after it, as CHANGED_SINCE.
SCOPE_CHANGES_SINCE: Final = (
    "SELECT key FROM reactor_changes WHERE revision > ? AND scope || '' = ? ORDER BY revision"
)
# Whether any of some keys changed after a revision (if_revision on a write of several).
KEYS_CHANGED_SINCE: Final = (
    "SELECT 1 FROM reactor_changes WHERE [scope] = ? AND [key] IN ({}) AND revision > ? LIMIT 1"
)
# Timers (reactor_timers): on the index reactor_timers_due (due, id).
TIMER_COLUMNS: Final = "id, scope, key, due, every, value, ops, cron, tz"
TIMER_INSERT: Final = (
    "INSERT INTO reactor_timers (id, scope, key, due, every, value, ops, cron, tz, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
TIMER: Final = f"SELECT {TIMER_COLUMNS} FROM reactor_timers WHERE id = ?"
TIMERS_DUE: Final = "SELECT id, scope, key FROM reactor_timers WHERE due <= ?"
TIMERS: Final = f"SELECT {TIMER_COLUMNS} FROM reactor_timers ORDER BY due, id"
# ORDER BY ... LIMIT 1 rather than MIN(): see NEXT_TIMES.
NEXT_TIMER: Final = "SELECT due FROM reactor_timers WHERE due > ? ORDER BY due LIMIT 1"
# The oldest upkeep work not done yet (``overdue``): a key past its deadline, a due
# timer, a lease run out (the earliest of each queue, one seek a queue).
FIRST_EXPIRED: Final = (
    "SELECT expires_at FROM reactor_kv WHERE expires_at IS NOT NULL AND expires_at <= ? "
    "ORDER BY expires_at LIMIT 1"
)
FIRST_DUE_TIMER: Final = "SELECT due FROM reactor_timers WHERE due <= ? ORDER BY due LIMIT 1"
FIRST_LEASE_END: Final = (
    "SELECT MIN((SELECT j.ready_at FROM reactor_jobs AS j WHERE j.[queue] = q.[name] "
    "AND j.state = 'taken' ORDER BY j.ready_at LIMIT 1)) FROM reactor_queues AS q"
)
TIMERS_BY_ID: Final = f"SELECT {TIMER_COLUMNS} FROM reactor_timers WHERE id IN ({{}})"
TIMERS_PENDING: Final = "SELECT COUNT(*) FROM reactor_timers"
TIMER_DELETE: Final = "DELETE FROM reactor_timers WHERE id = ?"
TIMERS_DELETE: Final = "DELETE FROM reactor_timers WHERE id IN ({})"
TIMERS_MOVE: Final = "UPDATE reactor_timers SET due = ? WHERE id IN ({})"
IN_CHUNK: Final = 500  # keys per IN (...) list, well under every driver's variable limit

# Work queues. A statement that looks for jobs names the queue and a state, and orders
# by (ready_at, id): it seeks the index reactor_jobs_ready (queue, state, ready_at, id),
# O(log n) however many jobs the queue holds. Jobs of a priority other than 0 are also in
# reactor_jobs_priority (queue, priority DESC, ready_at, id), a partial index.
_QUEUE_COLUMNS: Final = (
    "max_attempts, next_id, concurrency, group_concurrency, rate_limit, rate_seconds, "
    "backoff_base, backoff_max"
)
QUEUE: Final = f"SELECT {_QUEUE_COLUMNS} FROM reactor_queues WHERE [name] = ?"
# The same, read to add jobs: on PostgreSQL it locks the row (``PostgresJobs``), so that
# puts holding the queue in shared mode (a run's start) number their jobs in turn.
QUEUE_TO_PUT: Final = f"SELECT {_QUEUE_COLUMNS} FROM reactor_queues AS q WHERE q.[name] = ?"
ADD_QUEUE: Final = (
    f"INSERT INTO reactor_queues (name, {_QUEUE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SET_QUEUE: Final = (
    "UPDATE reactor_queues SET max_attempts = ?, next_id = ?, concurrency = ?, "
    "group_concurrency = ?, rate_limit = ?, rate_seconds = ?, backoff_base = ?, "
    "backoff_max = ? WHERE [name] = ?"
)
QUEUE_NAMES: Final = "SELECT name FROM reactor_queues ORDER BY name"
JOB_COLUMNS: Final = "id, item, state, ready_at, attempts, owner, priority, grp, errors, worker"
JOB: Final = f"SELECT {JOB_COLUMNS} FROM reactor_jobs WHERE [queue] = ? AND id = ?"
# A job with its idempotency key and when it was put (``Queue.job``).
JOB_INFO: Final = (
    f"SELECT {JOB_COLUMNS}, key, created_at FROM reactor_jobs WHERE [queue] = ? AND id = ?"
)
# Groups at their limit of taken jobs (the ``?``s: queue, now, group_concurrency): a
# take passes over their jobs.
_NOT_FULL: Final = (
    " AND (grp IS NULL OR grp NOT IN (SELECT grp FROM reactor_jobs WHERE [queue] = ? "
    "AND state = 'taken' AND ready_at > ? AND grp IS NOT NULL GROUP BY grp "
    "HAVING COUNT(*) >= ?))"
)
# The ready job to take first among those of priority 0, and among the others: the first
# of priority above 0 goes before the first of priority 0, which goes before one below.
_READY_ZERO: Final = (
    f"SELECT {JOB_COLUMNS} FROM reactor_jobs WHERE [queue] = ? AND state = 'ready' "
    "AND ready_at <= ? AND priority = 0"
)
# +ready_at: not a range of reactor_jobs_ready, which SQLite would otherwise seek and sort.
_READY_OTHER: Final = (
    f"SELECT {JOB_COLUMNS} FROM reactor_jobs WHERE [queue] = ? AND state = 'ready' "
    "AND priority <> 0 AND +ready_at <= ?"
)
FIRST_READY: Final = f"{_READY_ZERO} ORDER BY ready_at, id LIMIT 1"
FIRST_PRIORITY: Final = f"{_READY_OTHER} ORDER BY priority DESC, ready_at, id LIMIT 1"
FIRST_READY_NOT_FULL: Final = f"{_READY_ZERO}{_NOT_FULL} ORDER BY ready_at, id LIMIT 1"
FIRST_PRIORITY_NOT_FULL: Final = (
    f"{_READY_OTHER}{_NOT_FULL} ORDER BY priority DESC, ready_at, id LIMIT 1"
)
DUE_JOBS: Final = (
    f"SELECT {JOB_COLUMNS} FROM reactor_jobs WHERE [queue] = ? AND state = ? "
    "AND ready_at <= ? ORDER BY ready_at, id LIMIT ?"
)
LATER_JOBS: Final = (
    f"SELECT {JOB_COLUMNS} FROM reactor_jobs WHERE [queue] = ? AND state = ? "
    "AND ready_at > ? ORDER BY ready_at, id LIMIT ?"
)
JOBS_IN_STATE: Final = (
    f"SELECT {JOB_COLUMNS} FROM reactor_jobs WHERE [queue] = ? AND state = ? "
    "ORDER BY ready_at, id LIMIT ?"
)
# When a job may next be taken: the first ready one, or the first lease to run out.
# ORDER BY ... LIMIT 1 rather than MIN(): PostgreSQL reads MIN() off the index only when
# its statistics say the range is large, and a queue just filled has none yet.
_FIRST_AT: Final = "(SELECT ready_at FROM reactor_jobs WHERE [queue] = ? AND state = "
NEXT_TIMES: Final = (
    f"SELECT {_FIRST_AT}'ready' ORDER BY ready_at LIMIT 1), "
    f"{_FIRST_AT}'taken' ORDER BY ready_at LIMIT 1)"
)
# The first delayed job, and the first lease to run out, after ``?`` (a take held back
# by flow control: when it may look again); the taken jobs, and those of each group.
NEXT_TIMES_AFTER: Final = (
    f"SELECT {_FIRST_AT}'ready' AND ready_at > ? ORDER BY ready_at LIMIT 1), "
    f"{_FIRST_AT}'taken' AND ready_at > ? ORDER BY ready_at LIMIT 1)"
)
TAKEN_COUNT: Final = (
    "SELECT COUNT(*) FROM reactor_jobs WHERE [queue] = ? AND state = 'taken' AND ready_at > ?"
)
TAKEN_BY_GROUP: Final = (
    "SELECT grp, COUNT(*) FROM reactor_jobs WHERE [queue] = ? AND state = 'taken' "
    "AND ready_at > ? AND grp IS NOT NULL GROUP BY grp"
)
# A rate window: the takes in it, the take that fills it, a take, and the pruning.
TAKES_SINCE: Final = "SELECT COUNT(*) FROM reactor_takes WHERE [queue] = ? AND at > ?"
NTH_LAST_TAKE: Final = (
    "SELECT at FROM reactor_takes WHERE [queue] = ? ORDER BY at DESC LIMIT 1 OFFSET ?"
)
ADD_TAKE: Final = "INSERT INTO reactor_takes (queue, at, job) VALUES (?, ?, ?)"
PRUNE_TAKES: Final = "DELETE FROM reactor_takes WHERE [queue] = ? AND at <= ?"
DROP_TAKES: Final = "DELETE FROM reactor_takes WHERE [queue] = ?"
CLAMP_TAKES: Final = "UPDATE reactor_takes SET at = ? WHERE [queue] = ? AND at > ?"
# Every job of a queue with its idempotency key, in the order of ready_at (an export's).
QUEUE_JOBS: Final = (
    f"SELECT {JOB_COLUMNS}, key FROM reactor_jobs WHERE [queue] = ? ORDER BY ready_at, id"
)
JOBS_BY_KEY: Final = "SELECT key, id, state FROM reactor_jobs WHERE [queue] = ? AND [key] IN ({})"
ADD_JOBS: Final = (
    "INSERT INTO reactor_jobs (queue, id, item, state, ready_at, attempts, owner, key, "
    "created_at, priority, grp, errors) VALUES {}"
)
JOB_PLACES: Final = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
JOBS_PER_INSERT: Final = 80  # 960 parameters: under SQLite's oldest limit (999)
SET_JOB: Final = (
    "UPDATE reactor_jobs SET state = ?, ready_at = ?, attempts = ?, owner = ?, worker = ?, "
    "errors = ? WHERE [queue] = ? AND id = ?"
)
# A debounced put: the waiting job of its key takes its item, time, priority and group.
REPLACE_JOB: Final = (
    "UPDATE reactor_jobs SET item = ?, ready_at = ?, priority = ?, grp = ? "
    "WHERE [queue] = ? AND id = ?"
)
SET_JOB_STATES: Final = (
    "UPDATE reactor_jobs SET state = ?, owner = NULL WHERE [queue] = ? AND id IN ({})"
)
REVIVE_JOBS: Final = (
    "UPDATE reactor_jobs SET state = 'ready', ready_at = ?, attempts = 0, owner = NULL, "
    "worker = NULL WHERE [queue] = ? AND id IN ({})"
)
DELETE_JOB: Final = "DELETE FROM reactor_jobs WHERE [queue] = ? AND id = ?"
DELETE_JOBS: Final = "DELETE FROM reactor_jobs WHERE [queue] = ? AND id IN ({})"
# How many jobs of a queue: ready now, ready later, taken, taken with the lease run out
# (with attempts left, and without), dead. Each a range of the index: no sort, no
# grouping, and the table itself read only for the leases that ran out.
_COUNT: Final = "(SELECT COUNT(*) FROM reactor_jobs WHERE [queue] = ? AND state = "
JOB_COUNTS: Final = (
    f"SELECT {_COUNT}'ready' AND ready_at <= ?), {_COUNT}'ready' AND ready_at > ?), "
    f"{_COUNT}'taken' AND ready_at > ?), "
    f"{_COUNT}'taken' AND ready_at <= ? AND attempts < ?), "
    f"{_COUNT}'taken' AND ready_at <= ? AND attempts >= ?), {_COUNT}'dead')"
)
# The queues with a lease run out: one seek of the index per queue, not a table scan.
QUEUES_DUE: Final = (
    "SELECT q.name FROM reactor_queues AS q WHERE EXISTS (SELECT 1 FROM reactor_jobs AS j "
    "WHERE j.[queue] = q.[name] AND j.state = 'taken' AND j.ready_at <= ?)"
)


def chunks(items: list[T]) -> Iterator[list[T]]:
    """``items`` in lists of ``IN_CHUNK`` at most, for ``IN (...)``."""
    for start in range(0, len(items), IN_CHUNK):
        yield items[start : start + IN_CHUNK]


def ranged(
    sql: str, scope: str, bounds: tuple[str, str | None] | None, *live: float
) -> tuple[str, tuple[Any, ...]]:
    """``sql`` narrowed to the keys from ``bounds[0]`` up to (not including) ``bounds[1]``,
    or to a range holding it: bounds of more than ``NAME_INDEXED`` characters widen to
    those of their first ``NAME_INDEXED`` (the range PostgreSQL's index of names can
    seek; every caller matches the keys it reads against its pattern)."""
    params: tuple[Any, ...] = (scope, *live)
    if bounds is not None:
        low, high = bounds
        low = low[:NAME_INDEXED]
        if high is not None and len(high) > NAME_INDEXED:
            high = successor(high[:NAME_INDEXED])
        sql += RANGE
        params += (low,)
        if high is not None:
            sql += RANGE_END
            params += (high,)
    return sql, params


def job_row(row: Any) -> JobRow:
    job_id, item, state, ready_at, attempts, owner, priority, group, errors, worker = row[:10]
    return JobRow(
        int(job_id),
        item,
        state,
        float(ready_at),
        int(attempts),
        owner,
        int(priority),
        group,
        errors,
        worker,
    )


def queue_row(row: Any) -> QueueRow:
    max_attempts, next_id, concurrency, group_concurrency, limit, seconds, base, most = row
    return QueueRow(
        int(max_attempts),
        int(next_id),
        None if concurrency is None else int(concurrency),
        None if group_concurrency is None else int(group_concurrency),
        None if limit is None else int(limit),
        None if seconds is None else float(seconds),
        None if base is None else float(base),
        None if most is None else float(most),
    )
