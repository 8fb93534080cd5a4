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
from typing import TYPE_CHECKING, Any, Final

import orjson

from . import _jobs
from ._sql import COUNTS, LIVE_ROWS_AFTER, TIMERS, SQLJobs
from ._store import JobRow, TimerRow

if TYPE_CHECKING:
    from ._keys import Pattern
    from ._store import Query

__all__ = ["ExportView"]

PAGE: Final = 1000  # keys read in one statement


class ExportView:
    """The lines of an export, read with ``query`` (one snapshot), as of ``now``, of
    the scopes ``match`` matches."""

    __slots__ = ("_jobs", "_match", "_now", "_query")

    def __init__(self, query: Query, now: float, match: Pattern) -> None:
        self._query = query
        self._now = now
        self._match = match
        self._jobs = SQLJobs(query, _no_writes)

    def key_count(self) -> int:
        """How many live keys the export has."""
        counts = self._query(COUNTS, (self._now,))
        return sum(int(n) for scope, n in counts if self._match.matches(scope))

    def key_lines(self) -> Iterator[dict[str, Any]]:
        """Every live key, sorted by scope and key, read ``PAGE`` keys at a time."""
        after = ("", "")
        while True:
            rows = self._query(LIVE_ROWS_AFTER, (*after, self._now, PAGE))
            for scope, key, text, expires_at in rows:
                if self._match.matches(scope):
                    yield {
                        "scope": scope,
                        "key": key,
                        "value": orjson.Fragment(text),
                        "ttl": _ttl(expires_at, self._now),
                    }
            if len(rows) < PAGE:
                return
            after = (rows[-1][0], rows[-1][1])

    def timer_lines(self) -> list[dict[str, Any]]:
        """The pending timers, earliest first."""
        rows = [TimerRow(*row) for row in self._query(TIMERS, ())]
        return [_timer_line(row, self._now) for row in rows if self._match.matches(row.scope)]

    def queue_names(self) -> list[str]:
        return self._jobs.queue_names()

    def job_lines(self, queues: Iterable[str]) -> Iterator[dict[str, Any]]:
        """Each queue of ``queues``: its settings, then its jobs in the order they are
        taken."""
        for name in queues:
            found = self._jobs.queue(name)
            max_attempts = _jobs.DEFAULT_MAX_ATTEMPTS if found is None else found[0]
            yield {"queue": name, "max_attempts": max_attempts}
            for row, key in self._jobs.listing(name):
                yield _job_line(name, row, key, max_attempts, self._now)


def _no_writes(*_: object) -> int:
    raise AssertionError("an export never writes")


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
    }


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
    }
