"""Group commit across scopes: the writes of one process share database transactions.

Each scope's actor runs one batch at a time, so a scope keeps exactly one writer and its
order. Batches of different scopes, though, reach the store from several threads at
once; each used to commit on its own, one after another. Here they combine: whoever
finds no transaction running leads, and commits in one transaction its own work and
the work every other thread queued meanwhile; the others wait for their results. A
commit costs a flush of the WAL (a round trip and a WAL flush on PostgreSQL), so
threads writing together add throughput instead of queueing for the lock.

Only work that stages its changes (``WriteTxn.write``) is combined: a piece that fails
is undone alone (``WriteTxn.rollback_to``), and the others commit. Work that runs
statements of its own (compaction, lock leases, subscriber positions) runs alone.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any, Final, Generic, TypeVar

from reactor.errors import BusyError, ClosedError, OutcomeUnknownError, StorageError

from .records import ChangeRecord, RefusedError, copy_error
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
    """One thread's work, waiting to be committed by whoever leads."""

    __slots__ = (
        "done",
        "error",
        "now",
        "on_commit",
        "reads",
        "records",
        "result",
        "scopes",
        "shared",
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
        self.result: Any = None
        self.error: BaseException | None = None
        self.records: list[ChangeRecord] = []


class Combiner:
    """Runs the writes of a store, several threads' at a time in one transaction."""

    def __init__(self, write_once: WriteOnce, timeout: float) -> None:
        self._write_once = write_once
        self._timeout = timeout
        # Entered as the lock itself (a call into C), never as the condition, whose
        # __enter__ is Python: a Ctrl-C landing in it just after the lock was taken
        # would keep the lock from every other writer for good (see ``_turn``).
        self._lock = threading.RLock()
        self._ready = threading.Condition(self._lock)
        self._queue: deque[_Slot[Any]] = deque()
        self._leading = False

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
        slot: _Slot[T] = _Slot(work, now, on_commit, shared, scopes, reads)
        batch: list[_Slot[Any]] = []
        leading = False
        # A Ctrl-C may land at any bytecode here (in the main thread): whatever this
        # thread took (its place in line, the lead, others' work) is given back in the
        # ``finally``, whose every step is a single store or a call into C.
        try:
            with self._lock:
                self._queue.append(slot)
                leading = self._wait_turn(slot)  # a Python call: the flag and this agree
                if leading:
                    batch = self._take(slot)
                elif not slot.done:
                    self._queue.remove(slot)
                    raise BusyError(
                        f"this process's writer stayed busy for more than {self._timeout} s"
                    )
            if leading:
                self._commit(batch)
        finally:
            if leading:
                self._leading = False
                for other in batch:
                    if not other.done:  # the commit was interrupted: its outcome is unknown
                        other.error = _interrupted()
                        other.done = True
            elif not slot.done and slot in self._queue:
                with self._lock:
                    if slot in self._queue:
                        self._queue.remove(slot)
            with self._lock:
                self._ready.notify_all()  # the served wake, and one of the others leads
        if slot.error is not None:
            raise slot.error
        return slot.result, slot.records

    def _wait_turn(self, slot: _Slot[Any]) -> bool:
        """Wait (with the condition held) until ``slot`` is done (False), or this
        thread may lead (True, and it leads): none leads, and ``slot`` is the first in
        line (in the order they came, so that a thread writing in a loop cannot lead
        again and again ahead of the threads it woke). False with ``slot`` not done
        after the timeout, unless a leader took it: its commit is bounded, and
        ``slot`` is done when it ends.

        Waits are sliced (``_RECHECK``): a wake-up lost to an interrupt in the thread
        that was to give it costs a slice, not the timeout.
        """
        deadline = time.monotonic() + self._timeout
        while not slot.done:
            if not self._leading and self._queue and self._queue[0] is slot:
                self._leading = True
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 and slot in self._queue:
                return False
            self._ready.wait(min(max(remaining, 0.0), _RECHECK) or _RECHECK)
        return False

    def _take(self, own: _Slot[Any]) -> list[_Slot[Any]]:
        """``own``, and the shared work queued so far if ``own`` is shared. The queue
        changes in one store at the end: an interrupt before it loses no one's work."""
        if not own.shared:
            self._queue = deque(slot for slot in self._queue if slot is not own)
            return [own]
        batch = [own]
        kept: deque[_Slot[Any]] = deque()
        for slot in self._queue:
            if slot is own:
                continue
            if slot.shared and slot.on_commit in (None, own.on_commit):
                batch.append(slot)
            else:
                kept.append(slot)  # work that runs alone waits for a leader of its own
        self._queue = kept
        return batch

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
                except Exception as exc:  # noqa: BLE001 - it goes back to its caller
                    txn.rollback_to(mark)
                    outcomes.append((False, exc))
            return outcomes

        hook = next((slot.on_commit for slot in batch if slot.on_commit is not None), None)
        scopes: set[str] | None = set()
        for slot in batch:
            if slot.scopes is None or scopes is None:
                scopes = None
            else:
                scopes.update(slot.scopes)
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
            # transaction (nothing was applied): each piece commits, or fails, alone.
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
