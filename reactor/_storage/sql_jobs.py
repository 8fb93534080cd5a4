"""The statements of work queues: their reads (``SQLJobReads``), on a write
transaction's connection or a plain read's, and their writes (``SQLJobs``), on a write
transaction's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .records import JobRow
from .sql_text import (
    ADD_JOBS,
    ADD_QUEUE,
    DELETE_JOB,
    DUE_JOBS,
    FIRST_READY,
    IN_CHUNK,
    JOB,
    JOB_COUNTS,
    JOB_PLACES,
    JOBS_BY_KEY,
    JOBS_IN_STATE,
    JOBS_PER_INSERT,
    NEXT_TIMES,
    QUEUE,
    QUEUE_NAMES,
    QUEUES_DUE,
    REVIVE_JOBS,
    SET_JOB,
    SET_JOB_STATES,
    SET_QUEUE,
    job_row,
)


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

    def queue(self, name: str) -> tuple[int, int] | None:
        """A queue's ``max_attempts`` and the id its next job takes; None: no queue."""
        found = self._all(QUEUE, (name,))
        return (int(found[0][0]), int(found[0][1])) if found else None

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
    ) -> dict[str, tuple[int | None, list[JobRow]]]:
        """Of each of ``queues``: its ``max_attempts`` (None: no such queue) and up to
        ``limit`` of its jobs whose lease ran out by ``now``, earliest first; read
        together (one round trip on PostgreSQL)."""
        statements: list[tuple[str, tuple[Any, ...]]] = []
        for queue in queues:
            statements += [(QUEUE, (queue,)), (DUE_JOBS, (queue, "taken", now, limit))]
        found = self._all_several(statements)
        return {
            queue: (
                int(settings[0][0]) if settings else None,
                [job_row(row) for row in due],
            )
            for queue, settings, due in zip(queues, found[::2], found[1::2], strict=True)
        }

    def job(self, queue: str, job_id: int) -> JobRow | None:
        found = self._all(JOB, (queue, job_id))
        return job_row(found[0]) if found else None

    def take_view(
        self, queue: str, now: float, limit: int
    ) -> tuple[tuple[int, int] | None, list[JobRow], JobRow | None]:
        """What a take reads, read together: the queue's settings (as ``queue``), up
        to ``limit`` of its leases run out by ``now`` (as ``due``), and the ready job
        to take first at ``now`` (the earliest ready, then the lowest id)."""
        found, due, first = self._all_several(
            [
                (QUEUE, (queue,)),
                (DUE_JOBS, (queue, "taken", now, limit)),
                (FIRST_READY, (queue, now)),
            ]
        )
        return (
            (int(found[0][0]), int(found[0][1])) if found else None,
            [job_row(row) for row in due],
            job_row(first[0]) if first else None,
        )

    def due(self, queue: str, state: str, now: float, limit: int) -> list[JobRow]:
        """Up to ``limit`` jobs in ``state`` whose ``ready_at`` is ``now`` or before,
        earliest first (taken: leases that ran out)."""
        return [job_row(row) for row in self._all(DUE_JOBS, (queue, state, now, limit))]

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

    def ids_by_key(self, queue: str, keys: list[str]) -> dict[str, int]:
        """The ids of the jobs that hold those idempotency ``keys``."""
        found: dict[str, int] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), IN_CHUNK):
            chunk = unique[start : start + IN_CHUNK]
            sql = JOBS_BY_KEY.format(", ".join("?" * len(chunk)))
            for key, job_id in self._all(sql, (queue, *chunk)):
                found[key] = int(job_id)
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

    def add_queue(self, name: str, max_attempts: int, next_id: int) -> None:
        self._send(ADD_QUEUE, (name, max_attempts, next_id))

    def set_queue(self, name: str, max_attempts: int, next_id: int) -> None:
        self._send(SET_QUEUE, (max_attempts, next_id, name))

    def add_jobs(self, rows: list[tuple[Any, ...]]) -> None:
        """Insert jobs: (queue, id, item, state, ready_at, attempts, owner, key,
        created_at) each. Several rows a statement, run at once (not ``executemany``,
        which PostgreSQL's statements hold back until the commit)."""
        for start in range(0, len(rows), JOBS_PER_INSERT):
            chunk = rows[start : start + JOBS_PER_INSERT]
            sql = ADD_JOBS.format(", ".join([JOB_PLACES] * len(chunk)))
            self._send(sql, tuple(value for row in chunk for value in row))

    def set_job(self, queue: str, row: JobRow) -> None:
        """Write the state, ``ready_at``, attempts and owner of ``row``."""
        self._send(SET_JOB, (row.state, row.ready_at, row.attempts, row.owner, queue, row.id))

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
