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
from dataclasses import replace
from typing import TYPE_CHECKING, Final, NamedTuple, TypedDict

import orjson

from reactor._base.keys import QUEUE_PREFIX, check_key
from reactor._base.values import encode
from reactor._storage.records import JobRow, QueueRow
from reactor._storage.txn import WriteTxn
from reactor.errors import InvalidArgumentError, InvalidKeyError, LockNotOwnedError

from . import queue_settings as _settings
from .attempts import add_error, last_error

if TYPE_CHECKING:
    from reactor._engine.options import Options

__all__ = [
    "DEFAULT_LEASE",
    "READY",
    "TAKEN",
    "Outbox",
    "Put",
    "PutOptions",
    "QueueLockNeeded",
    "Restored",
    "ack",
    "check_delay",
    "check_lease",
    "check_put",
    "check_queue",
    "document",
    "enqueue",
    "extend",
    "lock_name",
    "nack",
    "owned",
    "restore",
    "save_settings",
    "untake",
]

DEFAULT_LEASE: Final = 30.0
PREFIX: Final = QUEUE_PREFIX  # a queue's lock, and the scope of its change events
# A queue name leaves room for the prefix in a scope name (1,024 characters at most).
MAX_NAME: Final = 1024 - len(PREFIX)
READY: Final = '{"state":"ready"'  # how the document of a ready job begins
TAKEN: Final = '{"state":"taken"'  # and of a taken one
_PRIORITY: Final = 2**31  # priorities are 32-bit integers


class QueueLockNeeded(Exception):
    """A write holding a queue in shared mode needs it held plainly: a take found flow
    control (every take must count the same jobs and window), or a put found the queue
    new or a key held. It is made again, holding the queue's lock."""


class Put(NamedTuple):
    """What a put or an enqueue stores: the item's JSON text, its delay, idempotency
    key, priority, group, and debounce (seconds; None: not debounced)."""

    item: str
    delay: float | None = None
    key: str | None = None
    priority: int = 0
    group: str | None = None
    debounce: float | None = None


class PutOptions(TypedDict, total=False):
    """A put's flow control (``Queue.put``'s keywords, ``tx.enqueue``'s too)."""

    priority: int
    group: str | None
    debounce: float | None


# What an import restores: a put, then the job's takes so far, its state ("ready" or
# "dead") and the errors of its attempts (JSON text; None: none).
Restored = tuple[Put, int, str, str | None]


def lock_name(queue: str) -> str:
    """The lock every write of ``queue`` holds, and the scope of its events."""
    return PREFIX + queue


def document(row: JobRow) -> str:
    """The JSON text a change of job ``row`` records (its item is JSON text already):
    state first (a waiter tells a job that became ready from its first bytes), then
    attempts, ``ready_at`` and item; its priority and group when it has them, and the
    text of its last failed attempt's error (``error``) when it has one."""
    text = (
        f'{{"state":"{row.state}","attempts":{row.attempts},'
        f'"ready_at":{float(row.ready_at)!r},"item":{row.item}'
    )
    if row.priority:
        text += f',"priority":{row.priority}'
    if row.group is not None:
        text += ',"group":' + orjson.dumps(row.group).decode()
    if row.errors is not None:
        text += ',"error":' + orjson.dumps(last_error(row.errors)).decode()
    return text + "}"


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


def check_delay(delay: object, *, zero: bool = False) -> float | None:
    """``delay`` in seconds (None: none; 0 too unless ``zero``).

    Raises:
        InvalidArgumentError: not None nor a finite number >= 0.
    """
    if delay is None:
        return None
    seconds = _seconds(delay, "delay", zero=True)
    return seconds if zero else seconds or None


def check_lease(lease: object, name: str = "lease") -> float:
    """A lease in seconds.

    Raises:
        InvalidArgumentError: not a finite number > 0.
    """
    return _seconds(lease, name, zero=False)


def _check_priority(priority: object) -> int:
    if type(priority) is not int or not -_PRIORITY <= priority < _PRIORITY:
        raise InvalidArgumentError(f"priority must be a 32-bit int, not {priority!r}")
    return priority


def check_put(
    options: Options,
    queue: object,
    item: object,
    delay: object = None,
    key: object = None,
    priority: object = 0,
    group: object = None,
    debounce: object = None,
) -> tuple[str, Put]:
    """The queue name and what to store, of a put or an enqueue.

    Raises:
        InvalidKeyError: a bad queue name, key or group.
        InvalidValueError: ``item`` is not storable JSON.
        InvalidArgumentError: a bad delay, priority or debounce (or one without a key,
            or with a delay).
    """
    name = check_queue(queue)
    if options.codec is not None:
        item = options.codec.encode(item)
    text = encode(item, max_depth=options.max_depth, max_bytes=options.max_value_bytes)
    checked = None if key is None else check_key(key, "idempotency key")
    seconds = None
    if debounce is not None:
        seconds = _seconds(debounce, "debounce", zero=True)
        if checked is None:
            raise InvalidArgumentError("debounce needs a key: the job it replaces holds it")
        if delay is not None:
            raise InvalidArgumentError("give debounce or delay, not both: debounce is a delay")
    return name, Put(
        text,
        check_delay(delay),
        checked,
        _check_priority(priority),
        None if group is None else check_key(group, "group"),
        seconds,
    )


