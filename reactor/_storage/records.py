"""The rows a store reads and writes: stored keys, change-log records, locks, timers and
jobs; the error for a write the database refuses, and how one error reaches several
callers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from reactor.errors import ReactorError, StorageError

__all__ = [
    "ChangeRecord",
    "Entangled",
    "JobRow",
    "Key",
    "LockRow",
    "QueueRow",
    "ReadsAhead",
    "RefusedError",
    "Reservation",
    "Row",
    "SharedScope",
    "TimerRow",
    "Upsert",
    "copy_error",
]

Key = tuple[str, str]


class Reservation(NamedTuple):
    """Job ids a write reserves in a queue (``JobWrites.reserve_ids``): how many
    (``ids``), and whether a job holds one of ``keys``; none if the row of key
    ``unless`` exists (a start of an id that has a run puts no job)."""

    queue: str
    ids: int
    keys: tuple[str, ...]
    unless: Key


class ReadsAhead(tuple[Key, ...]):
    """The keys a write reads (its ``reads``), with the job ids it will reserve: where
    the backend can, both are asked with its begin, in one round trip (a start)."""

    reserve: Reservation

    def __new__(cls, keys: tuple[Key, ...], reserve: Reservation) -> ReadsAhead:
        made = super().__new__(cls, keys)
        made.reserve = reserve
        return made


class SharedScope(str):
    """A scope a write holds in shared mode (among the ``scopes`` of a write): writes
    that hold it so go on together, across processes, and lock the rows they change
    (a queue's takes and acknowledgements, ``SKIP LOCKED``); a write that holds it
    plainly waits for them all, and they for it. Where a scope is both, it is held
    plainly. SQLite has one write lock: there it is a scope like any other."""

    __slots__ = ()


# A row to write: scope, key, JSON text, deadline, revision, created revision, version.
Upsert = tuple[str, str, str, float | None, int, int, int]


class RefusedError(StorageError):
    """The database refused what a write would store (a constraint or a trigger, a
    value or key past one of its limits), not the transaction: nothing was applied, the
    connection is sound, and the same write would be refused again. Writes that shared
    that transaction are tried again on their own (``Combiner``, ``Mailbox``), so that
    one refused write fails alone; the sweeper finds a refused timer by halving."""


class Entangled(RefusedError):
    """A piece of work sharing a transaction with others failed after statements of its
    own ran (``WriteTxn.rollback_to``): only the whole transaction's abort takes them
    back. Nothing was applied, and each piece is tried again alone, as for a refusal."""


@dataclass(slots=True)
class Row:
    """A stored key: its JSON text, absolute deadline, the revision of its last change
    and of its creation, and its version (1 at creation, +1 per change)."""

    value: str
    expires_at: float | None
    revision: int
    created_revision: int
    version: int

    def live(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now


@dataclass(slots=True)
class ChangeRecord:
    """One committed change, as the change log stores it."""

    scope: str
    key: str
    type: str
    old_value: str | None
    new_value: str | None
    ops: str | None
    revision: int
    timestamp: float
    version: int | None = None  # the key's version after the change; 0: gone
    timer: str | None = None  # the id of the timer whose write it is
    expires_at: float | None = None  # the deadline of the value it shows (see _schema)


@dataclass(slots=True)
class LockRow:
    """A lock's lease: its holder (None when free), fencing token and deadline."""

    owner: str | None
    token: int
    expires_at: float | None

    def held(self, now: float) -> bool:
        return self.owner is not None and self.expires_at is not None and self.expires_at > now


@dataclass(slots=True)
class TimerRow:
    """A scheduled write: its key, when it is due, its period if it recurs (``every``
    seconds, or a ``cron`` expression read in zone ``tz``), and what it writes: a
    value's JSON text, or update ops' JSON text."""

    id: str
    scope: str
    key: str
    due: float
    every: float | None
    value: str | None
    ops: str | None
    cron: str | None = None
    tz: str | None = None


@dataclass(slots=True)
class JobRow:
    """A job of a work queue: its id (in its queue), item (JSON text), state
    (``"ready"``, ``"taken"`` or ``"dead"``), ``ready_at`` (ready: when it may be
    taken; taken: when its lease runs out; dead: when it died), the takes so far, the
    token of its taker (taken only), its priority and group, the errors of its
    attempts (JSON text of a list; None: none) and its taker (JSON text: host, pid,
    thread; taken only)."""

    id: int
    item: str
    state: str
    ready_at: float
    attempts: int
    owner: str | None
    priority: int = 0
    group: str | None = None
    errors: str | None = None
    worker: str | None = None


@dataclass(slots=True, frozen=True)
class QueueRow:
    """A queue's row: ``max_attempts``, the id its next job takes, and its flow control
    and backoff (None: none)."""

    max_attempts: int
    next_id: int
    concurrency: int | None = None
    group_concurrency: int | None = None
    rate_limit: int | None = None
    rate_seconds: float | None = None
    backoff_base: float | None = None
    backoff_max: float | None = None


def copy_error(exc: Exception) -> Exception:
    """A fresh error per caller of a write that failed for several (a batch, a group
    commit), so that the tracebacks of concurrent raisers do not mix; an error that is
    not reactor's becomes a ``StorageError`` caused by it."""
    if isinstance(exc, ReactorError):
        fresh = type(exc)(*exc.args)
        fresh.__cause__ = exc.__cause__
        return fresh
    failure = StorageError(f"the write failed: {exc!r}")
    failure.__cause__ = exc
    return failure
