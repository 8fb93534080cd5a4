"""Leases that ran out: a job whose worker did not ``ack``, ``nack`` or ``extend`` in
time is ready again (in line from the lease's end), or dead once it has been taken
``max_attempts`` times; its attempt's error says so, with the worker that held it.

A take turns back the leases of its own queue first (``take``); the sweeper turns back
those of every queue (``expire_leases``), so that a dead worker's jobs come back even
when nobody takes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Final

from reactor._storage.records import JobRow
from reactor._storage.txn import WriteTxn

from . import queue_settings as _settings
from .attempts import LEASE_RAN_OUT, add_error
from .jobs import document, lock_name

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

__all__ = ["EXPIRE_BATCH", "expire", "expire_leases", "turn_back", "turn_back_leases"]

EXPIRE_BATCH: Final = 1000  # leases turned back per transaction
# Queues whose leases one transaction turns back (each a lock to take on PostgreSQL).
LEASE_QUEUES: Final = 100


def turn_back(txn: WriteTxn, queue: str, due: list[JobRow], max_attempts: int) -> list[JobRow]:
    """Turn back the taken jobs ``due`` (their leases ran out, earliest first): ready
    again, or dead once taken ``max_attempts`` times, each with its attempt's error.
    Those ready again, as they are now."""
    jobs = txn.writes.jobs()
    scope = lock_name(queue)
    ready: list[JobRow] = []
    for row in due:  # in the order they ran out
        state = "ready" if row.attempts < max_attempts else "dead"
        errors = add_error(row.errors, row.attempts, row.ready_at, LEASE_RAN_OUT, row.worker)
        new = replace(row, state=state, owner=None, errors=errors, worker=None)
        jobs.set_job(queue, new)
        txn.log(scope, str(row.id), "updated", document(row), document(new))
        if state == "ready":
            ready.append(new)
    return ready


def expire(txn: WriteTxn, queues: list[str], limit: int = EXPIRE_BATCH) -> tuple[int, bool]:
    """Turn back jobs of ``queues`` whose lease ran out, up to ``limit`` in all (shared
    out between the queues, at least one each): ready again (``ready_at`` stays the end
    of the lease: in line from when it became ready), or dead once they have been taken
    ``max_attempts`` times. How many, and whether a queue may have more."""
    each = max(1, limit // max(1, len(queues)))
    found = txn.statements.jobs().leases_run_out(queues, txn.now, each)
    turned, more = 0, False
    for queue in queues:
        settings, due = found[queue]
        if due:
            turn_back(txn, queue, due, _settings.settled(settings, None).max_attempts)
            turned += len(due)
            more = more or len(due) == each
    return turned, more


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