# -- transitions, in a write transaction holding the queue's lock ---------------------
def save_settings(txn: WriteTxn, queue: str, settings: _settings.Settings | None) -> int:
    """Create the queue if it does not exist, and store ``settings`` (None: the
    defaults, on creation only); its ``max_attempts`` now."""
    jobs = txn.writes.jobs()
    found = jobs.queue(queue)
    row = _settings.settled(found, settings)
    _settings.save(jobs, queue, row, found)
    return row.max_attempts


def enqueue(
    txn: WriteTxn,
    queue: str,
    entries: list[Put],
    settings: _settings.Settings | None = None,
    *,
    shared: bool = False,
) -> list[int]:
    """Add a job for each entry, in order (creating the queue if need be, storing
    ``settings``); their ids.

    An entry with an idempotency key that a job of the queue holds (in any state, dead
    too: a job holds its key until it is acknowledged) adds nothing and gets that job's
    id (the newest's, if several hold it). A debounced entry replaces the item, time,
    priority and group of the waiting job that holds its key (ready or delayed), which
    keeps its id; if none waits, it adds a job.

    ``shared``: the transaction holds the queue in shared mode (and each key's own
    lock): the queue's row is locked as it is read, so that such puts number their
    jobs in turn.

    Raises:
        QueueLockNeeded: in shared mode, the queue is new, or a job holds a key (its
            take may be under way): put again holding the queue's lock.
    """
    entered: list[Restored] = [(entry, 0, "ready", None) for entry in entries]
    return _add(txn, queue, entered, settings, shared)[0]


def restore(txn: WriteTxn, queue: str, entries: list[Restored]) -> int:
    """Add the jobs of an import, in order, each with its takes so far, its state
    (``"ready"`` or ``"dead"``; ready or dead ``delay`` seconds from now) and errors, as
    new jobs of the queue (creating it if need be); how many were added. An entry whose
    idempotency key a job of the queue holds adds nothing, as in ``enqueue``."""
    return _add(txn, queue, entries, None)[1]


class _Batch:
    """The jobs one ``enqueue`` adds, and the key holders it sees: those stored, and
    the jobs it adds."""

    def __init__(
        self,
        txn: WriteTxn,
        queue: str,
        holders: dict[str, list[tuple[int, str]]],
        next_id: int,
    ) -> None:
        self.txn = txn
        self.queue = queue
        self.next_id = next_id
        self.rows: dict[int, tuple[JobRow, str | None]] = {}  # new jobs: row and key
        self.holders = holders

    def add(self, put: Put, attempts: int, state: str, errors: str | None) -> int:
        """The id of the job ``put`` adds, or of the one it leaves or replaces."""
        held = self.holders.get(put.key, []) if put.key is not None else []
        if put.debounce is not None:
            waiting = [job_id for job_id, held_state in held if held_state == "ready"]
            if waiting:
                return self._replace(waiting[-1], put)
        elif held:
            return held[-1][0]
        job_id, self.next_id = self.next_id, self.next_id + 1
        ready_at = self.txn.now + (put.delay or put.debounce or 0.0)
        row = JobRow(job_id, put.item, state, ready_at, attempts, None, put.priority, put.group)
        row.errors = errors
        self.rows[job_id] = (row, put.key)
        if put.key is not None:
            self.holders.setdefault(put.key, []).append((job_id, state))
        return job_id

    def _replace(self, job_id: int, put: Put) -> int:
        """A debounced put on the waiting job ``job_id``: new item, time, priority, group."""
        ready_at = self.txn.now + (put.debounce or 0.0)
        if job_id in self.rows:  # added by this batch: not written yet
            row, key = self.rows[job_id]
            new = replace(
                row, item=put.item, ready_at=ready_at, priority=put.priority, group=put.group
            )
            self.rows[job_id] = (new, key)
            return job_id
        jobs = self.txn.writes.jobs()
        old = jobs.job(self.queue, job_id)
        assert old is not None, "a job the batch read is gone under the queue's lock"
        new = replace(old, item=put.item, ready_at=ready_at, priority=put.priority, group=put.group)
        jobs.replace_job(self.queue, new)
        self.txn.log(lock_name(self.queue), str(job_id), "updated", document(old), document(new))
        return job_id


