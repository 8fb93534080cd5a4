"""The statements of work queues: their reads (``SQLJobReads``), on a write
transaction's connection or a plain read's, and their writes (``SQLJobs``), on a write
transaction's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .records import JobRow, QueueRow
from .sql_text import (
    ADD_JOBS,
    ADD_QUEUE,
    ADD_TAKE,
    CLAMP_TAKES,
    DELETE_JOB,
    DELETE_JOBS,
    DROP_TAKES,
    DUE_JOBS,
    FIRST_PRIORITY,
    FIRST_PRIORITY_NOT_FULL,
    FIRST_READY,
    FIRST_READY_NOT_FULL,
    IN_CHUNK,
    JOB,
    JOB_COUNTS,
    JOB_INFO,
    JOB_PLACES,
    JOBS_BY_KEY,
    JOBS_IN_STATE,
    JOBS_PER_INSERT,
    LATER_JOBS,
    NEXT_TIMES,
    NEXT_TIMES_AFTER,
    NTH_LAST_TAKE,
    PRUNE_TAKES,
    QUEUE,
    QUEUE_NAMES,
    QUEUE_TO_PUT,
    QUEUES_DUE,
    REPLACE_JOB,
    REVIVE_JOBS,
    SET_JOB,
    SET_JOB_STATES,
    SET_QUEUE,
    TAKEN_BY_GROUP,
    TAKEN_COUNT,
    TAKES_SINCE,
    job_row,
    queue_row,
)


def first_to_take(zero: list[Any], other: list[Any]) -> JobRow | None:
    """The job to take first, of the first ready job of priority 0 and the first of the
    others (highest priority first): above 0 beats 0, which beats below 0."""
    best = job_row(other[0]) if other else None
    if best is not None and best.priority > 0:
        return best
    return job_row(zero[0]) if zero else best


class SQLJobReads:
    """The reads of work queues (``statements.JobReads``) on a connection: ``read`` runs
    a query; reads made together (``read_several``) are one round trip on PostgreSQL."""

    __slots__ = ("_all", "_all_several")

    def __init__(
        self,
        read: Callable[[str, tuple[Any, ...]], list[Any]],
        read_several: Callable[[list[tuple[str, tuple[Any, ...]]]], list[list[Any]]] | None = None,
    ) -> None:
        self._all = read
        self._all_several = read_several or self._one_by_one

    def _one_by_one(self, statements: list[tuple[str, tuple[Any, ...]]]) -> list[list[Any]]:
        return [self._all(sql, params) for sql, params in statements]

    def queue(self, name: str) -> QueueRow | None:
        """A queue's settings and the id its next job takes; None: no queue."""
        found = self._all(QUEUE, (name,))
        return queue_row(found[0]) if found else None

    def put_view(
        self, queue: str, keys: list[str]
    ) -> tuple[QueueRow | None, dict[str, list[tuple[int, str]]]]:
        """What a put reads, read together: the queue (as ``queue``, its row locked on
        PostgreSQL until the commit) and the jobs that hold ``keys`` (as ``holders``)."""
        if not keys or len(set(keys)) > IN_CHUNK:
            return self._queue_to_put(queue), self.holders(queue, keys) if keys else {}
        unique = list(dict.fromkeys(keys))
        sql = JOBS_BY_KEY.format(", ".join("?" * len(unique)))
        found, held = self._all_several([(QUEUE_TO_PUT, (queue,)), (sql, (queue, *unique))])
        holders: dict[str, list[tuple[int, str]]] = {}
        for key, job_id, state in held:
            holders.setdefault(key, []).append((int(job_id), state))
        for jobs in holders.values():
            jobs.sort()
        return (queue_row(found[0]) if found else None), holders

    def _queue_to_put(self, name: str) -> QueueRow | None:
        found = self._all(QUEUE_TO_PUT, (name,))
        return queue_row(found[0]) if found else None

    def queue_names(self) -> list[str]:
        return [name for (name,) in self._all(QUEUE_NAMES, ())]

    def queues_due(self, now: float, limit: int | None = None) -> list[str]:
        """The queues holding a job whose lease ran out by ``now`` (the first ``limit``
        of them, by name)."""
        if limit is None:
            return [name for (name,) in self._all(QUEUES_DUE, (now,))]
        return [
            name for (name,) in self._all(QUEUES_DUE + " ORDER BY q.name LIMIT ?", (now, limit))
        ]

    def leases_run_out(
        self, queues: list[str], now: float, limit: int
    ) -> dict[str, tuple[QueueRow | None, list[JobRow]]]:
        """Of each of ``queues``: its settings (None: no such queue) and up to
        ``limit`` of its jobs whose lease ran out by ``now``, earliest first; read
        together (one round trip on PostgreSQL)."""
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for queue in queues:
            statements += [(QUEUE, (queue,)), (DUE_JOBS, (queue, "taken", now, limit))]
        found = self._all_several(statements)
        return {
            queue: (
                queue_row(settings[0]) if settings else None,
                [job_row(row) for row in due],
            )
            for queue, settings, due in zip(queues, found[::2], found[1::2], strict=True)
        }

    def job(self, queue: str, job_id: int) -> JobRow | None:
        found = self._all(JOB, (queue, job_id))
        return job_row(found[0]) if found else None

    def job_info(self, queue: str, job_id: int) -> tuple[JobRow, str | None, float] | None:
        """The job, its idempotency key and when it was put."""
        found = self._all(JOB_INFO, (queue, job_id))
        if not found:
            return None
        return job_row(found[0]), found[0][10], float(found[0][11])

    def take_view(
        self, queue: str, now: float, limit: int
    ) -> tuple[QueueRow | None, list[JobRow], JobRow | None]:
        """What a take reads, read together: the queue's settings (as ``queue``), up
        to ``limit`` of its leases run out by ``now`` (as ``due``), and the ready job
        to take first at ``now`` if no flow control holds any back (the highest
        priority, then the earliest ready, then the lowest id)."""
        found, due, zero, other = self._all_several(
            [
                (QUEUE, (queue,)),
                (DUE_JOBS, (queue, "taken", now, limit)),
                (FIRST_READY, (queue, now)),
                (FIRST_PRIORITY, (queue, now)),
            ]
        )
        return (
            queue_row(found[0]) if found else None,
            [job_row(row) for row in due],
            first_to_take(zero, other),
        )

    def first_ready(self, queue: str, now: float, group_limit: int | None) -> JobRow | None:
        """The ready job to take first at ``now``, passing over the jobs of groups that
        hold ``group_limit`` taken jobs (None: no limit)."""
        statements: list[tuple[str, tuple[Any, ...]]]
        if group_limit is None:
            statements = [(FIRST_READY, (queue, now)), (FIRST_PRIORITY, (queue, now))]
        else:
            params = (queue, now, queue, now, group_limit)
            statements = [(FIRST_READY_NOT_FULL, params), (FIRST_PRIORITY_NOT_FULL, params)]
        zero, other = self._all_several(statements)
        return first_to_take(zero, other)

    def taken_count(self, queue: str, now: float) -> int:
        """How many jobs are taken under a lease that has not run out by ``now``."""
        return int(self._all(TAKEN_COUNT, (queue, now))[0][0])

    def taken_by_group(self, queue: str, now: float) -> dict[str, int]:
        """As ``taken_count``, per group (jobs with a group only)."""
        return {group: int(count) for group, count in self._all(TAKEN_BY_GROUP, (queue, now))}

    def next_times_after(self, queue: str, now: float) -> tuple[float | None, float | None]:
        """The first ``ready_at`` after ``now`` of the ready jobs, and of the taken ones."""
        ready, taken = self._all(NEXT_TIMES_AFTER, (queue, now, queue, now))[0]
        return (
            None if ready is None else float(ready),
            None if taken is None else float(taken),
        )

    def takes_since(self, queue: str, since: float) -> int:
        """How many takes of the queue's rate window came after ``since``."""
        return int(self._all(TAKES_SINCE, (queue, since))[0][0])

    def nth_last_take(self, queue: str, n: int) -> float | None:
        """When the ``n``-th last take recorded was (1: the last); None: fewer."""
        found = self._all(NTH_LAST_TAKE, (queue, n - 1))
        return float(found[0][0]) if found else None

    def due(self, queue: str, state: str, now: float, limit: int) -> list[JobRow]:
        """Up to ``limit`` jobs in ``state`` whose ``ready_at`` is ``now`` or before,
        earliest first (taken: leases that ran out)."""
        return [job_row(row) for row in self._all(DUE_JOBS, (queue, state, now, limit))]

    def later(self, queue: str, state: str, now: float, limit: int) -> list[JobRow]:
        """Up to ``limit`` jobs in ``state`` whose ``ready_at`` is after ``now``."""
        return [job_row(row) for row in self._all(LATER_JOBS, (queue, state, now, limit))]

    def in_state(self, queue: str, state: str, limit: int) -> list[JobRow]:
        """Up to ``limit`` jobs in ``state``, by ``ready_at`` then id."""
        return [job_row(row) for row in self._all(JOBS_IN_STATE, (queue, state, limit))]

    def next_times(self, queue: str) -> tuple[float | None, float | None]:
        """The earliest ``ready_at`` of the ready jobs, and of the taken ones (the first
        lease to run out); None where there is none."""
        ready, taken = self._all(NEXT_TIMES, (queue, queue))[0]
        return (
            None if ready is None else float(ready),
            None if taken is None else float(taken),
        )

    def holders(self, queue: str, keys: list[str]) -> dict[str, list[tuple[int, str]]]:
        """The jobs that hold those idempotency ``keys``: (id, state) each, by id."""
        found: dict[str, list[tuple[int, str]]] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), IN_CHUNK):
            chunk = unique[start : start + IN_CHUNK]
            sql = JOBS_BY_KEY.format(", ".join("?" * len(chunk)))
            for key, job_id, state in self._all(sql, (queue, *chunk)):
                found.setdefault(key, []).append((int(job_id), state))
        for held in found.values():
            held.sort()
        return found

    def counts(self, queue: str, now: float, max_attempts: int) -> dict[str, int]:
        """How many jobs are ready now, delayed, taken and dead at ``now``: a lease
        run out counts where it goes next (dead after ``max_attempts`` takes)."""
        params = (queue, now) * 3 + (queue, now, max_attempts) * 2 + (queue,)
        ready, delayed, taken, back, spent, dead = self._all(JOB_COUNTS, params)[0]
        return {
            "ready": int(ready) + int(back),
            "delayed": int(delayed),
            "taken": int(taken),
            "dead": int(dead) + int(spent),
        }


