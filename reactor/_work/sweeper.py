"""``Sweeper``: an engine's background thread. It expires the keys whose deadline has
passed, fires the timers that are due, turns back the queues' jobs whose lease ran
out, checkpoints the database, and compacts the change log to its retention, every
``sweep_interval`` seconds (an option of ``open``). ``upkeep()`` runs the same chores
once, in the caller's thread, and says what they did (``reactor.testing.run_upkeep``).

No chore keeps another waiting long: expiry and timers are requests to the scope
actors (the thread only finds what is due), a round turns back one transaction's
worth of leases, and a round with more left is followed by the next at once."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Final, TypeVar

from reactor._base.results import Upkeep
from reactor._engine.reply import ThreadReply
from reactor._engine.stats import UpkeepProgress
from reactor._storage.locate import leave_if_moved
from reactor._storage.records import RefusedError
from reactor._storage.txn import WriteTxn
from reactor.errors import ClosedError, OperationTimeout, ReentrancyError

from .leases import expire_leases, turn_back_leases
from .progress import Progress
from .timers import Fired, drop_failed, fire
from .writes import expire_keys

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

__all__ = ["RETRY_PAUSE", "Sweeper"]

logger = logging.getLogger("reactor")
# What the upkeep did, one line per chore that did something: a deployment's log
# (``reactor serve`` shows it), silenced apart from reactor's other messages.
upkeep_logger = logging.getLogger("reactor.upkeep")

T = TypeVar("T")
R = TypeVar("R")
V = TypeVar("V")

RETRY_PAUSE: Final = 0.25  # seconds before a round that failed is tried again
CHECKPOINT_INTERVAL: Final = 0.25  # seconds between checkpoints of the database at least
MIN_PAUSE: Final = 0.01  # seconds between sweeps at least, waiting for a timer
SWEEP_BATCH: Final = 5000  # keys found due per look; a scope's share goes in one write
TIMER_BATCH: Final = 5000  # timers found due per look
FIRE_BATCH: Final = 1000  # timers fired per transaction: a scope's share, one after another
COMPACT_INTERVAL: Final = 2.0  # seconds between compactions of the change log
# Timers to fire (id, key) of one scope, and None; or the one timer to drop without its
# write, which the database refused, and why.
_Part = tuple[list[tuple[str, str]], str | None]


class Sweeper:
    """The expiry and upkeep of one engine, on a thread of its own.

    Expiry goes through the scope actors like any write, so that it is ordered with
    them and publishes ``expired`` events. The engine starts it (not when read-only:
    everything it does writes) and closes it.
    """

    def __init__(self, engine: EnginePort) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._round = threading.Lock()  # held by a round of chores: the thread's, or upkeep's
        self._sweeping: dict[str, ThreadReply[Any]] = {}  # scope -> its expiry request
        self._firing: dict[str, ThreadReply[Fired]] = {}  # scope -> its timers' request
        self._again = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"reactor-sweeper[{engine.key}]", daemon=True
        )
        self._progress = Progress()  # the rounds done (the thread's and upkeep's)
        self._checkpointed = self._compacted = time.monotonic()

    def progress(self) -> UpkeepProgress:
        """How the upkeep is getting on: ``stats()["upkeep"]``, a health check's."""
        return self._progress.snapshot(self._thread.is_alive())

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Stop the thread; wait for it (up to ``timeout``) unless called from it."""
        self._stop.set()
        self._again.set()
        # Never started on a read-only engine: nothing to wait for.
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        pause = self._engine.options.sweep_interval
        while not self._stop.is_set():
            self._again.wait(pause)
            self._again.clear()
            if self._stop.is_set():
                return
            error: Exception | None = None
            try:
                with self._round:
                    pause = self._chores()
            except ClosedError:
                return
            except Exception as exc:  # noqa: BLE001 - counted, logged, tried again
                error = exc
            if not self._ended(error):
                return
            if error is not None:
                self._stop.wait(RETRY_PAUSE)

    def _chores(self) -> float:
        """One round of chores, but those a stop (``close``) comes before; how long the
        next round may wait."""
        chores = (self.sweep, self.fire_timers, self._turn_back, self._checkpoint, self._compact)
        for chore in chores:
            if self._stop.is_set():  # what is left waits for the next process's round
                break
            self._progress.chore()
            chore()
        return self.pause()

    def _ended(self, error: Exception | None) -> bool:
        """Count the round that ended (failed with ``error`` unless None); whether the
        thread goes on: not once the database file was removed or replaced, which no
        retry mends (the engine must be opened again)."""
        engine = self._engine
        if error is not None and leave_if_moved(engine.store):
            self._progress.ended(str(error))
            logger.error(
                "the database file %s was removed or replaced while open: the upkeep stops "
                "(open it again)",
                engine.store.location,
            )
            return False
        if self._progress.ended(None if error is None else f"{type(error).__name__}: {error}"):
            logger.error(
                "the background upkeep failed (%d rounds in a row); it will try again: %s",
                self._progress.failing,
                self._progress.last_error,
                exc_info=error,
            )
        return True

    def _turn_back(self) -> None:
        """Work queues' leases that ran out: a transaction's worth per round, so that
        thousands of them keep no timer or expiry waiting for long."""
        turned, more = turn_back_leases(self._engine)
        if turned:
            upkeep_logger.info("jobs whose lease ran out, turned back: %d", turned)
        if more:
            self._again.set()  # more: the next round comes at once

    def _checkpoint(self) -> None:
        now = time.monotonic()
        if now - self._checkpointed >= CHECKPOINT_INTERVAL:
            self._checkpointed = now
            self._engine.store.checkpoint()

    def _compact(self) -> None:
        now = time.monotonic()
        if now - self._compacted >= COMPACT_INTERVAL:
            self._compacted = now
            self.compact()

    def pause(self) -> float:
        """How long the next look may wait: the sweep interval, or less if a timer comes
        due sooner (it fires then, not up to an interval later)."""
        engine = self._engine
        interval = engine.options.sweep_interval
        now = engine.now()
        due = engine.store.next_timer(now)
        if due is None:
            return interval
        # Not less than MIN_PAUSE: a clock that stands still (a test's) spins no faster.
        return min(interval, max(MIN_PAUSE, due - now))

    def upkeep(self, held: Collection[str] = ()) -> Upkeep:
        """Run every chore once, now, and wait for it: expire the keys whose deadline
        has passed, fire the timers that are due, turn back every lease that ran out,
        compact the change log; what that did. The background thread runs no round
        meanwhile, and what its last round sent the actors is waited for first, so that
        everything due at the clock's time is done on return (the counts are this
        call's only). Not the checkpoint, which changes nothing anyone can read.
        ``held``: the scopes the caller's own transaction holds, whose actors would
        never answer it.

        Raises:
            ReentrancyError: a key or timer of a scope in ``held`` is due, or the
                thread's last round sent it work not yet done (nothing of that round
                was sent).
            ClosedError: the engine is closed.
            OperationTimeout: a scope's actor did not answer within the engine's timeout
                (held by a transaction, say).
            StorageError: a chore's write failed.
        """
        with self._round:
            with self._lock:
                in_flight = [*self._sweeping.items(), *self._firing.items()]
            _check_not_held(
                [scope for scope, future in in_flight if not future.done()], held, "work"
            )
            for scope, future in in_flight:
                with contextlib.suppress(Exception):  # the thread's own: it logs them
                    self._answer(scope, future)
            expired = self._expire_all(held)
            fired = self._fire_all(held)
            turned = expire_leases(self._engine)
            compacted = self.compact()
            self._progress.ended()
        return Upkeep(
            keys_expired=expired,
            timers_fired=fired.fired,
            timers_failed=len(fired.failed),
            leases_turned_back=turned,
            log_compacted=compacted,
        )

    def _expire_all(self, held: Collection[str]) -> int:
        """Expire every key whose deadline has passed, and wait; how many."""
        expired = 0
        more = True
        while more:
            requests, more = self._expire(skip=[], held=held)
            count = sum(self._answer(scope, future) for scope, future in requests)
            expired += count
            more = more and count > 0
        return expired

    def _fire_all(self, held: Collection[str]) -> Fired:
        """Fire every timer that is due, and wait; what that did.

        Raises:
            Exception: what stopped the firing of a scope's timers (the rest stay due).
        """
        fired = Fired()
        more = True
        while more:
            firings, more = self._fire_due(skip=[], held=held)
            before = fired.fired + len(fired.failed)
            for scope, firing in firings:
                done = self._answer(scope, firing)
                if done.error is not None:
                    raise done.error
                fired.add(done)
            more = more and fired.fired + len(fired.failed) > before
        return fired

    def _answer(self, scope: str, future: ThreadReply[T]) -> T:
        """The result of a chore's request to ``scope``'s actor, within the engine's
        timeout; the request is not withdrawn (the firing of timers goes on in parts).

        Raises:
            OperationTimeout: no answer in time.
        """
        engine = self._engine
        engine.reclaim()  # as Engine.wait: the actor may need this thread's turn
        timeout = engine.options.timeout
        try:
            return future.result(timeout)
        except TimeoutError:
            raise OperationTimeout(
                f"scope {scope!r} did not answer the upkeep within {timeout} s"
            ) from None

    def compact(self) -> int:
        """Drop the change-log records beyond the retention policy; return how many."""
        engine = self._engine
        keep, seconds = engine.options.log_retention, engine.options.log_retention_seconds

        def work(txn: WriteTxn) -> int:
            # Never the newest record: the next revision follows it (see _schema.changes).
            upto = None if keep is None else txn.statements.current_revision() - keep
            before = None if seconds is None else txn.now - seconds
            if upto is not None and upto <= 0:
                upto = None
            return txn.writes.compact(upto, before) if upto or before else 0

        removed = engine.commit(work)
        if removed:
            upkeep_logger.info("change-log records compacted: %d", removed)
        return removed

    def sweep(self) -> None:
        """Send the actors the keys whose deadline has passed: one request per scope,
        and none for a scope whose previous request is still in flight (held up by a
        transaction, say), so that other scopes' keys still expire on time.

        Raises:
            ClosedError: the engine is closed.
        """
        self._expire(skip=self._in_flight(self._sweeping))

    def fire_timers(self) -> None:
        """Send the actors the timers that are due: one request per scope, none for a
        scope whose previous one is still in flight. Each request reads its timers
        again in its transaction: one that another process fired meanwhile is skipped.

        Raises:
            ClosedError: the engine is closed.
        """
        # Those of busy scopes left out in the query: a scope held by a transaction,
        # with many timers due, must not keep other scopes' timers from their turn.
        self._fire_due(skip=self._in_flight(self._firing))

    def _in_flight(self, requests: dict[str, ThreadReply[Any]]) -> list[str]:
        """The scopes of ``requests`` (those still in flight), read under the lock."""
        with self._lock:
            return list(requests)

    def _expire(
        self, skip: list[str], held: Collection[str] = ()
    ) -> tuple[list[tuple[str, ThreadReply[int]]], bool]:
        """Send the actors the keys whose deadline has passed, but those of the scopes
        in ``skip``: the requests (scope, future of how many it expired), and whether
        more may be due (look again once these are done).

        Raises:
            ReentrancyError: a key of a scope in ``held`` is due (nothing was sent).
        """
        engine = self._engine
        by_scope, more = self._due(engine.store.expired, SWEEP_BATCH, skip, held, "a key", _key)
        self._progress.still_due("expire", [*by_scope, *skip])
        requests: list[tuple[str, ThreadReply[int]]] = []
        for scope, keys in by_scope.items():
            future = engine.submit(scope, expire_keys(scope, keys))
            with self._lock:
                self._sweeping[scope] = future
            future.add_done_callback(functools.partial(self._swept, scope, more=more))
            requests.append((scope, future))
        return requests, more

    def _due(
        self,
        find: Callable[..., list[R]],
        batch: int,
        skip: list[str],
        held: Collection[str],
        what: str,
        pair: Callable[[R], tuple[str, V]],
    ) -> tuple[dict[str, list[V]], bool]:
        """What ``find(now, batch, skip=skip)`` finds due, by scope (``pair``: a row's
        scope, and what of it is due), and whether more may be (a full batch: look again
        once these are done).

        Raises:
            ReentrancyError: ``what`` of a scope in ``held`` is due.
        """
        due = find(self._engine.now(), batch, skip=skip)
        by_scope: dict[str, list[V]] = {}
        for row in due:
            scope, item = pair(row)
            by_scope.setdefault(scope, []).append(item)
        _check_not_held(by_scope, held, what)
        return by_scope, len(due) == batch

    def _fire_due(
        self, skip: list[str], held: Collection[str] = ()
    ) -> tuple[list[tuple[str, ThreadReply[Fired]]], bool]:
        """Fire the timers that are due, but those of the scopes in ``skip``: the
        requests (scope, future of what they did, all told), and whether more may be
        due.

        Raises:
            ClosedError: the engine is closed.
            ReentrancyError: a timer of a scope in ``held`` is due (nothing was sent).
        """
        find = self._engine.store.due_timers
        by_scope, more = self._due(find, TIMER_BATCH, skip, held, "a timer", _timer)
        self._progress.still_due("fire", [*by_scope, *skip])
        requests: list[tuple[str, ThreadReply[Fired]]] = []
        for scope, timers in by_scope.items():
            firing: ThreadReply[Fired] = ThreadReply()
            requests.append((scope, firing))
            with self._lock:
                self._firing[scope] = firing
            firing.add_done_callback(functools.partial(self._fired, scope, more=more))
            # The earliest first (the last part goes first): a transaction each, one
            # after another, with the scope's other writes in between.
            parts: list[_Part] = [
                (timers[start : start + FIRE_BATCH], None)
                for start in reversed(range(0, len(timers), FIRE_BATCH))
            ]
            self._fire(scope, parts, Fired(), firing)
        return requests, more

    def _fire(
        self, scope: str, parts: list[_Part], done: Fired, firing: ThreadReply[Fired]
    ) -> None:
        """Fire the last of ``parts``, then the others, one request at a time, each in
        a transaction of its own (so that a write the database refuses fails no other
        write); ``firing`` gets what they did, all told.

        Raises:
            ClosedError: the engine is closed (``firing`` is done: the rest stay due).
        """
        engine = self._engine
        timers, why = part = parts.pop()
        if why is None:
            work = fire(engine.options, scope, timers)
        else:
            work = drop_failed(scope, timers[0][0], why)
        try:
            future = engine.submit(scope, work, alone=True)
        except ClosedError as exc:
            done.error = exc
            firing.set_result(done)
            raise
        future.add_done_callback(
            functools.partial(self._fired_part, scope, part, parts, done, firing)
        )

    def _fired_part(
        self,
        scope: str,
        part: _Part,
        parts: list[_Part],
        done: Fired,
        firing: ThreadReply[Fired],
        future: ThreadReply[Fired],
    ) -> None:
        timers, why = part
        try:
            done.add(future.result())
        except RefusedError as exc:
            if why is not None:  # even without its write: it stays due
                done.error = exc
            elif len(timers) > 1:
                # The database refused the write of one of them (or more): fire them
                # apart, halves first, down to each one it refuses.
                half = len(timers) // 2
                parts += [(timers[half:], None), (timers[:half], None)]
            else:
                parts.append((timers, str(exc)))
        except Exception as exc:  # noqa: BLE001 - the rest stay due, found again
            done.error = exc
        if done.error is not None or not parts:
            firing.set_result(done)
            return
        with contextlib.suppress(ClosedError):
            self._fire(scope, parts, done, firing)

    def _fired(self, scope: str, firing: ThreadReply[Fired], *, more: bool) -> None:
        with self._lock:
            if self._firing.get(scope) is firing:
                del self._firing[scope]
            in_flight = len(self._firing)
        done = firing.result()
        stats = self._engine.stats
        stats.count("timers_fired", done.fired)
        if done.fired:
            upkeep_logger.info("timers of %r fired: %d", scope, done.fired)
        if done.failed:
            stats.count("timers_failed", len(done.failed))
            for timer_id, why in done.failed:
                logger.warning(
                    "the write of timer %s of %r failed, dropped: %s", timer_id, scope, why
                )
        if not isinstance(done.error, ClosedError):
            error = (
                None if done.error is None else f"firing timers of {scope!r} failed: {done.error}"
            )
            self._progress.request_ended(f"fire {scope}", error)
        if done.error is None and more and in_flight <= 1:
            self._again.set()

    def _swept(self, scope: str, future: ThreadReply[Any], *, more: bool) -> None:
        with self._lock:
            if self._sweeping.get(scope) is future:
                del self._sweeping[scope]
        if future.cancelled() or future.exception() is not None:
            error = None if future.cancelled() else future.exception()
            if error is not None and not isinstance(error, ClosedError):
                failed = f"expiring keys of {scope!r} failed: {error}"
                self._progress.request_ended(f"expire {scope}", failed)
            return
        self._progress.request_ended(f"expire {scope}", None)
        if future.result():
            upkeep_logger.info("keys of %r expired: %d", scope, future.result())
        if more:
            self._again.set()  # no need to wait for the next round


def _check_not_held(scopes: Collection[str], held: Collection[str], what: str) -> None:
    """Raises:
    ReentrancyError: a scope of ``scopes`` is in ``held``.
    """
    clash = sorted(set(scopes).intersection(held))
    if clash:
        raise ReentrancyError(
            f"{what} of scope {clash[0]!r} is due, and this thread's (or task's) own "
            "transaction holds that scope: the upkeep would wait for it forever; run it "
            "before the transaction's body, or after"
        )


def _key(row: tuple[str, str]) -> tuple[str, str]:
    """An expired key's row: (scope, key)."""
    return row


def _timer(row: tuple[str, str, str]) -> tuple[str, tuple[str, str]]:
    """A due timer's row (id, scope, key): its scope, and (id, key)."""
    timer_id, scope, key = row
    return scope, (timer_id, key)
