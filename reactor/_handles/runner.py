"""``Runner``: one taken run of a durable workflow, in a worker thread, and its records
(SPEC §14).

Every record is made in a transaction that holds the run's workflow (and its parent's,
whose run a record of this one's end may make ready): it first checks that this worker
still holds the run's job (its lease: fencing), writes the record, and then honours a
cancellation asked for meanwhile. A record that cannot be made ends the call of the
workflow function (``Unwind``), leaving the run to whoever holds it now.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._storage.txn import WriteTxn
from reactor._work import runs as _runs
from reactor.errors import LockNotOwnedError, OperationTimeout, RunDeadError

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

    from .jobs import Job

__all__ = ["Runner", "Unwind"]

logger = logging.getLogger("reactor")
T = TypeVar("T")
Change = Callable[[_runs.Store, _runs.Document], T]


class Unwind(BaseException):
    """Ends a call of the workflow function: the run was recorded as suspended or
    finished, released, or is no longer this worker's. A ``BaseException``, so that the
    function's ``except Exception`` does not stop it."""


class Runner:
    """One taken run, in one worker thread: its records."""

    def __init__(
        self,
        engine: EnginePort,
        job: Job,
        workflow: str,
        max_attempts: int,
        stopping: threading.Event,
    ) -> None:
        self.engine = engine
        self.job = job
        self.workflow = workflow
        item = job.item if isinstance(job.item, dict) else {"id": job.item, "parent": None}
        self.run_id = str(item["id"])
        self.locks = _runs.locks(workflow, item.get("parent"))
        # A record that only writes the run's document and its job (claim, step, end),
        # of a run without a parent, holds its workflow's scopes in shared mode: the
        # job's row lock keeps its records in turn, and other runs' go on beside them.
        self.child = item.get("parent") is not None  # its end may make its parent ready
        self.shared_locks: tuple[str, ...] = (
            self.locks if self.child else _runs.shared_locks(workflow)
        )
        self.reads = ((_runs.scope_of(workflow), self.run_id),)
        self.max_attempts = max_attempts
        self.stopping = stopping
        self.lost = False  # the lease ran out (the keeper found it so)
        self.acked = False  # the record under way acknowledged the job
        self.ended = False  # the record under way ended the run (cancelled, say)

    # -- transactions ---------------------------------------------------------------
    def apply(self, txn: WriteTxn, change: Change[T]) -> T | None:
        """``change(store, doc)`` in ``txn``, a transaction holding ``self.locks``: the
        lease checked first, a cancellation honoured after (``self.ended``).

        Raises:
            LockNotOwnedError: this worker does not hold the run's job any more.
        """
        self.acked = self.ended = False
        store = _runs.Store(self.engine.options, txn)
        doc = store.read(self.workflow, self.run_id)
        if doc is None or doc["status"] in _runs.FINAL:  # cancelled, or an orphan job
            self.job_done(store)
            self.ended = True
            return None
        self.job.hold(txn)
        done = change(store, doc)
        doc = store.read(self.workflow, self.run_id)
        if doc is not None and doc["cancel"] and doc["status"] not in _runs.FINAL:
            if not self.acked:
                self.job_done(store)
            store.finish(doc, "cancelled")
            self.ended = True
        return done

    def commit(self, change: Change[T], extra: tuple[str, ...] = (), *, own: bool = False) -> T:
        """``change(store, doc)`` in a transaction (``apply``), holding the scopes of
        ``extra`` too; ``own``: the change writes the run's document and job only (not
        a put: ``shared_locks``). Other worker threads' records may share the
        transaction: a change raises before it acknowledges the job, if ever.

        Raises:
            Unwind: the lease ran out (nothing written), or the run ended (cancelled).
        """
        scopes = sorted({*(self.shared_locks if own else self.locks), *extra})
        try:
            done = self.engine.commit(
                lambda txn: self.apply(txn, change), scopes=scopes, reads=self.reads, combine=True
            )
        except LockNotOwnedError:
            raise self.unwind_lost() from None
        if self.ended:
            raise Unwind
        return done  # type: ignore[return-value]

    def unwind_lost(self) -> Unwind:
        """What ends the call once the lease is found lost (logged)."""
        self.lost = True
        logger.warning(
            "run %s of workflow %r: this worker's lease ran out; it stops, and the run "
            "goes on with its next holder",
            self.run_id,
            self.workflow,
        )
        return Unwind()

    def job_done(self, store: _runs.Store) -> None:
        """Acknowledge the run's job in the record's transaction."""
        self.job.hold(store.txn, ack=True)
        self.acked = True

    # -- records ----------------------------------------------------------------------
    def claim(self, store: _runs.Store, doc: _runs.Document) -> _runs.Document | None:
        """A change (``apply``) that marks the run running, held by this worker: its
        document, or None when there is nothing to run (dead now: recorded). Made by
        the take that found the run (``take_then``): one transaction for both; a child
        run's alone after its take (``claim_alone``)."""
        if doc["held"] and doc["attempts"] >= self.max_attempts:
            # Its last holder's lease ran out, and that was its last attempt.
            error = RunDeadError(
                f"run {self.run_id} was taken {self.max_attempts} times, and each time "
                "its worker's lease ran out"
            )
            store.finish(doc, "failed", error=_runs.error_of(error))
            self.job_done(store)
            return None
        if doc["held"]:  # its last holder's lease ran out
            doc["attempts"] += 1
        doc["attempts"] = max(1, doc["attempts"])
        doc["held"] = True
        doc["status"] = "running"
        store.save(doc)
        return doc

    def claim_alone(self) -> _runs.Document | None:
        """``claim`` in a transaction of its own: a child run's, whose end there (dead,
        or cancelled) makes its parent ready, under its parent's locks too."""
        try:
            return self.commit(self.claim, own=True)
        except Unwind:
            return None

    def record_step(self, position: int, step: dict[str, Any]) -> None:
        """Record ``step`` at ``position`` (over a waiting one there)."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            store.put_step(doc, position, step)
            store.save(doc)

        self.commit(change, own=True)

    def finish(self, status: str, result: Any = None, error: dict[str, str] | None = None) -> None:
        """Record the run's end, and acknowledge its job."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            if doc["cancel"]:  # asked while it ran: cancel said True, so it is cancelled
                store.finish(doc, "cancelled")
            else:
                store.finish(doc, status, result, error)
            self.job_done(store)  # last: what may raise (the result's size) came first

        self.commit(change, own=True)

    def suspend(self, position: int, step: dict[str, Any], delay: float | None) -> Unwind:
        """Record ``step`` as waiting, the run as suspended: its job acknowledged, and
        one put that makes it ready in ``delay`` seconds (None: none; what it waits for
        makes it ready); what ends the call."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            suspend_in(store, doc, position, step)
            self.job_done(store)
            if delay is not None:
                store.ready(doc, max(delay, 0.0) or None)

        self.commit(change)
        return Unwind()

    def release(self) -> Unwind:
        """Give the run back (this process stops serving): ready again at once, for
        any worker, without counting an attempt; what ends the call."""

        def change(store: _runs.Store, doc: _runs.Document) -> None:
            doc["status"] = "pending"
            doc["held"] = False
            self.job_done(store)
            store.save(doc)
            store.ready(doc, None)

        self.commit(change)
        return Unwind()

    def receive(
        self, position: int, step: dict[str, Any], topic: str, deadline: float | None
    ) -> tuple[bool, Any]:
        """The next message of ``topic``, recorded at ``position``: (True, it); or
        (False, None) past ``deadline`` (recorded as a timeout).

        Raises:
            Unwind: none yet: the run is suspended until one comes, in the same
                transaction that found none (a message sent meanwhile would otherwise
                find the run still running, and wake nobody).
        """

        def change(store: _runs.Store, doc: _runs.Document) -> tuple[bool, Any] | None:
            now = store.txn.now
            waiting = doc["inbox"].get(topic) or []
            if waiting:
                message = waiting.pop(0)
                if not waiting:
                    del doc["inbox"][topic]
                done = {**step, "status": "succeeded", "result": message, "ended": now}
                store.put_step(doc, position, done)
                store.save(doc)
                return True, message
            if deadline is not None and now >= deadline:
                error = _runs.error_of(OperationTimeout(f"no message {topic!r} came in time"))
                failed = {**step, "status": "failed", "error": error, "ended": now}
                store.put_step(doc, position, failed)
                store.save(doc)
                return False, None
            suspend_in(store, doc, position, {**step, "status": "waiting"})
            self.job_done(store)
            if deadline is not None:
                store.ready(doc, max(deadline - now, 0.0) or None)
            return None

        outcome = self.commit(change)
        if outcome is None:
            raise Unwind
        return outcome

    def suspend_on_key(self, position: int, step: dict[str, Any]) -> bool:
        """Suspend the run on ``step`` (a ``wait_for``), unless its key changed since
        it was read (``step["seen"]``, its revision then: look again); whether it did.
        The serving processes' watchers wake it at the key's next change, its timeout
        by a delayed job."""

        def change(store: _runs.Store, doc: _runs.Document) -> bool:
            row = store.txn.row(step["scope"], step["key"])
            if row is not None and not row.live(store.txn.now):
                row = None
            if (0 if row is None else row.revision) != step["seen"]:
                return False
            suspend_in(store, doc, position, step)
            self.job_done(store)
            if step["deadline"] is not None:
                store.ready(doc, max(step["deadline"] - store.txn.now, 0.0) or None)
            return True

        return self.commit(change)


def suspend_in(
    store: _runs.Store, doc: _runs.Document, position: int, step: dict[str, Any]
) -> None:
    """Record ``step`` waiting at ``position``, and the run suspended (its job is the
    caller's to acknowledge)."""
    store.put_step(doc, position, step)
    doc["status"] = "suspended"
    doc["held"] = False
    store.save(doc)
