"""What an export reads: the keys, timers and queues of a database, all from one
snapshot of it (``Store.consistent_reads``), as the lines of a backup.

A backup is the database as it was at one moment, as ``pg_dump`` or SQLite's online
backup make it: a transaction that committed before the export began is in it whole,
and one that committed after is not in it at all, however long the export runs. Times
(``ttl``, ``due_in``, ``ready_in``) count from that moment. Values go out as the JSON
text stored, not decoded and encoded again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from reactor._work import queue_settings as _settings

if TYPE_CHECKING:
    from reactor._base.keys import Pattern
    from reactor._storage.records import JobRow, QueueRow, TimerRow
    from reactor._storage.store import SnapshotReads

__all__ = ["ExportView"]


class ExportView:
    """The lines of an export, read with ``reads`` (one snapshot), as of ``now``, of
    the scopes ``match`` matches. Keys and jobs are streamed: however many there are,
    only a few rows are held at once."""

    __slots__ = ("_jobs", "_match", "_now", "_reads")

    def __init__(self, reads: SnapshotReads, now: float, match: Pattern) -> None:
        self._reads = reads
        self._now = now
        self._match = match
        self._jobs = reads.jobs()

    def key_count(self) -> int:
        """How many live keys the export has."""
        counts = self._reads.counts(self._now)
        return sum(n for scope, n in counts.items() if self._match.matches(scope))

    def key_lines(self) -> Iterator[dict[str, Any]]:
        """Every live key, sorted by scope and key."""
        for scope, key, text, expires_at in self._reads.live_rows(self._now):
            if self._match.matches(scope):
                yield {
                    "scope": scope,
                    "key": key,
                    "value": orjson.Fragment(text),
                    "ttl": _ttl(expires_at, self._now),
                }

    def timer_lines(self) -> list[dict[str, Any]]:
        """The pending timers, earliest first."""
        rows = self._reads.timers()
        return [_timer_line(row, self._now) for row in rows if self._match.matches(row.scope)]

    def queue_names(self) -> list[str]:
        return self._jobs.queue_names()

    def job_lines(self, queues: Iterable[str]) -> Iterator[dict[str, Any]]:
        """Each queue of ``queues``: its settings, then its jobs in the order they are
        taken."""
        for name in queues:
            settings = _settings.settled(self._jobs.queue(name), None)
            yield _queue_line(name, settings)
            for row, key in self._reads.queue_jobs(name):
                yield _job_line(name, row, key, settings.max_attempts, self._now)


def _seconds(seconds: float) -> float:
    """Seconds as an export writes them: to the millisecond, and 0.0 rather than -0.0."""
    return round(seconds, 3) + 0.0


def _ttl(expires_at: float | None, now: float) -> float | None:
    # A millisecond at least: a key about to expire must still import as live.
    return None if expires_at is None else max(_seconds(float(expires_at) - now), 0.001)


def _timer_line(row: TimerRow, now: float) -> dict[str, Any]:
    name, text = ("value", row.value) if row.ops is None else ("ops", row.ops)
    assert text is not None  # a timer writes a value or applies ops
    return {
        "timer": row.id,
        "scope": row.scope,
        "key": row.key,
        name: orjson.Fragment(text),
        "due_in": _seconds(row.due - now),
        "every": row.every,
        **({} if row.cron is None else {"cron": row.cron, "tz": row.tz}),
    }


def _queue_line(name: str, row: QueueRow) -> dict[str, Any]:
    line: dict[str, Any] = {"queue": name, "max_attempts": row.max_attempts}
    for setting in ("concurrency", "group_concurrency"):
        if getattr(row, setting) is not None:
            line[setting] = getattr(row, setting)
    if row.rate_limit is not None:
        line["rate"] = [row.rate_limit, row.rate_seconds]
    if row.backoff_base is not None:
        line["backoff"] = [row.backoff_base, row.backoff_max]
    return line


def _job_line(
    queue: str, row: JobRow, key: str | None, max_attempts: int, now: float
) -> dict[str, Any]:
    state = row.state
    if state == "taken":  # as its lease running out would leave it (_jobs.expire), now
        state = "ready" if row.attempts < max_attempts else "dead"
    ready_in = max(_seconds(row.ready_at - now), 0.0) if row.state == "ready" else 0.0
    return {
        "queue": queue,
        "item": orjson.Fragment(row.item),
        "attempts": row.attempts,
        "state": state,
        "ready_in": ready_in,
        "key": key,
        **({"priority": row.priority} if row.priority else {}),
        **({} if row.group is None else {"group": row.group}),
        **({} if row.errors is None else {"errors": orjson.Fragment(row.errors)}),
    }
