"""What a write transaction may run on its connection, as facets: reads (``ReadStatements``,
of work queues ``JobReads``) and writes (``WriteStatements``, ``JobWrites``).

A commit's transaction has both (``WriteStatements``). A transaction body has the reads
only (``Reader``): each runs as a plain read of the store, and what the body would write
besides its keys (timers, jobs) waits for its commit (``WriteTxn.defer``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from reactor._base.keys import Pattern

from .records import ChangeRecord, JobRow, Key, LockRow, QueueRow, Row, TimerRow, Upsert

__all__ = ["JobReads", "JobWrites", "ReadStatements", "Reader", "WriteStatements"]


class JobReads(Protocol):
    """Reads of work queues (``reactor_queues``, ``reactor_jobs``, ``reactor_takes``)."""

    def queue(self, name: str) -> QueueRow | None:
        """A queue's settings and the id its next job takes; None: no queue."""
        ...

    def queue_names(self) -> list[str]: ...

    def queues_due(self, now: float, limit: int | None = None) -> list[str]: ...

    def leases_run_out(
        self, queues: list[str], now: float, limit: int
    ) -> dict[str, tuple[QueueRow | None, list[JobRow]]]: ...

    def job(self, queue: str, job_id: int) -> JobRow | None: ...

    def job_info(self, queue: str, job_id: int) -> tuple[JobRow, str | None, float] | None: ...

    def take_view(
        self, queue: str, now: float, limit: int
    ) -> tuple[QueueRow | None, list[JobRow], JobRow | None]: ...

    def first_ready(self, queue: str, now: float, group_limit: int | None) -> JobRow | None: ...

    def taken_count(self, queue: str, now: float) -> int: ...

    def taken_by_group(self, queue: str, now: float) -> dict[str, int]: ...

    def next_times_after(self, queue: str, now: float) -> tuple[float | None, float | None]: ...

    def takes_since(self, queue: str, since: float) -> int: ...

    def nth_last_take(self, queue: str, n: int) -> float | None: ...

    def due(self, queue: str, state: str, now: float, limit: int) -> list[JobRow]: ...

    def later(self, queue: str, state: str, now: float, limit: int) -> list[JobRow]: ...

    def in_state(self, queue: str, state: str, limit: int) -> list[JobRow]: ...

    def next_times(self, queue: str) -> tuple[float | None, float | None]: ...

    def holders(self, queue: str, keys: list[str]) -> dict[str, list[tuple[int, str]]]: ...

    def put_view(
        self, queue: str, keys: list[str]
    ) -> tuple[QueueRow | None, dict[str, list[tuple[int, str]]]]:
        """The queue (its row locked for the commit on PostgreSQL) and the jobs that
        hold ``keys``, in one round trip."""
        ...

    def counts(self, queue: str, now: float, max_attempts: int) -> dict[str, int]: ...


class JobWrites(JobReads, Protocol):
    """Reads and writes of work queues, in a commit's transaction: a job written is
    seen by the next statement."""

    def add_queue(self, name: str, row: QueueRow) -> None: ...

    def set_queue(self, name: str, row: QueueRow) -> None: ...

    def reserve_ids(self, queue: str, count: int, keys: list[str]) -> tuple[QueueRow | None, bool]:
        """The queue's row as it was (None: no queue), its ``next_id`` moved on by
        ``count`` (the row locked for the commit on PostgreSQL), and whether a job holds
        one of ``keys``: a put of ``count`` new jobs in one round trip."""
        ...

    def add_jobs(self, rows: list[tuple[Any, ...]]) -> None: ...

    def set_job(self, queue: str, row: JobRow) -> None: ...

    def replace_job(self, queue: str, row: JobRow) -> None: ...

    def set_states(self, queue: str, ids: list[int], state: str) -> None: ...

    def revive(self, queue: str, ids: list[int], now: float) -> None: ...

    def delete_job(self, queue: str, job_id: int) -> None: ...

    def delete_jobs(self, queue: str, ids: list[int]) -> None: ...

    def add_take(self, queue: str, at: float, job_id: int) -> None: ...

    def prune_takes(self, queue: str, until: float) -> None: ...

    def clamp_takes(self, queue: str, now: float) -> None: ...

    def drop_takes(self, queue: str) -> None: ...


class ReadStatements(Protocol):
    """The reads of a write transaction (of a transaction body: plain reads)."""

    def fetch_row(self, scope: str, key: str) -> Row | None: ...

    def fetch_rows(
        self, scope: str, bounds: tuple[str, str | None] | None
    ) -> list[tuple[str, Row]]: ...

    def fetch_many(self, scope: str, keys: list[str]) -> dict[str, Row]: ...

    def read_ahead(self, keys: Collection[Key]) -> dict[Key, Row | None]:
        """The rows of ``keys`` (None: no row), in as few statements as it can."""
        ...

    def current_revision(self) -> int: ...

    def changed_since(self, scope: str, revision: int) -> bool: ...

    def keys_changed_since(self, scope: str, keys: list[str], revision: int) -> bool: ...

    def keys_matching_changed_since(self, scope: str, pattern: Pattern, revision: int) -> bool: ...

    def compacted(self) -> int:
        """Every change-log record up to this revision may have been compacted away."""
        ...

    def fetch_lock(self, name: str) -> LockRow | None: ...

    def fetch_timer(self, timer_id: str) -> TimerRow | None: ...

    def fetch_timers(self, timer_ids: list[str]) -> dict[str, TimerRow]: ...

    def jobs(self) -> JobReads: ...


class Reader(ReadStatements, Protocol):
    """The reads of a transaction body, each a plain read of the store.

    ``deadlines`` keeps the deadline of every row the body read (None: no expiry or no
    row), as first read: the commit checks them, since a change of deadline alone
    leaves no record in the change log."""

    deadlines: dict[Key, float | None]


class WriteStatements(ReadStatements, Protocol):
    """The reads and writes of a commit's transaction, on its connection."""

    def write_changes(
        self, records: list[ChangeRecord], upserts: list[Upsert], deletes: list[Key]
    ) -> None:
        """Append ``records`` to the change log and write the rows; give each record
        its revision (``-n``, the n-th change of the transaction, becomes the n-th
        revision after the last committed), now or at the latest by the commit. A row's
        revision (or created revision) below zero is such a provisional one."""
        ...

    def compact(self, upto_revision: int | None, before: float | None) -> int: ...

    def save_position(
        self, name: str, position: int, delivered: int, failed: int, now: float
    ) -> None: ...

    def record_failure(self, name: str, revision: int, error: str, now: float) -> None: ...

    def save_lock(self, name: str, row: LockRow) -> None: ...

    def add_timer(self, timer: TimerRow, now: float) -> None: ...

    def drop_timer(self, timer_id: str) -> bool: ...

    def drop_timers(self, timer_ids: list[str]) -> None: ...

    def move_timers(self, moves: list[tuple[str, float]]) -> None:
        """Move each timer of ``moves`` (id, due) to its new due time."""
        ...

    def jobs(self) -> JobWrites: ...
