"""Group commit across scopes: the writes of one process share database transactions.

Each scope's actor runs one batch at a time, so a scope keeps exactly one writer and its
order. Batches of different scopes, though, reach the store from several threads at
once. Here they combine: a thread that finds no transaction running leads, and commits
its own work at once; a thread that finds one running queues its work and sleeps. When
the leader's commit ends it hands the lead to the first in line, which commits, in one
transaction, its own work and every other piece queued meanwhile; the others wake with
their results. A database has one writer at a time anyway (SQLite's lock, PostgreSQL's
revision lock): threads writing together then share its commits (one WAL flush, one
round trip) instead of queueing for it one by one.

Waking is cheap: each queued thread sleeps on a lock of its own, released once, by
whoever served it or handed it the lead; nobody else wakes, and nothing is polled. A
thread alone pays two acquisitions of an uncontended lock.

Only work that says it may be combined is: a piece that fails is undone alone
(``WriteTxn.rollback_to``), and the others commit; one that fails after running
statements of its own (a job's acknowledgement, say), which only the transaction's
abort takes back, has every piece of the batch tried again alone. Work that runs
statements of its own throughout (compaction, lock leases, subscriber positions) is
never combined.

A Ctrl-C may land at any bytecode of the thread that leads (the main thread): whatever
it took (the lead, others' work) is given back in a ``finally`` whose every step is a
single store or a call into C; a thread interrupted just as it was handed the lead
hands it on.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any, Final, Generic, TypeVar

from reactor.errors import BusyError, ClosedError, OutcomeUnknownError, StorageError

from .records import ChangeRecord, Entangled, RefusedError, copy_error
from .txn import WriteTxn

__all__ = ["Combiner"]

T = TypeVar("T")
_RECHECK: Final = 0.25  # seconds between checks of a waiting writer
CommitHook = Callable[[list[ChangeRecord]], None]
Key = tuple[str, str]
WriteOnce = Callable[
    [Callable[[WriteTxn], Any], float, CommitHook | None, Collection[str] | None, Collection[Key]],
    tuple[Any, list[ChangeRecord]],
]


class _Slot(Generic[T]):
    """One thread's work, and how the thread waits for it: ``wake`` is released once,
    when the work is ``done`` or the thread is to ``lead`` (and then commit ``batch``)."""

    __slots__ = (
        "batch",
        "done",
        "error",
        "lead",
        "now",
        "on_commit",
        "reads",
        "records",
        "result",
        "scopes",
        "shared",
        "wake",
        "work",
    )

    def __init__(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        on_commit: CommitHook | None,
        shared: bool,
        scopes: Collection[str] | None,
        reads: Collection[Key],
    ) -> None:
        self.work = work
        self.reads = reads
        self.now = now
        self.on_commit = on_commit
        self.shared = shared  # may commit together with others
        self.scopes = scopes  # what it touches (None: anything)
        self.done = False
        self.lead = False
        self.batch: list[_Slot[Any]] = []
        self.wake: Any = None  # a lock, taken, while the slot is in line
        self.result: Any = None
        self.error: BaseException | None = None
        self.records: list[ChangeRecord] = []


class Combiner:
    """Runs the writes of a store, several threads' at a time in one transaction."""

    def __init__(
        self, write_once: WriteOnce, timeout: float, reclaim: Callable[[], None] = lambda: None
    ) -> None:
        self._write_once = write_once
        self._timeout = timeout
        # Called before this thread queues behind another's commit: gives back a turn
        # at the store that a Ctrl-C kept this thread from giving back (the leader
        # would wait for it). A thread that commits at once takes that turn itself.
        self._reclaim = reclaim
        self._lock = threading.Lock()  # guards the line and the lead; never held long
        self._queue: deque[_Slot[Any]] = deque()  # the threads in line, in order
        self._leading = False  # someone leads; then nobody leads but they
        self._committing: list[_Slot[Any]] = []  # the batch the last leader took

    def write(
        self,
        work: Callable[[WriteTxn], T],
        now: float,
        on_commit: CommitHook | None,
        *,
        shared: bool,
        scopes: Collection[str] | None = None,
        reads: Collection[Key] = (),
    ) -> tuple[T, list[ChangeRecord]]:
        """Commit ``work`` (with others' when ``shared``); its result and the records of
        the transaction it was committed in. ``scopes``: all that ``work`` touches
        (None: anything); ``reads``: the keys it reads (``SQLStore.write``).

        Raises:
            BusyError: no transaction of this process could take it within the timeout.
            the error of ``work``, or of the transaction (each caller its own copy).
        """
        alone = False
        try:
            with self._lock:
                if not self._leading:  # nobody leads, so nobody is in line
                    self._leading = alone = True
            if alone:  # the common case, without a slot: commit at once
                return self._write_once(work, now, on_commit, scopes, reads)
        finally:
            if alone:
                self._leading = False  # first, in one store: see the module's docstring
                with self._lock:
                    if self._queue:
                        self._hand_over()
        return self._in_line(_Slot(work, now, on_commit, shared, scopes, reads))

    def _in_line(self, slot: _Slot[T]) -> tuple[T, list[ChangeRecord]]:
        """Commit ``slot``'s work once its turn comes: by a leader, with its own, or
        by this thread, leading with the work in line behind it."""
        self._reclaim()
        try:
            with self._lock:
                if self._leading:
                    slot.wake = threading.Lock()
                    slot.wake.acquire()
                    self._queue.append(slot)
                else:
                    self._leading = slot.lead = True
            if not slot.lead:
                self._wait(slot)
            if slot.lead:
                self._take(slot)
                self._commit(slot.batch)
        finally:
            # The lead is given up first, in one store (no call before it, where an
            # interrupt could land): whatever of ``_finish`` an interrupt cuts short,
            # the sleepers find out within a slice (``_wait``).
            if slot.lead:
                self._leading = slot.lead = False
                self._finish(slot)
            elif not slot.done:
                with self._lock:
                    if slot in self._queue:
                        self._queue.remove(slot)
                if slot.lead:  # handed the lead as the interrupt came: pass it on
                    self._leading = slot.lead = False  # type: ignore[unreachable]
                    self._finish(slot)
        if slot.error is not None:
            raise slot.error
        return slot.result, slot.records

    def _wait(self, slot: _Slot[Any]) -> None:
        """Sleep until ``slot`` is done or leads. After the timeout, a slot still in
        line leaves it (``BusyError``); one a leader took is done when its bounded
        commit ends, and is waited for.

        Sleeps are sliced (``_RECHECK``): a wake-up lost to an interrupt in the thread
        that was to give it costs a slice, not the timeout; and the first in line
        leads if the lead was dropped rather than handed on. A slot a leader took and
        never answered (a second interrupt cut its ``_finish`` short) raises
        ``OutcomeUnknownError`` as soon as that leader is seen gone (nobody leads, or
        another leader took another batch), at the latest one more timeout on:
        nothing waits for ever.
        """
        deadline = time.monotonic() + self._timeout
        while not slot.wake.acquire(True, _RECHECK):
            with self._lock:
                if slot.done or slot.lead:
                    return
                if slot not in self._queue and (not self._leading or slot not in self._committing):
                    raise _interrupted()  # its leader gave up the lead without answering
                if not self._leading and self._queue and self._queue[0] is slot:
                    self._leading = slot.lead = True
                    self._queue.popleft()
                    return
                now = time.monotonic()
                if now >= deadline and slot in self._queue:
                    self._queue.remove(slot)
                    raise BusyError(
                        f"this process's writer stayed busy for more than {self._timeout} s"
                    )
                if now >= deadline + self._timeout:
                    raise OutcomeUnknownError(
                        "the thread committing this write together with others did not "
                        f"answer within {2 * self._timeout} s; it may or may not have "
                        "been applied"
                    )

    def _take(self, own: _Slot[Any]) -> None:
        """Make ``own.batch``: ``own``, and the shared work in line if ``own`` is
        shared. The batch is noted, then the line changes, in two stores with nothing
        between them: an interrupt loses no one's work."""
        with self._lock:
            if not self._queue:
                own.batch = [own]
                return
            batch = [own]
            kept: deque[_Slot[Any]] = deque()
            for slot in self._queue:
                if slot is own:
                    continue
                if own.shared and slot.shared and slot.on_commit in (None, own.on_commit):
                    batch.append(slot)
                else:
                    kept.append(slot)  # work that runs alone waits for a lead of its own
            own.batch = self._committing = batch
            self._queue = kept

    def _finish(self, own: _Slot[Any]) -> None:
        """After a lead given up: wake every other thread of ``own.batch`` (failing
        what an interrupted commit left undone), and hand the lead to the first in
        line."""
        for other in own.batch:
            if not other.done:  # the commit was interrupted: its outcome is unknown
                other.error = _interrupted()
                other.done = True
            if other is not own:
                other.wake.release()
        with self._lock:
            self._hand_over()

    def _hand_over(self) -> None:
        """Hand the lead to the first in line, if any and nobody leads (with the lock
        held)."""
        if self._queue and not self._leading:
            # Led before it leaves the line (a subscript, two stores, then a call):
            # an interrupt after the call leaves it leading, and it finds out
            # within a slice if the wake-up is lost.
            following = self._queue[0]
            self._leading = following.lead = True
            self._queue.popleft()
            following.wake.release()

    def _commit(self, batch: list[_Slot[Any]]) -> None:
        if len(batch) == 1:
            self._commit_alone(batch[0])
            return

        def work(txn: WriteTxn) -> list[tuple[bool, Any]]:
            outcomes: list[tuple[bool, Any]] = []
            for slot in batch:
                mark = txn.savepoint()
                try:
                    outcomes.append((True, slot.work(txn)))
                except (StorageError, ClosedError):
                    raise  # the transaction itself failed: every piece fails
                except Exception as exc:  # it goes back to its caller
                    if not txn.rollback_to(mark):
                        raise Entangled(f"a piece failed after running statements: {exc}") from exc
                    outcomes.append((False, exc))
            return outcomes

        hook = next((slot.on_commit for slot in batch if slot.on_commit is not None), None)
        scopes: list[str] | None = []  # a list: a scope both shared and not stays each
        for slot in batch:
            if slot.scopes is None or scopes is None:
                scopes = None
            else:
                scopes += slot.scopes
        try:
            outcomes, records = self._write_once(
                work,
                max(slot.now for slot in batch),
                hook,
                scopes,
                [key for slot in batch for key in slot.reads],
            )
        except RefusedError:
            # The database refused a statement of one piece, and with it the whole
            # transaction (nothing was applied), or a piece failed past what a
            # savepoint undoes (``Entangled``): each piece commits, or fails, alone.
            for slot in batch:
                self._commit_alone(slot)
            return
        except Exception as exc:  # noqa: BLE001 - every waiting caller must hear of it
            for slot in batch:
                slot.error = exc if slot is batch[0] else copy_error(exc)
                slot.done = True
            return
        for slot, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                slot.result, slot.records = value, records
            else:
                slot.error = value
            slot.done = True

    def _commit_alone(self, slot: _Slot[Any]) -> None:
        try:
            slot.result, slot.records = self._write_once(
                slot.work, slot.now, slot.on_commit, slot.scopes, slot.reads
            )
        except Exception as exc:  # noqa: BLE001 - raised again in its own thread
            slot.error = exc
        slot.done = True


def _interrupted() -> OutcomeUnknownError:
    return OutcomeUnknownError(
        "the thread committing this write together with others was interrupted "
        "(KeyboardInterrupt); it may or may not have been applied"
    )
