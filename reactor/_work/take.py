"""Taking a job (SPEC §13, Queues and "Flow control on queues"), in a write
transaction holding the queue's lock: every process counts the same taken jobs and the
same rate window, so a limit holds across threads and processes.

The order: the highest priority first, then the job that became ready first, then the
lowest id. Leases that ran out are turned back first: such a job is in line from the
end of its lease. Flow control, when the queue has any, holds a take back:

- ``concurrency``: that many jobs taken (under a lease not run out) and the take waits
  for one to be acked, nacked or to run out;
- ``rate``: ``limit`` takes in the last ``seconds`` and it waits for the oldest of them
  to leave the window (takes recorded more than ``CLOCK_SLACK`` seconds after now,
  the clock having moved back, are moved to now: the wait is never much longer than
  the window);
- ``group_concurrency``: the jobs of a group with that many taken are passed over; the
  next eligible job is taken (one busy group never blocks the others).

A take that gets nothing says when a job may be next: its waiter sleeps until then, or
until an event wakes it (a job made ready, or a taken one acked, nacked or dead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from reactor._storage.records import JobRow, QueueRow
from reactor._storage.txn import WriteTxn

from . import queue_settings as _settings
from .jobs import QueueLockNeeded, document, lock_name
from .leases import EXPIRE_BATCH, turn_back

if TYPE_CHECKING:
    from reactor._storage.statements import JobWrites

__all__ = ["QueueLockNeeded", "take"]

Taken = tuple[JobRow | None, JobRow | None, float | None]
# How far ahead of a take's clock another take may be recorded without the clock having
# moved back: more than any wait for the queue's lock (a busy timeout is 30 s).
CLOCK_SLACK: Final = 60.0


def _order(job: JobRow) -> tuple[int, float, int]:
    return -job.priority, job.ready_at, job.id


def take(
    txn: WriteTxn,
    queue: str,
    token: str,
    lease: float,
    settings: _settings.Settings | None,
    taker: str,
    shared: bool = False,
) -> Taken:
    """Take the next job, for ``token`` (held by ``taker``: ``worker()``'s text) until
    ``lease`` seconds from now, storing the handle's ``settings`` first: the job as it
    was before and as it is now (None, None: none may be taken now), and when one may
    be (None: a job was taken, or no job waits).

    ``shared``: the transaction holds the queue in shared mode (``SharedScope``), with
    no ``settings`` to store; the jobs it reads are locked (passed over if another
    transaction holds them).

    Raises:
        QueueLockNeeded: in shared mode, the queue has flow control.
    """
    jobs = txn.writes.jobs()
    found, due, first = jobs.take_view(queue, txn.now, EXPIRE_BATCH)  # one read
    row = _settings.settled(found, settings)
    if shared and (row.concurrency or row.group_concurrency or row.rate_limit):
        raise QueueLockNeeded(queue)
    if settings is not None:
        _settings.save(jobs, queue, row, found)
    candidates = [first] if first is not None else []
    if due:  # a job whose lease ran out is in line from then: it may come first
        candidates += turn_back(txn, queue, due, row.max_attempts)
    if row.concurrency or row.group_concurrency or row.rate_limit:
        held = _held_back(txn, jobs, queue, row)
        if held is not None:
            return held
        job = jobs.first_ready(queue, txn.now, row.group_concurrency)
    else:
        job = min(candidates, key=_order, default=None)
    return _take(txn, queue, job, token, lease, row, taker)


def _held_back(txn: WriteTxn, jobs: JobWrites, queue: str, row: QueueRow) -> Taken | None:
    """Nothing, and when to look again, if the queue's concurrency or rate forbids a
    take now; None if they allow one."""
    now = txn.now
    if row.concurrency is not None and jobs.taken_count(queue, now) >= row.concurrency:
        return None, None, jobs.next_times_after(queue, now)[1]  # or an event, sooner
    if row.rate_limit is not None and row.rate_seconds is not None:
        oldest = jobs.nth_last_take(queue, row.rate_limit)
        if oldest is not None and oldest > now:
            # Later than now: taken by a transaction that began after this one (whose
            # clock read came before its wait for the lock), or the clock went back.
            # Only a take further ahead than any wait for a lock can be is the clock's:
            # those are moved to now, so that the window ends in ``rate_seconds``.
            latest = jobs.nth_last_take(queue, 1)
            if latest is not None and latest > now + max(row.rate_seconds, CLOCK_SLACK):
                jobs.clamp_takes(queue, now)
                oldest = now
        if oldest is not None and oldest > now - row.rate_seconds:
            return None, None, oldest + row.rate_seconds
    return None


def _take(
    txn: WriteTxn,
    queue: str,
    job: JobRow | None,
    token: str,
    lease: float,
    row: QueueRow,
    taker: str,
) -> Taken:
    """Take ``job`` (None: there is none to take: say when one may be)."""
    jobs = txn.writes.jobs()
    now = txn.now
    if job is None:
        if row.concurrency or row.group_concurrency or row.rate_limit:
            # Jobs ready now may be held back (their group is full): not those times.
            times = jobs.next_times_after(queue, now)
        else:
            times = jobs.next_times(queue)
        return None, None, min((t for t in times if t is not None), default=None)
    new = JobRow(  # not dataclasses.replace: a take's path counts its calls
        job.id,
        job.item,
        "taken",
        now + lease,
        job.attempts + 1,
        token,
        job.priority,
        job.group,
        job.errors,
        taker,
    )
    jobs.set_job(queue, new)
    if row.rate_limit is not None and row.rate_seconds is not None:
        jobs.add_take(queue, now, job.id)
        # Kept a while past the window: a take whose clock read is older than this one's
        # (it waited for the lock) counts its window from its own time.
        jobs.prune_takes(queue, now - row.rate_seconds - CLOCK_SLACK)
    txn.log(lock_name(queue), str(job.id), "updated", document(job), document(new))
    return job, new, None
