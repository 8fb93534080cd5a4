"""Work queues in the database: the transitions of a job, each run in a write
transaction (SPEC §13, Queues). The handles are ``_queues``'.

``reactor_jobs`` is the truth. A job is ``ready`` (it may be taken from ``ready_at``
on), ``taken`` (held by ``owner``, a token drawn at each take, until ``ready_at``: the
end of its lease) or ``dead``; ``attempts`` counts its takes. ``reactor_queues`` holds a
queue's ``max_attempts`` and the id of its next job (ids never come back).

Every function here runs in a write transaction that holds the queue's lock
(``lock_name``: on PostgreSQL an advisory lock taken as the transaction begins; on
SQLite the one write lock). It reads what it changes with no other writer of the queue
in between, in any process: a job is taken by one taker, and a lease that runs out is
turned back (or dead) once, however many processes sweep.

Each transition is recorded with ``WriteTxn.log`` as a change of scope ``queue:NAME``,
key the job's id: it has a revision and an event like any write. Its values are small
documents, ``{"state", "attempts", "ready_at", "item"}`` (state first: a waiter tells a
job that became ready from the text's first bytes).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

from reactor._base.keys import QUEUE_PREFIX, check_key
from reactor._base.values import encode
from reactor._storage.records import JobRow
from reactor._storage.txn import WriteTxn
from reactor.errors import InvalidArgumentError, InvalidKeyError, LockNotOwnedError

if TYPE_CHECKING:
    from reactor._engine.options import Options
    from reactor._engine.port import EnginePort
    from reactor._storage.statements import JobWrites

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_MAX_ATTEMPTS",
    "READY",
    "Entry",
    "Outbox",
    "Restored",
    "ack",
    "check_lease",
    "check_max_attempts",
    "check_put",
    "check_queue",
    "document",
    "enqueue",
    "expire",
    "expire_leases",
    "extend",
    "lock_name",
    "nack",
    "restore",
    "retry_dead",
    "take",
    "turn_back_leases",
    "untake",
]

DEFAULT_MAX_ATTEMPTS: Final = 5
DEFAULT_LEASE: Final = 30.0
PREFIX: Final = QUEUE_PREFIX  # a queue's lock, and the scope of its change events
# A queue name leaves room for the prefix in a scope name (1,024 characters at most).
MAX_NAME: Final = 1024 - len(PREFIX)
READY: Final = '{"state":"ready"'  # how the document of a ready job begins
EXPIRE_BATCH: Final = 1000  # leases turned back per transaction
# Queues whose leases one transaction turns back (each a lock to take on PostgreSQL).
LEASE_QUEUES: Final = 100
RETRY_BATCH: Final = 1000  # dead jobs revived per transaction

# What a put or an enqueue stores: the item's JSON text, its delay, its idempotency key.
Entry = tuple[str, float | None, str | None]
# What an import restores: an entry, then the job's takes so far and its state.
Restored = tuple[str, float | None, str | None, int, str]


def lock_name(queue: str) -> str:
    """The lock every write of ``queue`` holds, and the scope of its events."""
    return PREFIX + queue


def document(state: str, attempts: int, ready_at: float, item: str) -> str:
    """The JSON text a change of a job records (``item`` is JSON text already)."""
    return (
        f'{{"state":"{state}","attempts":{attempts},"ready_at":{float(ready_at)!r},"item":{item}}}'
    )


def _document(row: JobRow) -> str:
    return document(row.state, row.attempts, row.ready_at, row.item)


# -- checks, in the caller's thread ---------------------------------------------------
def check_queue(name: object) -> str:
    """``name`` as a queue name.

    Raises:
        InvalidKeyError: not a valid name, or longer than 1,018 characters (its events'
            scope, ``queue:NAME``, is a scope name).
    """
    checked = check_key(name, "queue name")
    if len(checked) > MAX_NAME:
        raise InvalidKeyError(f"a queue name is at most {MAX_NAME} characters")
    return checked


def _seconds(value: object, name: str, *, zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{name} must be a number of seconds, not {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise InvalidArgumentError(f"{name} must be a finite number {bound}, not {value!r}")
    return seconds


def check_delay(delay: object) -> float | None:
    """``delay`` in seconds (None: none).

    Raises:
        InvalidArgumentError: not None nor a finite number >= 0.
    """
    return None if delay is None else _seconds(delay, "delay", zero=True) or None


def check_lease(lease: object, name: str = "lease") -> float:
    """A lease in seconds.

    Raises:
        InvalidArgumentError: not a finite number > 0.
    """
    return _seconds(lease, name, zero=False)


def check_max_attempts(max_attempts: object) -> int | None:
    """Raises:
    InvalidArgumentError: not None nor an int >= 1."""
    if max_attempts is None:
        return None
    if type(max_attempts) is not int or not 1 <= max_attempts < 2**31:
        raise InvalidArgumentError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
    return max_attempts


def check_put(
    options: Options, queue: object, item: object, delay: object, key: object
) -> tuple[str, Entry]:
    """The queue name and what to store, of a put or an enqueue.

    Raises:
        InvalidKeyError: a bad queue name or key.
        InvalidValueError: ``item`` is not storable JSON.
        InvalidArgumentError: a bad delay.
    """
    name = check_queue(queue)
    text = encode(item, max_depth=options.max_depth, max_bytes=options.max_value_bytes)
    checked = None if key is None else check_key(key, "idempotency key")
    return name, (text, check_delay(delay), checked)


# -- transitions, in a write transaction holding the queue's lock ---------------------
def _settle(found: tuple[int, int] | None, max_attempts: int | None) -> tuple[int, int, int | None]:
    """Of a queue whose row is ``found`` (``JobReads.queue``; None: no queue yet): its
    ``max_attempts`` (``max_attempts`` if given, which is to be saved), the id of its
    next job, and the ``max_attempts`` stored (None: no queue yet)."""
    if found is None:
        return max_attempts or DEFAULT_MAX_ATTEMPTS, 1, None
    stored, next_id = found
    return max_attempts or stored, next_id, stored


def _save(
    jobs: JobWrites, queue: str, max_attempts: int, next_id: int, stored: int | None, used: bool
) -> None:
    """Write the queue's row, if new or changed (``used``: ids were taken)."""
    if stored is None:
        jobs.add_queue(queue, max_attempts, next_id)
    elif used or max_attempts != stored:
        jobs.set_queue(queue, max_attempts, next_id)


