"""Managing the jobs of a queue from outside a worker: revive the dead, cancel one job,
purge many (SPEC §13; issue 25). Each runs in a write transaction holding the queue's
lock, and each job it changes is a change of scope ``queue:NAME`` with its event, as
any transition of a job."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from reactor._storage.records import JobRow
from reactor._storage.txn import WriteTxn
from reactor.errors import InvalidArgumentError

from .jobs import document, lock_name
from .leases import expire

if TYPE_CHECKING:
    from reactor._storage.statements import JobReads

__all__ = ["BATCH", "STATES", "cancel", "check_states", "purge", "retry_dead"]

BATCH: Final = 1000  # jobs revived or purged per transaction
STATES: Final = ("ready", "delayed", "taken", "dead")  # as Queue.stats counts them


def check_states(state: object) -> tuple[str, ...]:
    """The states a purge names: one of ``STATES``, several, or None (all of them).

    Raises:
        InvalidArgumentError: something else.
    """
    if state is None:
        return STATES
    names = [state] if isinstance(state, str) else state
    if not isinstance(names, list | tuple | set | frozenset) or not names:
        raise InvalidArgumentError(f"state must be one of {STATES}, a list of them, or None")
    for name in names:
        if name not in STATES:
            raise InvalidArgumentError(f"state must be one of {STATES}, not {name!r}")
    return tuple(name for name in STATES if name in names)


def retry_dead(txn: WriteTxn, queue: str, limit: int = BATCH) -> int:
    """Make up to ``limit`` dead jobs ready now, with no attempt used (their errors
    kept), oldest death first; how many."""
    jobs = txn.writes.jobs()
    dead = jobs.in_state(queue, "dead", limit)
    if not dead:
        return 0
    jobs.revive(queue, [row.id for row in dead], txn.now)
    scope = lock_name(queue)
    for row in dead:
        new = replace(row, state="ready", ready_at=txn.now, attempts=0, owner=None, worker=None)
        txn.log(scope, str(row.id), "updated", document(row), document(new))
    return len(dead)


def cancel(txn: WriteTxn, queue: str, job_id: int) -> bool:
    """Remove job ``job_id`` whatever its state (a taken one's worker then gets
    ``LockNotOwnedError`` from its ack); whether it was there."""
    jobs = txn.writes.jobs()
    row = jobs.job(queue, job_id)
    if row is None:
        return False
    jobs.delete_job(queue, job_id)
    txn.log(lock_name(queue), str(job_id), "deleted", document(row), None)
    return True


def _finder(jobs: JobReads, queue: str, state: str, now: float) -> Callable[[int], list[JobRow]]:
    if state == "ready":
        return lambda limit: jobs.due(queue, "ready", now, limit)
    if state == "delayed":
        return lambda limit: jobs.later(queue, "ready", now, limit)
    return lambda limit: jobs.in_state(queue, state, limit)


def purge(
    txn: WriteTxn, queue: str, states: tuple[str, ...], limit: int = BATCH
) -> tuple[int, bool]:
    """Remove up to ``limit`` jobs in ``states`` (``STATES``: as ``Queue.stats`` counts
    them: leases run out are turned back first). How many, and whether more may be left."""
    expire(txn, [queue])
    jobs = txn.writes.jobs()
    removed: list[JobRow] = []
    for state in states:
        if len(removed) < limit:
            removed += _finder(jobs, queue, state, txn.now)(limit - len(removed))
    jobs.delete_jobs(queue, [row.id for row in removed])
    scope = lock_name(queue)
    for row in removed:
        txn.log(scope, str(row.id), "deleted", document(row), None)
    return len(removed), len(removed) == limit