class SQLJobs(SQLJobReads):
    """The reads and writes of work queues (``statements.JobWrites``) in a write
    transaction. A job written is seen by the next statement of the transaction:
    writes run at once (``send``: or, on PostgreSQL, with the next statement answered,
    in one round trip)."""

    __slots__ = ("_send",)

    def __init__(
        self,
        read: Callable[[str, tuple[Any, ...]], list[Any]],
        send: Callable[[str, tuple[Any, ...]], object],
        read_several: Callable[[list[tuple[str, tuple[Any, ...]]]], list[list[Any]]] | None = None,
    ) -> None:
        super().__init__(read, read_several)
        self._send = send

    def add_queue(self, name: str, row: QueueRow) -> None:
        self._send(ADD_QUEUE, (name, *_queue_values(row)))

    def set_queue(self, name: str, row: QueueRow) -> None:
        self._send(SET_QUEUE, (*_queue_values(row), name))

    def reserve_ids(self, queue: str, count: int, keys: list[str]) -> tuple[QueueRow | None, bool]:
        """See ``statements.JobWrites.reserve_ids`` (here: read, then write)."""
        found, holders = self.put_view(queue, keys)
        if found is not None:
            self.set_queue(queue, replace(found, next_id=found.next_id + count))
        return found, bool(holders)

    def add_jobs(self, rows: list[tuple[Any, ...]]) -> None:
        """Insert jobs: (queue, id, item, state, ready_at, attempts, owner, key,
        created_at, priority, grp, errors) each. Several rows a statement, run at once
        (not ``executemany``, which PostgreSQL's statements hold back until the
        commit)."""
        for start in range(0, len(rows), JOBS_PER_INSERT):
            chunk = rows[start : start + JOBS_PER_INSERT]
            sql = ADD_JOBS.format(", ".join([JOB_PLACES] * len(chunk)))
            self._send(sql, tuple(value for row in chunk for value in row))

    def set_job(self, queue: str, row: JobRow) -> None:
        """Write the state, ``ready_at``, attempts, owner, worker and errors of ``row``."""
        self._send(
            SET_JOB,
            (
                row.state,
                row.ready_at,
                row.attempts,
                row.owner,
                row.worker,
                row.errors,
                queue,
                row.id,
            ),
        )

    def replace_job(self, queue: str, row: JobRow) -> None:
        """Write the item, ``ready_at``, priority and group of ``row`` (a debounced put)."""
        self._send(REPLACE_JOB, (row.item, row.ready_at, row.priority, row.group, queue, row.id))

    def set_states(self, queue: str, ids: list[int], state: str) -> None:
        """Put the jobs ``ids`` in ``state``, with no owner (the rest as it is)."""
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            sql = SET_JOB_STATES.format(", ".join("?" * len(chunk)))
            self._send(sql, (state, queue, *chunk))

    def revive(self, queue: str, ids: list[int], now: float) -> None:
        """Make the jobs ``ids`` ready at ``now``, with no attempt used and no owner."""
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            sql = REVIVE_JOBS.format(", ".join("?" * len(chunk)))
            self._send(sql, (now, queue, *chunk))

    def delete_job(self, queue: str, job_id: int) -> None:
        self._send(DELETE_JOB, (queue, job_id))

    def delete_jobs(self, queue: str, ids: list[int]) -> None:
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            self._send(DELETE_JOBS.format(", ".join("?" * len(chunk))), (queue, *chunk))

    def add_take(self, queue: str, at: float, job_id: int) -> None:
        self._send(ADD_TAKE, (queue, at, job_id))

    def prune_takes(self, queue: str, until: float) -> None:
        """Forget the takes at ``until`` or before: out of the rate window."""
        self._send(PRUNE_TAKES, (queue, until))

    def clamp_takes(self, queue: str, now: float) -> None:
        """Move the takes recorded after ``now`` (the clock went back) to ``now``."""
        self._send(CLAMP_TAKES, (now, queue, now))

    def drop_takes(self, queue: str) -> None:
        self._send(DROP_TAKES, (queue,))


def _queue_values(row: QueueRow) -> tuple[Any, ...]:
    return (
        row.max_attempts,
        row.next_id,
        row.concurrency,
        row.group_concurrency,
        row.rate_limit,
        row.rate_seconds,
        row.backoff_base,
        row.backoff_max,
    )