def save_settings(txn: WriteTxn, queue: str, max_attempts: int | None) -> int:
    """Create the queue if it does not exist, saving ``max_attempts`` (the default if
    None, on creation only); its ``max_attempts`` now."""
    jobs = txn.writes.jobs()
    attempts, next_id, stored = _settle(jobs.queue(queue), max_attempts)
    _save(jobs, queue, attempts, next_id, stored, used=False)
    return attempts


def enqueue(
    txn: WriteTxn, queue: str, entries: list[Entry], max_attempts: int | None = None
) -> list[int]:
    """Add a job for each entry, in order (creating the queue if need be); their ids.
    An entry whose idempotency key a job of the queue holds (in any state, dead too:
    a job holds its key until it is acknowledged) adds nothing and gets that job's id."""
    return _add(txn, queue, [(*entry, 0, "ready") for entry in entries], max_attempts)[0]


def restore(txn: WriteTxn, queue: str, entries: list[Restored]) -> int:
    """Add the jobs of an import, in order, each with its takes so far and its state
    (``"ready"`` or ``"dead"``; ready or dead ``delay`` seconds from now), as new jobs
    of the queue (creating it if need be); how many were added. An entry whose
    idempotency key a job of the queue holds adds nothing, as in ``enqueue``."""
    return _add(txn, queue, entries, None)[1]


def _add(
    txn: WriteTxn, queue: str, entries: list[Restored], max_attempts: int | None
) -> tuple[list[int], int]:
    """``enqueue`` of entries that carry their takes and state: the ids, and how many
    jobs were added."""
    jobs = txn.writes.jobs()
    attempts, next_id, stored = _settle(jobs.queue(queue), max_attempts)
    keys = [entry[2] for entry in entries if entry[2] is not None]
    holding = jobs.ids_by_key(queue, keys) if keys else {}
    ids: list[int] = []
    rows: list[tuple[Any, ...]] = []
    now = txn.now
    for text, delay, key, taken, state in entries:
        if key is not None and key in holding:
            ids.append(holding[key])
            continue
        job_id, next_id = next_id, next_id + 1
        if key is not None:
            holding[key] = job_id
        rows.append((queue, job_id, text, state, now + (delay or 0.0), taken, None, key, now))
        ids.append(job_id)
    # Reads first, then the writes: nothing here can fail half-way but the database.
    _save(jobs, queue, attempts, next_id, stored, used=bool(rows))
    if rows:
        jobs.add_jobs(rows)
        scope = lock_name(queue)
        for _, job_id, text, state, ready_at, count, *_ in rows:
            txn.log(scope, str(job_id), "created", None, document(state, count, ready_at, text))
    return ids, len(rows)


