"""``Job``, a job as its taker holds it (``ack``, ``nack``, ``extend``), and
``JobInfo``, a job as anyone may look at it (``Queue.job``).

No ``from __future__ import annotations``: ``JobInfo``'s annotations stay objects, so
that they resolve from ``reactor``, where users find it (as ``_base.results``'s)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from reactor._base.values import decode
from reactor._storage.records import JobRow
from reactor._storage.txn import WriteTxn
from reactor._work import jobs as _jobs
from reactor._work.attempts import error_text, errors_of, worker
from reactor.errors import LockNotOwnedError

__all__ = ["Job", "JobInfo", "job_info"]

T = TypeVar("T")
Write = Callable[[str | None, Callable[[WriteTxn], Any]], Any]


class Job:
    """A job taken from a queue (``Queue.take``), or a dead one (``Queue.dead``).

    ``ack()`` when done, ``nack()`` to give it back, ``extend()`` to keep it longer.
    Each raises ``LockNotOwnedError`` if this taker does not hold the job's lease any
    more (it ran out, and the job may be someone else's), and then changes nothing.
    """

    __slots__ = (
        "_before",
        "_held",
        "_lease",
        "_queue",
        "_token",
        "_write",
        "attempts",
        "errors",
        "group",
        "id",
        "item",
        "priority",
    )

    def __init__(
        self,
        queue: str,
        write: Write,
        row: JobRow,
        lease: float | None = None,
        before: JobRow | None = None,
        *,
        taken_in: WriteTxn | None = None,
    ) -> None:
        self._queue = queue
        self._write = write  # its queue's (``Queue._write``)
        self._token = row.owner
        self._lease = lease
        self._before = before  # as it was before the take, to undo it
        # The transaction that last found the job held, and the row it read (locked).
        self._held = None if taken_in is None else (taken_in, row)  # its take's own
        self.id: int = row.id
        """The job's id in its queue."""
        self.item: Any = decode(row.item)
        """The job's item (a fresh copy)."""
        self.attempts: int = row.attempts
        """How many times it has been taken (1 at its first take)."""
        self.priority: int = row.priority
        """Its priority (higher is taken first; 0 by default)."""
        self.group: str | None = row.group
        """Its group (``group_concurrency`` limits the taken jobs of a group)."""
        self.errors: list[dict[str, Any]] = errors_of(row.errors)
        """The errors of its failed attempts, oldest first (see ``JobInfo.errors``)."""

    def __repr__(self) -> str:
        return f"Job(id={self.id}, item={self.item!r}, attempts={self.attempts})"

    @property
    def queue(self) -> str:
        """The name of the job's queue."""
        return self._queue

    def _run(self, verb: str, work: Callable[[WriteTxn, str, int, str], T]) -> T:
        token = self._token
        if token is None:
            raise LockNotOwnedError(
                f"job {self.id} of queue {self.queue!r} was not taken by this handle "
                "(a dead letter, say)"
            )
        name, job_id = self.queue, self.id
        done: T = self._write(verb, lambda txn: work(txn, name, job_id, token))
        return done

    def hold(self, txn: WriteTxn, *, ack: bool = False) -> None:
        """Check, in the caller's write transaction (one that holds the queue's lock),
        that this taker holds the job still, and acknowledge it there if ``ack``: what
        the caller writes commits with it, or not at all (a workflow's records).

        Raises:
            LockNotOwnedError: as ``ack``; the caller's transaction should not commit.
        """
        token = self._token
        if token is None:
            raise LockNotOwnedError(f"job {self.id} of queue {self.queue!r} was not taken")
        held = self._held
        if not ack and held is not None and held[0] is txn:
            return  # found held in this transaction already (or taken by it)
        if ack:
            # Found held in this transaction already: its row is locked, and only this
            # taker writes it (a run's end checks its lease, then acknowledges).
            known = held[1] if held is not None and held[0] is txn else None
            self._held = None
            _jobs.ack(txn, self._queue, self.id, token, known)
        else:
            self._held = (txn, _jobs.owned(txn, self._queue, self.id, token))

    def ack(self) -> None:
        """The job is done: it is removed (and its idempotency key is free).

        Raises:
            LockNotOwnedError: this taker's lease ran out, or it was acked or nacked
                already; nothing changed.
        """
        self._run("queue.ack", _jobs.ack)

    def nack(self, delay: float | None = None, error: str | BaseException | None = None) -> None:
        """Give the job back: ready again after ``delay`` seconds (None: after the
        queue's backoff, or at once if it has none), in line from then; dead instead if
        it has been taken ``max_attempts`` times.

        ``error`` says why (a string, or an exception: its traceback is kept); it is
        recorded with this attempt's number, time and worker (host, pid, thread), and
        a dead job keeps it.

        Raises:
            LockNotOwnedError: as ``ack``.
            InvalidArgumentError: ``delay`` is not None or a finite number >= 0, or
                ``error`` is neither a string nor an exception.
        """
        seconds = _jobs.check_delay(delay, zero=True)
        text = None if error is None else error_text(error)
        taker = worker()
        self._run(
            "queue.nack",
            lambda txn, name, job_id, token: _jobs.nack(
                txn, name, job_id, token, seconds, text, taker
            ),
        )

    def extend(self, seconds: float | None = None) -> None:
        """Renew the lease: it now ends ``seconds`` from now (the take's ``lease`` by
        default).

        Raises:
            LockNotOwnedError: as ``ack``.
            InvalidArgumentError: ``seconds`` is not None or a finite number > 0.
        """
        if seconds is not None:
            lease = _jobs.check_lease(seconds, "seconds")
        else:  # a job resumed by its token (the command line) has no lease of its own
            lease = _jobs.DEFAULT_LEASE if self._lease is None else self._lease
        self._run(
            "queue.extend",
            lambda txn, name, job_id, token: _jobs.extend(txn, name, job_id, token, lease),
        )

    def _untake(self) -> bool:
        """Undo the take (its taker was cancelled before it got the job)."""
        before, token = self._before, self._token
        if before is None or token is None:
            return False
        name = self.queue
        untaken: bool = self._write(None, lambda txn: _jobs.untake(txn, name, before, token))
        return untaken


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job of a queue as ``Queue.job`` sees it at one moment."""

    queue: str
    id: int
    state: str
    """``"ready"``, ``"delayed"``, ``"taken"`` or ``"dead"``, as ``Queue.stats`` counts
    it (a lease run out: ready, or dead after its last attempt)."""
    item: Any
    attempts: int
    """How many times it has been taken."""
    priority: int
    group: str | None
    key: str | None
    """Its idempotency key."""
    ready_at: float
    """Epoch seconds: when it is ready (ready, delayed), its lease runs out (taken),
    or it died (dead)."""
    created_at: float
    """Epoch seconds: when it was put."""
    errors: list[dict[str, Any]]
    """The errors of its failed attempts, oldest first (the last 50): each a dict of
    ``attempt``, ``at`` (epoch seconds), ``error`` (the text given to ``nack``, or the
    lease running out; None if none was given) and ``worker`` (``host``, ``pid``,
    ``thread``, ``thread_id``)."""
    worker: dict[str, Any] | None
    """Who holds it (taken only): ``host``, ``pid``, ``thread``, ``thread_id``."""


def job_info(
    queue: str, found: tuple[JobRow, str | None, float], now: float, max_attempts: int
) -> JobInfo:
    """The ``JobInfo`` of a job ``found`` (``JobReads.job_info``) at ``now``."""
    row, key, created_at = found
    state = row.state
    if state == "ready" and row.ready_at > now:
        state = "delayed"
    elif state == "taken" and row.ready_at <= now:
        state = "ready" if row.attempts < max_attempts else "dead"
    return JobInfo(
        queue,
        row.id,
        state,
        decode(row.item),
        row.attempts,
        row.priority,
        row.group,
        key,
        row.ready_at,
        created_at,
        errors_of(row.errors),
        orjson.loads(row.worker) if row.worker is not None and state == "taken" else None,
    )
