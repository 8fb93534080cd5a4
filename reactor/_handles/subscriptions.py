"""Subscriptions and watches: changes delivered to callbacks and iterators.

A plain subscription is at-most-once and in memory: the dispatcher offers it each
event; it keeps those that pass its filters in its own bounded buffer (overflow is
dropped and counted) and calls its callback on its own thread, in revision order. A
slow or failing callback therefore holds up nobody else, and a callback may read and
write state freely.

With ``since=REVISION`` it first replays the change log after that revision, up to the
revision the dispatcher had published when it connected, then goes on with the live
events, which all come after: no gap, no repeat.

A durable subscription is at-least-once: it follows the persistent change log itself,
from a position stored in the database when each callback returns, so that after a
crash delivery resumes at the first event not acknowledged. A callback that raises is
retried with backoff, then recorded as failed, and delivery moves on. Its counts of
events delivered and failed are stored with its position, and go on from there when
the name subscribes again. It writes, so a read-only engine refuses it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, Final

from reactor._base.keys import Globs, Pattern, check_key, compile_globs
from reactor._engine.events import EVENT_TYPES, ChangeEvent
from reactor._storage.records import ChangeRecord
from reactor._storage.txn import WriteTxn
from reactor.errors import (
    ClosedError,
    InvalidArgumentError,
    ReadOnlyError,
    RevisionCompactedError,
    StorageError,
)

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

__all__ = ["Filter", "Subscription", "Watch"]

logger = logging.getLogger("reactor")

_PAGE: Final = 500
MAX_REVISION: Final = 2**63 - 1  # revisions are 64-bit signed integers in the database
_WAKE: Final = 0.25  # seconds: how often a waiting feed looks whether it should stop
DEFAULT_BUFFER: Final = 10_000
_BACKOFF_START: Final = 0.05
_BACKOFF_MAX: Final = 5.0

Callback = Callable[[ChangeEvent], Any]


class Filter:
    """Which events a feed wants: scope and key globs, event types, a predicate."""

    __slots__ = ("events", "key", "scope", "where")

    def __init__(
        self,
        scope: Globs | None,
        key: Globs | None,
        events: Collection[str] | str | None,
        where: Callable[[ChangeEvent], bool] | None,
    ) -> None:
        self.scope: Pattern | None = None if scope is None else compile_globs(scope)
        self.key: Pattern | None = None if key is None else compile_globs(key)
        if isinstance(events, str):
            events = {events}
        if events is not None and not isinstance(events, Collection):
            raise InvalidArgumentError(
                f"events is a set of event types, not {type(events).__name__}"
            )
        self.events: frozenset[str] | None = None if events is None else frozenset(events)
        if self.events is not None and not self.events <= EVENT_TYPES:
            raise InvalidArgumentError(
                f"events must be among {sorted(EVENT_TYPES)}, not {sorted(self.events)}"
            )
        if where is not None and not callable(where):
            raise InvalidArgumentError("where must be a callable taking the event")
        self.where = where

    def admits(self, record: ChangeRecord) -> bool:
        """The cheap part of the filter (globs and types), safe on the dispatcher."""
        return (
            (self.events is None or record.type in self.events)
            and (self.scope is None or self.scope.matches(record.scope))
            and (self.key is None or self.key.matches(record.key))
        )


def check_since(engine: EnginePort, since: object) -> int | None:
    """``since`` as a revision, if the change log still holds what follows it.

    Raises:
        InvalidArgumentError: not an int >= 0.
        RevisionCompactedError: the log no longer holds every event after it.
    """
    if since is None:
        return None
    if type(since) is not int or not 0 <= since <= MAX_REVISION:
        raise InvalidArgumentError(
            f"since must be a revision (an int from 0 to 2**63 - 1), not {since!r}"
        )
    compacted = engine.store.compacted()
    if since < compacted:
        raise RevisionCompactedError(
            f"the change log holds the events after revision {compacted}, not after {since}"
        )
    return since


class _Feed:
    """A filtered, bounded buffer of events, optionally led by a replay of the log."""

    def __init__(
        self, engine: EnginePort, match: Filter, since: int | None, buffer_size: int
    ) -> None:
        if type(buffer_size) is not int or buffer_size <= 0:
            raise InvalidArgumentError(f"buffer_size must be an int > 0, not {buffer_size!r}")
        self._engine = engine
        self._filter = match
        self._since = since
        self._buffer: deque[ChangeEvent] = deque()
        self._capacity = buffer_size
        self._ready = threading.Condition()
        self._closed = False  # stop now
        self._draining = False  # stop once the buffer is empty
        self._wake_only = False  # a durable subscription reads the log; events only wake it
        self.dropped = 0
        self._live_from = 0
        self._on_ready: Callable[[], None] | None = None  # see ``when_ready``

    def when_ready(self, call: Callable[[], None]) -> None:
        """Have ``call()`` run (under the feed's lock: be quick) when an event is
        buffered or the feed stops: how an asyncio watch learns of it (then ``poll``)
        without a thread waiting here."""
        self._on_ready = call

    def listen(self, durable: str | None = None) -> None:
        """Join the engine's hub: from now on, the changes it admits are offered.

        Raises:
            ClosedError: the engine is closed.
            InvalidArgumentError: ``durable`` names a subscriber listening already.
        """
        scope, key = self._filter.scope, self._filter.key
        exact_scope = scope.prefix if scope is not None and scope.exact else None
        exact_key = key.prefix if key is not None and key.exact else None
        self._engine.hub.add(self, exact_scope, exact_key, durable=durable)

    # -- the hub's side (``Listener``) -----------------------------------------------
    def start(self, published: int) -> None:
        # A reader can see a commit (in a snapshot, say) a moment before the dispatcher
        # publishes it: events up to ``since`` are the caller's already, whatever the
        # dispatcher has published.
        self._live_from = max(published, self._since or 0)

    def offer(self, record: ChangeRecord, event: ChangeEvent) -> None:
        if record.revision <= self._live_from or not self._filter.admits(record):
            return  # before the feed began (the replay, if any, covers it), or unwanted
        with self._ready:
            if self._wake_only:
                self._ready.notify()
                return
            if len(self._buffer) >= self._capacity:
                self.dropped += 1
                self._engine.stats.count("events_dropped")
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    logger.warning(
                        "%r is not keeping up: %d events dropped so far", self, self.dropped
                    )
                return
            self._buffer.append(event)
            self._ready.notify()
            if self._on_ready is not None:
                self._on_ready()

    def _events(self) -> Iterator[ChangeEvent]:
        """Replayed events, then live ones, until the feed is closed."""
        yield from self.replay()
        while True:
            with self._ready:
                while not self._buffer:
                    if self._closed or self._draining:
                        return
                    self._ready.wait(_WAKE)
                if self._closed:
                    return
                event = self._buffer.popleft()
            yield event

    def poll(self) -> ChangeEvent | bool:
        """The next live event without waiting (after ``replay``); else whether the feed
        has ended (closed, or closing with nothing left): ``False`` while events may
        still come."""
        with self._ready:
            if self._buffer and not self._closed:
                return self._buffer.popleft()
            return self._closed or self._draining

    def replay(self) -> Iterator[ChangeEvent]:
        """The logged events after ``since``, up to where the live ones begin."""
        if self._since is not None:
            position = self._since
            while position < self._live_from and not self._closed:
                records = self._read_log(position, upto=self._live_from)
                for record in records:
                    if self._filter.admits(record):
                        yield ChangeEvent(record)
                position = records[-1].revision

    def _read_log(self, position: int, upto: int | None = None) -> list[ChangeRecord]:
        """The logged changes after ``position`` (a page; empty when there are none),
        read again after a failed read until it succeeds or the feed is closed.

        Raises:
            RevisionCompactedError: compaction removed the change after ``position``
                before it was read (revisions follow one another with no gap).
            ClosedError: the feed or its engine closed while a read kept failing.
        """
        pause = _BACKOFF_START
        while True:
            try:
                records = self._engine.store.log_after(position, _PAGE, upto=upto)
                break
            except ClosedError:
                raise
            except StorageError as exc:
                if self._closed or self._engine.closed:
                    raise ClosedError("the engine closed") from exc
                logger.warning("%r could not read the change log (%s); trying again", self, exc)
                with self._ready:
                    self._ready.wait(pause)
                pause = min(pause * 2, _BACKOFF_MAX)
        expected = upto is not None and position < upto
        if (records and records[0].revision != position + 1) or (not records and expected):
            raise RevisionCompactedError(
                f"the change log was compacted past revision {position} while it was "
                "being replayed: the events after it are gone"
            )
        return records

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:
        """The engine is closing (``Subscription``, ``Watch``)."""
        raise NotImplementedError

    def join(self, timeout: float) -> None:
        """Wait for delivery to end (``Subscription``, ``Watch``)."""
        raise NotImplementedError

    def _stop_feed(self, drain: bool) -> None:
        self._engine.hub.remove(self)
        with self._ready:
            if drain:
                self._draining = True
            else:
                self._closed = True
            self._ready.notify_all()
            if self._on_ready is not None:
                self._on_ready()


class Subscription(_Feed):
    """A callback receiving the changes that pass its filters; ``close()`` ends it."""

    def __init__(
        self,
        engine: EnginePort,
        callback: Callback,
        match: Filter,
        *,
        since: int | None = None,
        durable: str | None = None,
        max_retries: int = 3,
        buffer_size: int = DEFAULT_BUFFER,
    ) -> None:
        if not callable(callback):
            raise InvalidArgumentError("the callback must be callable")
        if type(max_retries) is not int or max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be an int >= 0, not {max_retries!r}")
        self.callback = callback
        self.durable = None if durable is None else check_key(durable, "durable name")
        self._max_retries = max_retries
        self._loop: asyncio.AbstractEventLoop | None = None
        if _is_async(callback):
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise InvalidArgumentError(
                    "an async callback runs on the event loop it was subscribed from: "
                    "subscribe from inside that loop"
                ) from None
        self._position = 0
        self._saved = 0
        self._delivered = 0
        self._failed = 0
        if self.durable is not None:
            if engine.options.readonly:
                raise ReadOnlyError(
                    f"durable subscriber {self.durable!r} stores its position in the "
                    "database, which is open read-only (readonly=True): a read-only "
                    "engine takes plain subscriptions and watches"
                )
            stored = engine.store.subscribers().get(self.durable)
            if stored is None:
                start = engine.dispatcher.published if since is None else since
                self._position = self._saved = start
                engine.commit(self._first_save_work(start))
            else:
                # The counts go on from where the name left them: they span its life.
                self._position, self._delivered, self._failed = stored
                self._saved = self._position
            since = None  # a durable subscription follows the log itself
        super().__init__(engine, match, since, buffer_size)
        self._wake_only = self.durable is not None
        self._last_error = ""
        self.error: Exception | None = None
        """Why delivery stopped on its own (a replay overtaken by compaction), if it did."""
        name = f"reactor-subscriber[{self.durable or getattr(callback, '__name__', 'callback')}]"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def deliver(self) -> None:
        """Begin delivering (once it listens: ``listen``)."""
        self._thread.start()

    def __repr__(self) -> str:
        kind = f"durable {self.durable!r}" if self.durable else "subscription"
        return f"<reactor.Subscription {kind} of {self.callback!r}>"

    @property
    def closed(self) -> bool:
        """Whether the subscription has stopped (closed, or its engine closed)."""
        return self._closed or self._draining

    # -- delivery ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.durable is None:
                for event in self._events():
                    self._deliver(event)
            else:
                self._follow_log()
        except ClosedError:
            pass
        except RevisionCompactedError as exc:
            # Never a silent gap: the replay cannot go on without skipping events.
            self.error = exc
            self._engine.stats.count("events_failed")
            logger.error("%r stopped: %s", self, exc)  # noqa: TRY400 - no traceback to show
            self._stop_feed(drain=False)
        except Exception as exc:
            self.error = exc
            logger.exception("%r stopped after an unexpected error", self)
            self._stop_feed(drain=False)

    def _call(self, event: ChangeEvent) -> None:
        """Run the callback to completion (on its event loop if it is async)."""
        if self._loop is None:
            self.callback(event)
            return
        future = asyncio.run_coroutine_threadsafe(self.callback(event), self._loop)
        while True:
            try:
                future.result(_WAKE)
                return
            except TimeoutError:
                if self._closed or self._engine.closed:
                    return  # closing: do not wait on the loop (it may be the closer's)

    def _deliver(self, event: ChangeEvent) -> bool | None:
        """Filter and deliver one event: True if the callback succeeded, False if it (or
        ``where``) raised, None if ``where`` passed it over.

        Raises:
            ClosedError: the engine closed under the callback; the event is not taken.
        """
        stats = self._engine.stats
        try:
            if self._filter.where is not None and not self._filter.where(event):
                return None
            self._call(event)
        except Exception as exc:
            if isinstance(exc, ClosedError) and (self._closed or self._engine.closed):
                raise  # this engine closed under the callback: the event is not taken
            # Any other error, a ClosedError of some other handle included, is the
            # callback's own: logged and counted, and the subscription goes on.
            stats.count("events_failed")
            self._last_error = f"{type(exc).__name__}: {exc}"
            logger.exception("%r raised on %r", self, event)
            return False
        stats.count("events_delivered")
        return True

    def _follow_log(self) -> None:
        assert self.durable is not None
        while True:
            try:
                records = self._read_log(self._position)
            except RevisionCompactedError as exc:
                # Compaction keeps what durable subscribers have yet to take, and a
                # new name's start is checked against it when it is saved: not expected.
                self._engine.stats.count("events_failed")
                logger.error("%r skips past a compacted part of the log: %s", self, exc)  # noqa: TRY400
                records = self._engine.store.log_after(self._position, _PAGE)
            if not records:
                self._persist()
                with self._ready:
                    if self._closed or self._draining:
                        return
                    self._ready.wait(_WAKE)  # until the dispatcher offers a change
                continue
            for record in records:
                if self._closed:
                    self._persist()
                    return
                if self._filter.admits(record):
                    self._deliver_durably(ChangeEvent(record))
                self._position = record.revision

    def _deliver_durably(self, event: ChangeEvent) -> None:
        pause = _BACKOFF_START
        for attempt in range(self._max_retries + 1):
            outcome = self._deliver(event)
            if outcome is not False:
                self._delivered += outcome is True
                self._position = event.revision
                self._persist()
                return
            if attempt < self._max_retries and not self._closed:
                with self._ready:
                    self._ready.wait(pause)  # a close() cuts the pause short
                pause = min(pause * 2, _BACKOFF_MAX)
        self._failed += 1
        self._position = event.revision
        error = (
            f"the callback raised on every one of {self._max_retries + 1} attempts; "
            f"the last time: {self._last_error}"
        )
        name, revision = self.durable, event.revision
        assert name is not None

        def work(txn: WriteTxn) -> None:
            txn.writes.record_failure(name, revision, error, txn.now)

        try:
            self._engine.commit(work)
        except ClosedError:
            raise
        except StorageError as exc:  # the failure is still logged and counted
            logger.warning("%r could not record its failure on %d: %s", self, revision, exc)
        self._persist()

    def _first_save_work(self, position: int) -> Callable[[WriteTxn], None]:
        save = self._save_work(position)

        def work(txn: WriteTxn) -> None:
            # Under the write lock, as compaction runs: once saved, the position holds
            # compaction back; before, compaction may have passed it since it was checked.
            compacted = txn.statements.compacted()
            if position < compacted:
                raise RevisionCompactedError(
                    f"the change log holds the events after revision {compacted}, "
                    f"not after {position}"
                )
            save(txn)

        return work

    def _save_work(self, position: int) -> Callable[[WriteTxn], None]:
        name, delivered, failed = self.durable, self._delivered, self._failed
        assert name is not None

        def work(txn: WriteTxn) -> None:
            txn.writes.save_position(name, position, delivered, failed, txn.now)

        return work

    def _persist(self) -> None:
        if self._position == self._saved:
            return
        try:
            self._engine.commit(self._save_work(self._position))
        except ClosedError:
            raise
        except StorageError as exc:
            # Saved with a later event: until then, a restart redelivers (at least once).
            logger.warning("%r could not save its position (%s); it will try again", self, exc)
            return
        self._saved = self._position

    # -- lifetime ------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Stop delivering (what is buffered is dropped); wait up to ``timeout`` for a
        callback in progress. Idempotent."""
        self._stop_feed(drain=False)
        self._join(timeout)

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:
        """The engine is closing: deliver what is buffered, then stop (``join`` waits)."""
        self._stop_feed(drain=self._loop is None or self._loop is not from_loop)
        if self._loop is not None and self._loop is from_loop:
            self._closed = True  # its loop is the closer's: waiting on it would deadlock

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the delivery thread to end."""
        self._join(timeout)

    def _join(self, timeout: float) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("%r did not stop within %s s", self, timeout)


def _is_async(callback: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(
        getattr(callback, "__call__", None)  # noqa: B004 - an object with async __call__
    )


class Watch(_Feed):
    """An iterator over changes: the log after ``since``, then live ones.

    Iteration blocks until the next event; it ends when the watch or its engine is
    closed. Use it in a ``with`` block, or call ``close()``.
    """

    def __init__(
        self, engine: EnginePort, match: Filter, since: int | None, buffer_size: int
    ) -> None:
        super().__init__(engine, match, since, buffer_size)
        self._iterator = self._events()

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> ChangeEvent:
        return next(self._iterator)

    def close(self) -> None:
        """Stop the watch; iteration ends. Idempotent."""
        self._stop_feed(drain=False)

    def finish(self, from_loop: asyncio.AbstractEventLoop | None) -> None:  # noqa: ARG002 - same call as Subscription.finish
        """The engine is closing: iteration ends once the buffer is empty."""
        self._stop_feed(drain=True)

    def join(self, timeout: float) -> None:
        """Nothing to wait for: the iterating thread is the caller's."""

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close()
