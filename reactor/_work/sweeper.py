"""``Sweeper``: an engine's background thread. It expires the keys whose deadline has
passed, fires the timers that are due, turns back the queues' jobs whose lease ran
out, checkpoints the database, and compacts the change log to its retention.

No chore keeps another waiting long: expiry and timers are requests to the scope
actors (the thread only finds what is due), a round turns back one transaction's
worth of leases, and a round with more left is followed by the next at once."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final, TypeVar

from reactor._storage.records import RefusedError
from reactor._storage.txn import WriteTxn
from reactor.errors import ClosedError

from .jobs import turn_back_leases
from .timers import Fired, drop_failed, fire
from .writes import expire_keys

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

__all__ = ["Sweeper"]

logger = logging.getLogger("reactor")

SWEEP_INTERVAL: Final = 0.25  # seconds between sweeps: expiry events within a second
MIN_PAUSE: Final = 0.01  # seconds between sweeps at least, waiting for a timer
SWEEP_BATCH: Final = 5000  # keys found due per look; a scope's share goes in one write
TIMER_BATCH: Final = 5000  # timers found due per look
FIRE_BATCH: Final = 1000  # timers fired per transaction: a scope's share, one after another
COMPACT_INTERVAL: Final = 2.0  # seconds between compactions of the change log
R = TypeVar("R")
V = TypeVar("V")
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
        self._sweeping: dict[str, Future[Any]] = {}  # scope -> its expiry request
        self._firing: dict[str, Future[Fired]] = {}  # scope -> its timers' request
        self._again = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"reactor-sweeper[{engine.key}]", daemon=True
        )

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
        checkpointed = compacted = time.monotonic()
        failures = 0
        pause = SWEEP_INTERVAL
        while not self._stop.is_set():
            self._again.wait(pause)
            self._again.clear()
            if self._stop.is_set():
                return
            try:
                self.sweep()
                self.fire_timers()
                # Work queues' leases that ran out: a transaction's worth per round, so
                # that thousands of them keep no timer or expiry waiting for long.
                if turn_back_leases(self._engine)[1]:
                    self._again.set()  # more: the next round comes at once
                now = time.monotonic()
                if now - checkpointed >= SWEEP_INTERVAL:
                    checkpointed = now
                    self._engine.store.checkpoint()
                if now - compacted >= COMPACT_INTERVAL:
                    compacted = now
                    self.compact()
                pause = self.pause()
                failures = 0
            except ClosedError:
                return
            except Exception:
                failures += 1
                if failures == 1 or failures % 240 == 0:  # once, then about once a minute
                    logger.exception(
                        "the background sweeper failed (%d times in a row); it will try again",
                        failures,
                    )
                self._stop.wait(SWEEP_INTERVAL)

    def pause(self) -> float:
        """How long the next look may wait: ``SWEEP_INTERVAL``, or less if a timer comes
        due sooner (it fires then, not up to an interval later)."""
        engine = self._engine
        now = engine.now()
        due = engine.store.next_timer(now)
        if due is None:
            return SWEEP_INTERVAL
        # Not less than MIN_PAUSE: a clock that stands still (a test's) spins no faster.
        return min(SWEEP_INTERVAL, max(MIN_PAUSE, due - now))

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
            logger.debug("compacted %d change-log records of %s", removed, engine.key)
        return removed

    def sweep(self) -> None:
        """Send the actors the keys whose deadline has passed: one request per scope,
        and none for a scope whose previous request is still in flight (held up by a
        transaction, say), so that other scopes' keys still expire on time.

        Raises:
            ClosedError: the engine is closed.
        """
        engine = self._engine
        due, more = self._due(engine.store.expired, SWEEP_BATCH, self._sweeping)
        for scope, keys in _by_scope(due).items():
            future = engine.submit(scope, expire_keys(scope, keys))
            with self._lock:
                self._sweeping[scope] = future
            future.add_done_callback(functools.partial(self._swept, scope, more=more))

    def _due(
        self, find: Callable[..., list[R]], batch: int, in_flight: Collection[str]
    ) -> tuple[list[R], bool]:
        """What ``find(now, batch, skip=scopes)`` finds due, but in the scopes whose
        request is ``in_flight`` still, and whether more may be due (a full batch: look
        again once these are done). Busy scopes are left out in the query: a scope held
        by a transaction, with much due, must not keep other scopes' turn from them."""
        with self._lock:
            busy = list(in_flight)
        due = find(self._engine.now(), batch, skip=busy)
        return due, len(due) == batch

    def fire_timers(self) -> None:
        """Send the actors the timers that are due: one request per scope, none for a
        scope whose previous one is still in flight. Each request reads its timers
        again in its transaction: one that another process fired meanwhile is skipped.

        Raises:
            ClosedError: the engine is closed.
        """
        engine = self._engine
        due, more = self._due(engine.store.due_timers, TIMER_BATCH, self._firing)
        by_scope = _by_scope((scope, (timer_id, key)) for timer_id, scope, key in due)
        for scope, timers in by_scope.items():
            firing: Future[Fired] = Future()
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

    def _fire(self, scope: str, parts: list[_Part], done: Fired, firing: Future[Fired]) -> None:
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
        firing: Future[Fired],
        future: Future[Fired],
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

    def _fired(self, scope: str, firing: Future[Fired], *, more: bool) -> None:
        with self._lock:
            if self._firing.get(scope) is firing:
                del self._firing[scope]
            in_flight = len(self._firing)
        done = firing.result()
        stats = self._engine.stats
        stats.count("timers_fired", done.fired)
        if done.failed:
            stats.count("timers_failed", len(done.failed))
            for timer_id, why in done.failed:
                logger.warning(
                    "the write of timer %s of %r failed, dropped: %s", timer_id, scope, why
                )
        if done.error is not None:
            if not isinstance(done.error, ClosedError):
                logger.warning("firing timers of %r failed (they stay due): %s", scope, done.error)
        elif more and in_flight <= 1:
            self._again.set()

    def _swept(self, scope: str, future: Future[Any], *, more: bool) -> None:
        with self._lock:
            if self._sweeping.get(scope) is future:
                del self._sweeping[scope]
        if future.cancelled() or future.exception() is not None:
            if not future.cancelled():
                logger.warning("expiring keys of %r failed: %s", scope, future.exception())
            return
        if more:
            self._again.set()  # no need to wait for the next round


def _by_scope(due: Iterable[tuple[str, V]]) -> dict[str, list[V]]:
    """``(scope, what)`` pairs, grouped by scope: one request per scope."""
    by_scope: dict[str, list[V]] = {}
    for scope, what in due:
        by_scope.setdefault(scope, []).append(what)
    return by_scope
