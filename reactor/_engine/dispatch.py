"""The dispatcher: hands every committed change, in revision order, to the engine's
subscriptions and to ``reactor.signals.changed``.

Changes reach it two ways. This process's commits are handed over right after each
commit, while the store's write gate is still held, so they arrive in revision order.
Other processes' commits are found in the change log by a follower thread, woken by
the store when another connection may have committed (SQLite: ``PRAGMA data_version``
changed; PostgreSQL: a notification).
Both go through ``_publish`` under one lock that remembers the last revision handed on,
so nothing is published twice and nothing is skipped: when this process commits
revision N while N-1 came from elsewhere and was not seen yet, N-1 is read from the log
first.

The dispatcher thread sends the signals. Each receiver is called on its own, so one
that raises does not keep the others from the event (``Signal.send`` would stop).
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from reactor import signals
from reactor._storage.records import ChangeRecord
from reactor._storage.store import Store
from reactor.errors import ClosedError

from .events import ChangeEvent
from .stats import Stats

__all__ = ["Dispatcher"]

logger = logging.getLogger("reactor")

FOLLOW_INTERVAL: Final = 0.01  # seconds between looks at other processes' commits
# While nothing listens, the follower only keeps count of the revisions, and looks this
# seldom (woken at once when a listener joins): not woken by every commit (PostgreSQL
# notifies every process of each), it leaves the processes' CPU to their own writes.
IDLE_INTERVAL: Final = 0.1
# Under a stream of other processes' commits the follower reads the log at most this
# often, each read taking every commit made meanwhile: woken at each commit (PostgreSQL
# notifies every process of each), every process read the log once per commit of the
# others, a third of a worker's CPU with four worker processes. A commit after a quiet
# spell is read at once; in a stream, its event comes up to twice this later (a commit
# announced while the follower waits out a gap is read at the next one).
FOLLOW_GAP: Final = 0.005
COMPACTED_RECHECK: Final = 1.0  # seconds a read of the log's compaction is kept
FOLLOW_RETRY: Final = 0.05  # seconds before reading the log again after a failure
_PAGE: Final = 1000

Receiver = Callable[..., Any]
Listener = Callable[[ChangeRecord, ChangeEvent], None]


class Dispatcher:
    """Publishes the committed changes of one engine's database."""

    def __init__(self, name: str, store: Store, stats: Stats, *, follow: bool) -> None:
        # The engine's own listeners (``Hub``), while any listen: a function of each
        # change, called before the receivers of ``reactor.signals.changed``.
        self._listener: Listener | None = None
        self._listened: Callable[[], frozenset[str] | None] = lambda: None
        # Told when every change queued so far was handed on (``_settled``).
        self.on_settled: Callable[[], None] | None = None
        # Told when changes were compacted away before they could be handed on.
        self.on_gap: Callable[[], None] | None = None
        self._compacted_at = (0, -COMPACTED_RECHECK)  # compacted up to, read when
        # Whether the listener hears changes of (scope, key): the hub's index.
        self._hears: Callable[[str, str], bool] = lambda _scope, _key: True
        self._name = name
        self._store = store
        self._stats = stats
        self._lock = threading.Lock()
        self._published = store.revision()  # what came before this engine is history
        self._queue: queue.SimpleQueue[list[ChangeRecord] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._behind = threading.Event()  # the log holds changes not yet read: read it
        self._read_all = False  # the next read goes to the log's end (not an announcement)
        self._wake = threading.Event()  # a listener joined, or closing: stop idling
        self._thread = threading.Thread(
            target=self._run, name=f"reactor-dispatch[{name}]", daemon=True
        )
        self._thread.start()
        self._follower: threading.Thread | None = None
        if follow:
            self._follower = threading.Thread(
                target=self._follow, name=f"reactor-follow[{name}]", daemon=True
            )
            self._follower.start()

    @property
    def published(self) -> int:
        """The last revision handed on."""
        return self._published

    def connect(
        self,
        listener: Listener,
        start: Callable[[int], None],
        listened: Callable[[], frozenset[str] | None] = lambda: None,
        hears: Callable[[str, str], bool] = lambda _scope, _key: True,
    ) -> None:
        """Hand every change to ``listener`` (the engine's hub: one at a time; the same
        again changes nothing). ``start`` is told first the last revision handed on
        before the connection: the listener is offered the events after it, and may
        also be offered some before it, still queued, to ignore. ``listened``: the
        only scopes whose changes by other processes ``listener`` hears (None: all);
        ``hears(scope, key)``: whether it hears a change of that key (this process's
        commits that none of it hears are not queued).

        Called again when a listener of a scope not listened to before joins: under
        this lock, so that no read of the log is under way that passes over that
        scope's changes after ``start`` is told where they begin."""
        with self._lock:
            if not self._wanted():
                self._skip_unheard()
            start(self._published)
            self._listener = listener
            self._listened = listened
            self._hears = hears
        self._wake.set()

    def _skip_unheard(self) -> None:
        """Count as handed on every revision committed before now, which nobody
        listened to (the idle follower may lag behind them): a listener joining now is
        offered only what commits after it joined (called with the lock held)."""
        try:
            self._published = max(self._published, self._store.revision())
        except Exception:  # the follower catches up: the listener may see some older
            logger.warning("reading the last revision failed", exc_info=True)

    def disconnect(self) -> None:
        self._listener = None

    def _scopes(self) -> frozenset[str] | None:
        """The scopes whose changes by other processes are read (None: every one):
        those the listener hears, unless a receiver of ``signals.changed`` hears all."""
        if signals.changed.receivers or self._listener is None:
            return None
        return self._listened()

    def delivering(self) -> bool:
        """Whether this is the thread that delivers the changes (where a wait for a
        change would wait for itself)."""
        return threading.current_thread() is self._thread

    def _wanted(self) -> bool:
        return self._listener is not None or bool(signals.changed.receivers)

    # -- intake --------------------------------------------------------------------
    def committed(self, records: list[ChangeRecord]) -> None:
        """This process committed ``records`` (called under the store's write gate).

        When other processes committed before them and the follower has not published
        those yet, they are read from the log first. If that read fails, nothing is
        published here: the follower catches up from the log, these records included.
        """
        with self._lock:
            if records[-1].revision <= self._published:
                return  # the follower got there first
            # _wanted() inline: every commit comes here.
            if self._listener is None and not signals.changed.receivers:
                self._published = records[-1].revision
                return
            # Nobody hears any of them, and nothing before them waits to be read: they
            # are handed on as they pass (no thread wakes for them).
            hears = self._hears
            if (
                records[0].revision == self._published + 1
                and not signals.changed.receivers
                and not any(hears(record.scope, record.key) for record in records)
            ):
                self._published = records[-1].revision
                return
            if records[0].revision > self._published + 1:
                try:
                    self._read_log(upto=records[0].revision - 1)
                except Exception:
                    self._read_all = True
                    self._behind.set()  # the follower reads it all, these records too
                    logger.warning(
                        "reading other processes' changes failed; the follower retries",
                        exc_info=True,
                    )
                    return
            fresh = [record for record in records if record.revision > self._published]
            self._published = records[-1].revision
            self._queue.put(fresh)

    def catch_up(self, announced: int = sys.maxsize) -> None:
        """Publish what other processes committed since the last revision handed on
        (``announced``: up to where, if known).

        Raises:
            StorageError: reading the log failed; what was read is published, the rest
                is left for the next try.
        """
        with self._lock:
            if not self._wanted():  # nobody listens: only keep count of the revisions
                if announced == sys.maxsize:
                    announced = self._store.revision()
                self._published = max(self._published, announced)
                return
            # Up to the revision announced, when known: every one before it committed
            # first (a read of some scopes needs no look at the last revision then);
            # all there is after a read at this process's commit failed (its own
            # commit is announced to no one).
            whole = self._read_all or announced == sys.maxsize
            self._read_log(upto=None if whole else announced)
            if whole:
                self._read_all = False

    def _read_log(self, upto: int | None) -> None:
        """Queue every logged change after the last one handed on (up to ``upto``),
        page by page (called with the lock held); only those of the scopes listened
        to, when the listeners hear some scopes only (``_scopes``): a worker that waits
        for a queue's jobs does not read the whole database's changes."""
        scopes = self._scopes()
        if scopes is not None:
            self._read_scopes(scopes, self._store.revision() if upto is None else upto)
            return
        while upto is None or self._published < upto:
            records = self._whole(
                self._store.log_after(self._published, _PAGE, upto=upto),
                lambda after: self._store.log_after(after, _PAGE, upto=upto),
            )
            if not records:
                return
            if records[0].revision != self._published + 1:
                self._gap(records[0].revision)
            self._published = records[-1].revision
            self._queue.put(records)

    def _read_scopes(self, scopes: frozenset[str], upto: int) -> None:
        """``_read_log`` of ``scopes`` only, up to ``upto``: the revisions between are
        handed on as they pass (nobody here hears of them)."""
        while self._published < upto:
            page = self._store.log_after(self._published, _PAGE, upto=upto, scopes=scopes)
            first = page[0].revision if page else upto + 1
            if first > self._published + 1:
                compacted = self._compacted()
                if compacted > self._published:
                    # Changes of these scopes may have been compacted away unread.
                    self._gap(min(first, compacted + 1))
            if not page:
                self._published = upto
                return
            records = self._whole(
                page,
                lambda after: self._store.log_after(after, _PAGE, upto=upto, scopes=scopes),
            )
            self._published = upto if len(page) < _PAGE else records[-1].revision
            self._queue.put(records)

    def _compacted(self) -> int:
        """Up to where the log was compacted, read at most once a second (compaction
        is a chore of seconds; a gap is told a second late at worst)."""
        now = time.monotonic()
        if now - self._compacted_at[1] >= COMPACTED_RECHECK:
            self._compacted_at = (self._store.compacted(), now)
        return self._compacted_at[0]

    @staticmethod
    def _whole(
        page: list[ChangeRecord], more: Callable[[int], list[ChangeRecord]]
    ) -> list[ChangeRecord]:
        """``page`` cut so that it holds whole commits (a commit's changes share its
        time): a full page ends before its last time's changes (read again with the
        next page); a full page of one time goes on with the next pages (``more``:
        the page after a revision) to that time's end. So what is handed on at once
        holds whole commits, however big (an aggregate applies them whole)."""
        if len(page) < _PAGE:
            return page
        last = page[-1].timestamp
        cut = len(page)
        while cut > 0 and page[cut - 1].timestamp == last:
            cut -= 1
        if cut > 0:
            return page[:cut]
        records = list(page)
        while True:
            following = more(records[-1].revision)
            same = list(itertools.takewhile(lambda record: record.timestamp == last, following))
            records.extend(same)
            if len(same) < len(following) or len(following) < _PAGE:
                return records

    def _gap(self, found: int) -> None:
        # Revisions follow one another with no gap: missing ones were compacted away
        # before this process could read them (it was behind by more than the log keeps).
        missing = found - self._published - 1
        self._stats.count("events_dropped", missing)
        logger.error(
            "%d changes after revision %d were compacted away before this process "
            "could publish them",
            missing,
            self._published,
        )
        hook = self.on_gap
        if hook is not None:
            try:
                hook()
            except Exception:  # a listener's bug must not stop the others' changes
                logger.exception("reactor's own listeners failed after a gap in the changes")

    def _follow(self) -> None:
        failures = 0
        latest = sys.maxsize  # how far others have committed, as last announced
        last_read = -FOLLOW_GAP  # when the log was last read (time.monotonic())
        while not self._stop.is_set():
            try:
                idle = not self._wanted()
                if idle:
                    self._wake.wait(IDLE_INTERVAL)
                    self._wake.clear()
                announced = self._store.await_commits(0.0 if idle else FOLLOW_INTERVAL)
                if announced is not None and announced > self._published:
                    latest = announced
                    self._behind.set()
                if self._behind.is_set():
                    rest = last_read + FOLLOW_GAP - time.monotonic()
                    if rest > 0 and self._stop.wait(rest):
                        return
                    # Cleared before reading: a commit announced meanwhile is read too.
                    self._behind.clear()
                    self.catch_up(latest)
                    last_read = time.monotonic()
                    latest = sys.maxsize
                    if failures:
                        logger.warning("following other processes' changes works again")
                        failures = 0
            except ClosedError:
                return
            except Exception:
                self._behind.set()  # tried again until it succeeds, with no new commit
                failures += 1
                if failures == 1 or failures % 200 == 0:  # once, then every 10 s or so
                    logger.exception(
                        "following other processes' changes failed (%d times); trying again",
                        failures,
                    )
                self._stop.wait(FOLLOW_RETRY)

    # -- delivery ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            for record in batch:
                self._send(record)
            self._settled()

    def _settled(self) -> None:
        """A batch was handed on: the commits it held are whole (a commit's changes
        come in one batch, this process's as it commits them, others' in pages of the
        log: see ``_whole``)."""
        hook = self.on_settled
        if hook is not None:
            try:
                hook()
            except Exception:  # a listener's bug must not stop the others' changes
                logger.exception("reactor's own listeners failed after a batch of changes")

    def _send(self, record: ChangeRecord) -> None:
        event = ChangeEvent(record)
        self._stats.count("events_published")
        listener = self._listener
        if listener is not None:
            try:
                listener(record, event)
            except Exception:  # a listener's bug must not stop the others' changes
                self._stats.count("events_failed")
                logger.exception("reactor's own listeners failed on %r", event)
        for receiver in signals.changed.receivers_for(record.scope):
            self._call(receiver, record.scope, event)

    def _call(self, receiver: Receiver, sender: str, event: ChangeEvent) -> None:
        try:
            receiver(sender, event=event)
        except Exception:
            self._stats.count("events_failed")
            logger.exception("a receiver of reactor.signals.changed raised on %r", event)

    def close(self, timeout: float) -> None:
        """Stop following, hand on what is queued, and stop (bounded by ``timeout``)."""
        self._stop.set()
        self._wake.set()
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join(timeout)
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning(
                    "the dispatcher of %s did not finish within %s s", self._name, timeout
                )