def expire(txn: WriteTxn, queues: list[str], limit: int = EXPIRE_BATCH) -> tuple[int, bool]:
    """Turn back jobs of ``queues`` whose lease ran out, up to ``limit`` in all (shared
    out between the queues, at least one each): ready again (``ready_at`` stays the end
    of the lease: in line from when it became ready), or dead once they have been taken
    ``max_attempts`` times. How many, and whether a queue may have more."""
    each = max(1, limit // max(1, len(queues)))
    found = txn.statements.jobs().leases_run_out(queues, txn.now, each)
    turned, more = 0, False
    for queue in queues:
        max_attempts, due = found[queue]
        if due:
            _turn_back(txn, queue, due, max_attempts or DEFAULT_MAX_ATTEMPTS)
            turned += len(due)
            more = more or len(due) == each
    return turned, more


def _turn_back(txn: WriteTxn, queue: str, due: list[JobRow], max_attempts: int) -> list[JobRow]:
    """Turn back the taken jobs ``due`` (their leases ran out, earliest first): ready
    again, or dead once taken ``max_attempts`` times. Those ready again, as they are now."""
    jobs = txn.writes.jobs()
    ready = [row for row in due if row.attempts < max_attempts]
    dead = [row for row in due if row.attempts >= max_attempts]
    jobs.set_states(queue, [row.id for row in ready], "ready")
    jobs.set_states(queue, [row.id for row in dead], "dead")
    scope = lock_name(queue)
    for row in due:  # in the order they ran out
        old = _document(row)
        row.state = "ready" if row.attempts < max_attempts else "dead"
        txn.log(scope, str(row.id), "updated", old, _document(row))
    return ready


def take(
    txn: WriteTxn, queue: str, token: str, lease: float, max_attempts: int | None
) -> tuple[JobRow | None, JobRow | None, float | None]:
    """Take the first job ready now (leases run out turned back first), for ``token``
    until ``lease`` seconds from now: the job as it was before and as it is now (None,
    None: none is ready), and when one may be next (None: a job was taken, or no job
    waits)."""
    jobs = txn.writes.jobs()
    found, due, first = jobs.take_view(queue, txn.now, EXPIRE_BATCH)  # one read
    attempts, next_id, stored = _settle(found, max_attempts)
    if max_attempts is not None:
        _save(jobs, queue, attempts, next_id, stored, used=False)
    candidates = [first] if first is not None else []
    if due:  # a job whose lease ran out is in line from then: it may come first
        candidates += _turn_back(txn, queue, due, attempts)
    row = min(candidates, key=lambda job: (job.ready_at, job.id), default=None)
    if row is None:
        ready, taken = jobs.next_times(queue)
        return None, None, min((t for t in (ready, taken) if t is not None), default=None)
    new = JobRow(row.id, row.item, "taken", txn.now + lease, row.attempts + 1, token)
    jobs.set_job(queue, new)
    txn.log(lock_name(queue), str(row.id), "updated", _document(row), _document(new))
    return row, new, None


def _owned(txn: WriteTxn, queue: str, job_id: int, token: str) -> JobRow:
    """The job, if ``token`` holds its lease now.

    Raises:
        LockNotOwnedError: it does not (the lease ran out, or the job was acknowledged,
            or given back, or never taken by this taker); nothing changes.
    """
    row = txn.statements.jobs().job(queue, job_id)
    if row is None or row.state != "taken" or row.owner != token or row.ready_at <= txn.now:
        raise LockNotOwnedError(
            f"job {job_id} of queue {queue!r} is not held by this taker (its lease ran out, "
            "or it was acknowledged or given back already)"
        )
    return row


def ack(txn: WriteTxn, queue: str, job_id: int, token: str) -> None:
    """The job is done: remove it (its idempotency key is free again)."""
    row = _owned(txn, queue, job_id, token)
    txn.writes.jobs().delete_job(queue, job_id)
    txn.log(lock_name(queue), str(job_id), "deleted", _document(row), None)


def nack(txn: WriteTxn, queue: str, job_id: int, token: str, delay: float | None) -> str:
    """The job failed: ready again after ``delay`` (or dead, once taken
    ``max_attempts`` times); its new state."""
    row = _owned(txn, queue, job_id, token)
    jobs = txn.writes.jobs()
    found = jobs.queue(queue)
    max_attempts = DEFAULT_MAX_ATTEMPTS if found is None else found[0]
    if row.attempts >= max_attempts:
        new = JobRow(row.id, row.item, "dead", txn.now, row.attempts, None)
    else:
        new = JobRow(row.id, row.item, "ready", txn.now + (delay or 0.0), row.attempts, None)
    jobs.set_job(queue, new)
    txn.log(lock_name(queue), str(job_id), "updated", _document(row), _document(new))
    return new.state


def extend(txn: WriteTxn, queue: str, job_id: int, token: str, seconds: float) -> float:
    """Renew the lease to ``seconds`` from now; its new end."""
    row = _owned(txn, queue, job_id, token)
    new = JobRow(row.id, row.item, "taken", txn.now + seconds, row.attempts, token)
    txn.writes.jobs().set_job(queue, new)
    txn.log(lock_name(queue), str(job_id), "updated", _document(row), _document(new))
    return new.ready_at


def untake(txn: WriteTxn, queue: str, taken: JobRow, token: str) -> bool:
    """Undo a take nobody will see (its taker was cancelled): the job as it was before
    (``taken``, read then), if ``token`` still holds it; whether it did."""
    jobs = txn.writes.jobs()
    row = jobs.job(queue, taken.id)
    if row is None or row.state != "taken" or row.owner != token:
        return False
    jobs.set_job(queue, taken)
    txn.log(lock_name(queue), str(taken.id), "updated", _document(row), _document(taken))
    return True


def retry_dead(txn: WriteTxn, queue: str, limit: int = RETRY_BATCH) -> int:
    """Make up to ``limit`` dead jobs ready now, with no attempt used, oldest death
    first; how many."""
    jobs = txn.writes.jobs()
    dead = jobs.in_state(queue, "dead", limit)
    if not dead:
        return 0
    jobs.revive(queue, [row.id for row in dead], txn.now)
    scope = lock_name(queue)
    for row in dead:
        new = JobRow(row.id, row.item, "ready", txn.now, 0, None)
        txn.log(scope, str(row.id), "updated", _document(row), _document(new))
    return len(dead)


class Outbox:
    """What a transaction body enqueued, in order: enqueued in the transaction that
    commits it (``WriteTxn.defer``), a few statements per queue."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[str, Entry]] = []

    def add(self, queue: str, entry: Entry) -> None:
        self._entries.append((queue, entry))

    def __call__(self, txn: WriteTxn) -> None:
        run: list[Entry] = []
        current: str | None = None
        for queue, entry in self._entries:  # each run of one queue at once, in order
            if queue != current and run:
                assert current is not None
                enqueue(txn, current, run)
                run = []
            current = queue
            run.append(entry)
        if run:
            assert current is not None
            enqueue(txn, current, run)


def expire_leases(engine: EnginePort) -> int:
    """Turn back the jobs whose lease ran out, in every queue, a transaction of many
    queues at a time (``turn_back_leases``) until none is left. How many.

    Raises:
        ClosedError: the engine closed.
        StorageError: a write failed.
    """
    turned = 0
    while True:
        count, more = turn_back_leases(engine)
        turned += count
        if not more:
            return turned


def turn_back_leases(engine: EnginePort) -> tuple[int, bool]:
    """Turn back jobs whose lease ran out, in one transaction: of up to
    ``LEASE_QUEUES`` queues, up to ``EXPIRE_BATCH`` jobs in all. How many, and whether
    more may be left: the sweeper does one such transaction per round, between its
    other chores, so that a worker that died holding jobs of thousands of queues keeps
    no timer or expiry waiting.

    Raises:
        ClosedError: the engine closed.
        StorageError: the write failed (the sweeper tries again later).
    """
    queues = engine.store.reader().jobs().queues_due(engine.now(), LEASE_QUEUES + 1)
    if not queues:
        return 0, False
    some = queues[:LEASE_QUEUES]
    count, more = engine.commit(
        lambda txn: expire(txn, some), scopes=[lock_name(queue) for queue in some]
    )
    return count, more or len(queues) > LEASE_QUEUES