def _add(
    txn: WriteTxn,
    queue: str,
    entries: list[Restored],
    settings: _settings.Settings | None,
    shared: bool = False,
) -> tuple[list[int], int]:
    """``enqueue`` of entries that carry their takes, state and errors: the ids, and
    how many jobs were added."""
    jobs = txn.writes.jobs()
    keys = [entry[0].key for entry in entries if entry[0].key is not None]
    if shared:
        # No job may hold a key (else QueueLockNeeded): each entry adds one, so the ids
        # are reserved as the row is read, in one statement on PostgreSQL.
        found, held = jobs.reserve_ids(queue, len(entries), keys)
        if found is None or held:
            raise QueueLockNeeded(queue)
        holders: dict[str, list[tuple[int, str]]] = {}
        stored: QueueRow | None = _settings.replace_next_id(found, found.next_id + len(entries))
    else:
        found, holders = jobs.put_view(queue, keys)  # one round trip
        stored = found
    row = _settings.settled(found, settings)
    batch = _Batch(txn, queue, holders, row.next_id)
    ids = [batch.add(*entry) for entry in entries]
    # (shared: written again only if two entries shared a key, so added one job)
    _settings.save(jobs, queue, _settings.replace_next_id(row, batch.next_id), stored)
    if batch.rows:
        now = txn.now
        jobs.add_jobs(
            [
                (
                    queue,
                    new.id,
                    new.item,
                    new.state,
                    new.ready_at,
                    new.attempts,
                    None,
                    key,
                    now,
                    new.priority,
                    new.group,
                    new.errors,
                )
                for new, key in batch.rows.values()
            ]
        )
        scope = lock_name(queue)
        for new, _ in batch.rows.values():
            txn.log(scope, str(new.id), "created", None, document(new))
    return ids, len(batch.rows)


def owned(txn: WriteTxn, queue: str, job_id: int, token: str) -> JobRow:
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


def ack(txn: WriteTxn, queue: str, job_id: int, token: str, held: JobRow | None = None) -> None:
    """The job is done: remove it (its idempotency key is free again). ``held``: the
    job's row as ``owned`` found it earlier in this transaction (not read again)."""
    row = held if held is not None else owned(txn, queue, job_id, token)
    txn.writes.jobs().delete_job(queue, job_id)
    txn.log(lock_name(queue), str(job_id), "deleted", document(row), None)


def nack(
    txn: WriteTxn,
    queue: str,
    job_id: int,
    token: str,
    delay: float | None,
    error: str | None,
    taker: str,
) -> str:
    """The job failed (``error``: why, None: not said; ``taker``: who, ``worker()``'s
    text): its attempt's error is recorded, and it is ready again after ``delay`` (None:
    the queue's backoff, or at once), or dead once taken ``max_attempts`` times; its new
    state."""
    row = owned(txn, queue, job_id, token)
    jobs = txn.writes.jobs()
    settings = _settings.settled(jobs.queue(queue), None)
    errors = add_error(row.errors, row.attempts, txn.now, error, taker)
    if row.attempts >= settings.max_attempts:
        state, ready_at = "dead", txn.now
    else:
        wait = delay if delay is not None else _settings.backoff_delay(settings, row.attempts)
        state, ready_at = "ready", txn.now + (wait or 0.0)
    new = replace(row, state=state, ready_at=ready_at, owner=None, errors=errors, worker=None)
    jobs.set_job(queue, new)
    txn.log(lock_name(queue), str(job_id), "updated", document(row), document(new))
    return new.state


def extend(txn: WriteTxn, queue: str, job_id: int, token: str, seconds: float) -> float:
    """Renew the lease to ``seconds`` from now; its new end."""
    row = owned(txn, queue, job_id, token)
    new = replace(row, ready_at=txn.now + seconds)
    txn.writes.jobs().set_job(queue, new)
    txn.log(lock_name(queue), str(job_id), "updated", document(row), document(new))
    return new.ready_at


def untake(txn: WriteTxn, queue: str, taken: JobRow, token: str) -> bool:
    """Undo a take nobody will see (its taker was cancelled): the job as it was before
    (``taken``, read then), if ``token`` still holds it; whether it did."""
    jobs = txn.writes.jobs()
    row = jobs.job(queue, taken.id)
    if row is None or row.state != "taken" or row.owner != token:
        return False
    jobs.set_job(queue, taken)
    txn.log(lock_name(queue), str(taken.id), "updated", document(row), document(taken))
    return True


class Outbox:
    """What a transaction body enqueued, in order: enqueued in the transaction that
    commits it (``WriteTxn.defer``), a few statements per queue."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[str, Put]] = []

    def add(self, queue: str, entry: Put) -> None:
        self._entries.append((queue, entry))

    def __call__(self, txn: WriteTxn) -> None:
        run: list[Put] = []
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
