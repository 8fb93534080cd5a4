"""``Queue`` and ``Job``: durable work queues with leases (SPEC §13, Queues); how a take
waits for a job is ``take_waits``'.

Every operation is one write transaction through the store's one write path
(``Store.write``), holding the queue's lock (``_jobs.lock_name``); what it does to the
jobs is ``_jobs``'. Its change records reach subscribers, watches and other processes
like any write's.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from reactor._base.checks import check_timeout
from reactor._base.results import Timer
from reactor._storage.records import JobRow, SharedScope
from reactor._storage.txn import WriteTxn
from reactor._work import job_admin as _admin
from reactor._work import jobs as _jobs
from reactor._work import queue_settings as _settings
from reactor._work.attempts import worker
from reactor._work.periodic import put_every
from reactor._work.take import QueueLockNeeded
from reactor._work.take import take as _take
from reactor.errors import (
    InvalidArgumentError,
    ReentrancyError,
)

from .jobs import Job, JobInfo, job_info
from .take_waits import Then, wait_take, writable_engine

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort
    from reactor._storage.statements import JobReads

    from .binding import Binding

__all__ = ["Job", "JobInfo", "Queue", "counts", "take_then"]

logger = logging.getLogger("reactor")
T = TypeVar("T")


class Queue:
    """A durable work queue; take it with ``state.queue(name, ...)``.

    Jobs are JSON items, taken highest priority first, then in the order they became
    ready, each by one taker at a time across threads and processes, under a lease: one
    not acknowledged when its lease runs out (its worker died) is ready again, and dead
    (a dead letter) once it has been taken ``max_attempts`` times. See the queues guide.

    The settings (``max_attempts``, 5 for a new queue; ``concurrency``,
    ``group_concurrency``, ``rate``, ``backoff``, none for a new queue) are saved with
    this handle's first write (a put, a take that finds a job, ...), and stay the
    queue's for every process until another handle saves others. None keeps what is
    stored; ``False`` lifts a limit.
    """

    __slots__ = ("_binding", "_busy", "_flow_controlled", "_settings", "name")

    def __init__(
        self,
        binding: Binding,
        name: str,
        max_attempts: int | None = None,
        *,
        concurrency: int | Literal[False] | None = None,
        group_concurrency: int | Literal[False] | None = None,
        rate: tuple[int, float] | Literal[False] | None = None,
        backoff: tuple[float, float] | Literal[False] | None = None,
    ) -> None:
        self._binding = binding
        self.name: str = _jobs.check_queue(name)
        """The queue's name; its events have scope ``queue:NAME``."""
        self._settings = _settings.check_settings(
            max_attempts, concurrency, group_concurrency, rate, backoff
        )
        self._busy = False  # this handle's last take found a job
        self._flow_controlled = False  # a take found the queue has flow control

    def __repr__(self) -> str:
        return f"<reactor.Queue {self.name!r}>"

    @property
    def _lock(self) -> str:
        return _jobs.lock_name(self.name)

    def _write(
        self,
        verb: str | None,
        work: Callable[[WriteTxn], T],
        *,
        shared: bool = False,
        also: tuple[str, ...] = (),
    ) -> T:
        """Run ``work`` in a write transaction holding the queue's lock (in shared mode
        if ``shared``: ``SharedScope``) and the scopes ``also``; timed for ``stats()``
        as ``verb`` (None: part of a verb timed already)."""
        engine = self._binding.engine
        start = perf_counter()
        lock = self._lock
        try:
            return engine.commit(work, scopes=(SharedScope(lock) if shared else lock, *also))
        finally:
            if verb is not None:
                engine.stats.record(verb, perf_counter() - start)

    def put(
        self,
        item: Any,
        delay: float | None = None,
        key: str | None = None,
        *,
        priority: int = 0,
        group: str | None = None,
        debounce: float | None = None,
    ) -> int:
        """Add a job; return its id (an int, never reused in this queue).

        It is ready at once, or ``delay`` seconds from now. ``key`` makes the put
        idempotent: while a job of this queue holds that key (ready, taken or dead:
        until it is acknowledged), a put with it adds nothing and returns that job's id.
        A higher ``priority`` is taken first (default 0; FIFO among equals).
        ``group``: the queue's ``group_concurrency`` limits the taken jobs of a group.
        ``debounce=S`` (with ``key``): if a job with that key waits (ready or delayed,
        not taken), its item, priority and group are replaced and it becomes ready
        ``S`` seconds from now, keeping its id; otherwise a new job is put, ready in
        ``S`` seconds.

        Raises:
            InvalidValueError: ``item`` is not storable JSON.
            InvalidKeyError: a bad ``key`` or ``group``.
            InvalidArgumentError: a bad ``delay``, ``priority`` or ``debounce``, or a
                ``debounce`` without ``key`` or with ``delay``.
            ReadOnlyError: the engine is read-only.
        """
        engine = self._binding.engine
        name, entry = _jobs.check_put(
            self._binding.options(engine), self.name, item, delay, key, priority, group, debounce
        )
        settings = self._settings
        ids = self._write("queue.put", lambda txn: _jobs.enqueue(txn, name, [entry], settings))
        if settings is not None:
            self._settings = None
        return ids[0]

    def put_every(
        self,
        item: Any,
        *,
        key: str,
        every: float | None = None,
        cron: str | None = None,
        tz: str | None = None,
    ) -> Timer:
        """Put a job of ``item`` every ``every`` seconds, or at each time the cron
        expression ``cron`` names in zone ``tz`` (UTC by default): a timer (scope
        ``queue:NAME``, key ``key``) that enqueues, exactly once per due time, once after
        missed periods; the ``Timer``. ``key`` names the schedule: declaring it again
        (every process may, at start-up) with the same item and times leaves it as it
        is; with others, replaces it. ``state.cancel_timer(timer.id)`` ends it.

        Raises:
            InvalidKeyError: a bad ``key``.
            InvalidArgumentError: neither or both of ``every`` and ``cron``, or a bad one.
            InvalidValueError: ``item`` is not storable JSON.
            ReadOnlyError: the engine is read-only.
        """
        engine = writable_engine(self._binding)
        work = put_every(self._binding.options(engine), self.name, item, key, every, cron, tz)
        timer: Timer = self._write("queue.put_every", work)
        return timer

    def take(self, timeout: float | None = None, lease: float = _jobs.DEFAULT_LEASE) -> Job | None:
        """Take the next ready job, for ``lease`` seconds: the ``Job`` (ack it when
        done), or None if none came within ``timeout`` seconds.

        ``timeout=None`` waits until a job comes; ``0`` looks once. Waiting holds this
        thread but takes no CPU: puts, and leases running out, wake it (other
        processes' too).

        Raises:
            ClosedError: the engine closed while it waited.
            InvalidArgumentError: a bad ``timeout`` or ``lease``.
            ReadOnlyError: the engine is read-only.
            ReentrancyError: a waiting take in a receiver of ``reactor.signals.changed``
                (the thread that delivers the events it waits for).
        """
        seconds = _jobs.check_lease(lease)
        wait = check_timeout(timeout)
        engine = writable_engine(self._binding)
        start = perf_counter()
        try:
            if wait == 0:
                return self._look(engine, seconds)[0]
            if engine.dispatcher.delivering():
                raise ReentrancyError(
                    "a take cannot wait on the thread that delivers changes (in a receiver "
                    "of reactor.signals.changed): use timeout=0, or take in another thread"
                )
            return wait_take(self, engine, seconds, wait)
        finally:
            engine.stats.record("queue.take", perf_counter() - start)

    def _write_shared(self, verb: str | None, work: Callable[[WriteTxn], T]) -> T:
        """``_write`` holding the queue in shared mode: a job's writes (each locks the
        job it changes), which go on beside other processes' takes and acks."""
        return self._write(verb, work, shared=True)

    def _look(
        self, engine: EnginePort, lease: float, then: Then | None = None
    ) -> tuple[Job | None, float | None]:
        """Take a job if one is ready: the job, or None and when one may be next (None:
        no job waits). ``then``: what the take's transaction does with the job it took.

        After a take that found no job, a read comes first, and the write only if a
        job may be ready: takers of an idle queue write nothing. After one that found a
        job, the write comes at once: a busy queue's take is one transaction."""
        if not self._busy:
            ready, taken = engine.store.reader().jobs().next_times(self.name)
            times = [at for at in (ready, taken) if at is not None]
            if not times or min(times) > engine.now():
                return None, min(times, default=None)
        token = uuid.uuid4().hex
        name, settings, taker = self.name, self._settings, worker()

        def work(txn: WriteTxn, shared: bool) -> tuple[Job | None, float | None]:
            before, after, later = _take(txn, name, token, lease, settings, taker, shared)
            if after is None:
                return None, later
            held = None if then is None else txn  # what then does holds the job so
            job = Job(name, self._write_shared, after, lease, before, taken_in=held)
            if then is not None:
                then.made(txn, job)
            return job, None

        # A queue without flow control is taken in shared mode: takes of several
        # processes go on together, each passing over the jobs the others hold.
        shared = settings is None and not self._flow_controlled
        also = () if then is None else then.scopes
        try:
            found = self._write(None, lambda txn: work(txn, shared), shared=shared, also=also)
        except QueueLockNeeded:  # the queue has flow control: every take counts alone
            self._flow_controlled = True
            found = self._write(None, lambda txn: work(txn, False), also=also)
        if settings is not None:
            self._settings = None
        self._busy = found[0] is not None
        return found

    def _job(self, job_id: int, token: str) -> Job:
        """The job ``job_id`` as its taker holding ``token`` sees it (the command line's
        ack, in another process than its take)."""
        return Job(self.name, self._write_shared, JobRow(job_id, "null", "taken", 0.0, 0, token))

    def stats(self) -> dict[str, Any]:
        """How many jobs are ``ready`` (to take now), ``delayed`` (ready later),
        ``taken`` (under a lease) and ``dead``; ``taken_by_group`` (group: taken jobs)
        and ``rate_window`` (the takes in the current rate window; 0 without a rate).
        A job whose lease has run out counts as ready (or dead) at once, before the
        sweeper moves it."""
        engine = self._binding.engine
        start = perf_counter()
        try:
            return _counts(engine, self.name)
        finally:
            engine.stats.record("queue.stats", perf_counter() - start)

    def settings(self) -> dict[str, Any]:
        """The queue's settings as stored, once this handle's (if it was given any)
        are saved: ``max_attempts``, ``concurrency``, ``group_concurrency``, ``rate``
        (``(limit, seconds)``) and ``backoff`` (``(base, maximum)``); None: no limit.

        Raises:
            ReadOnlyError: this handle has settings to save, and the engine is read-only.
        """
        engine = self._binding.engine
        name, given = self.name, self._settings
        if given is not None:
            writable_engine(self._binding)
            self._write("queue.settings", lambda txn: _jobs.save_settings(txn, name, given))
            self._settings = None
        row = _settings.settled(engine.store.reader().jobs().queue(name), None)
        return {
            "max_attempts": row.max_attempts,
            "concurrency": row.concurrency,
            "group_concurrency": row.group_concurrency,
            "rate": None if row.rate_limit is None else (row.rate_limit, row.rate_seconds),
            "backoff": None if row.backoff_base is None else (row.backoff_base, row.backoff_max),
        }

    def job(self, job_id: int) -> JobInfo | None:
        """Job ``job_id`` as it is now (state, item, attempts, errors, ...); None if the
        queue holds no such job (never put, or acknowledged, cancelled, purged).

        Raises:
            InvalidArgumentError: ``job_id`` is not an int.
        """
        checked = _check_id(job_id)
        engine = self._binding.engine
        reads = engine.store.reader().jobs()
        found = reads.job_info(self.name, checked)
        if found is None:
            return None
        settings = _settings.settled(reads.queue(self.name), None)
        return job_info(self.name, found, engine.now(), settings.max_attempts)

    def cancel(self, job_id: int) -> bool:
        """Remove job ``job_id``, whatever its state; whether the queue held it. A
        taken job's worker gets ``LockNotOwnedError`` when it acks.

        Raises:
            InvalidArgumentError: ``job_id`` is not an int.
            ReadOnlyError: the engine is read-only.
        """
        checked = _check_id(job_id)
        writable_engine(self._binding)
        name = self.name
        cancelled: bool = self._write("queue.cancel", lambda txn: _admin.cancel(txn, name, checked))
        return cancelled

    def purge(self, state: str | list[str] | None = None) -> int:
        """Remove every job in ``state`` (``"ready"``, ``"delayed"``, ``"taken"``,
        ``"dead"``, a list of them, or None: all), as ``stats`` counts them; how many.
        They go in batches of 1,000, a transaction each, an event each.

        Raises:
            InvalidArgumentError: an unknown state.
            ReadOnlyError: the engine is read-only.
        """
        states = _admin.check_states(state)
        engine = writable_engine(self._binding)
        start = perf_counter()
        name, removed = self.name, 0
        try:
            while True:
                count, more = engine.commit(
                    lambda txn: _admin.purge(txn, name, states), scopes=(self._lock,)
                )
                removed += count
                if not more:
                    return removed
        finally:
            engine.stats.record("queue.purge", perf_counter() - start)

    def dead(self, limit: int | None = None) -> list[Job]:
        """The dead jobs (at most ``limit``), in the order they died. They hold no
        lease: ``ack``, ``nack`` and ``extend`` raise ``LockNotOwnedError``.

        Raises:
            InvalidArgumentError: ``limit`` is not None or an int >= 0.
        """
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgumentError(f"limit must be None or an int >= 0, not {limit!r}")
        engine = self._binding.engine
        start = perf_counter()
        try:
            rows = (
                engine.store.reader()
                .jobs()
                .in_state(self.name, "dead", 2**62 if limit is None else limit)
            )
            return [Job(self.name, self._write_shared, row) for row in rows]
        finally:
            engine.stats.record("queue.dead", perf_counter() - start)

    def retry_dead(self) -> int:
        """Make every dead job ready again now, its attempts back to 0; return how
        many. They go in batches of 1,000, a transaction each.

        Raises:
            ReadOnlyError: the engine is read-only.
        """
        engine = writable_engine(self._binding)
        start = perf_counter()
        try:
            # No more than were dead at the start: one that dies again meanwhile stays dead.
            left = _counts(engine, self.name)["dead"]
            revived = 0
            while left > 0:
                batch = min(left, _admin.BATCH)
                work = functools.partial(_admin.retry_dead, queue=self.name, limit=batch)
                count = engine.commit(work, scopes=(self._lock,))
                revived += count
                left -= batch
                if count < batch:
                    break
            return revived
        finally:
            engine.stats.record("queue.retry_dead", perf_counter() - start)


def take_then(queue: Queue, lease: float, timeout: float, then: Then) -> Job | None:
    """``queue.take(timeout, lease)`` whose transaction also does ``then.made`` with the
    job it takes: one transaction where there would be two (a run's claim).

    Raises:
        ClosedError: the engine closed while it waited.
    """
    engine = writable_engine(queue._binding)  # noqa: SLF001 - its own module's friend
    return wait_take(queue, engine, lease, timeout, then)


def _check_id(job_id: object) -> int:
    if type(job_id) is not int:
        raise InvalidArgumentError(f"a job id is an int, not {job_id!r}")
    return job_id


def _counts(engine: EnginePort, name: str) -> dict[str, Any]:
    """``Queue.stats``: jobs by state, as of now."""
    return counts(engine.store.reader().jobs(), name, engine.now())[1]


def counts(jobs: JobReads, name: str, now: float) -> tuple[int, dict[str, Any]]:
    """Queue ``name``'s ``max_attempts`` (as stored, else the default) and its jobs by
    state at ``now``, as ``Queue.stats`` counts them, read with ``jobs`` (the store's
    reads: the dashboard's too)."""
    row = _settings.settled(jobs.queue(name), None)
    found: dict[str, Any] = jobs.counts(name, now, row.max_attempts)
    found["taken_by_group"] = jobs.taken_by_group(name, now)
    window = 0
    if row.rate_limit is not None and row.rate_seconds is not None:
        window = jobs.takes_since(name, now - row.rate_seconds)
    found["rate_window"] = window
    return row.max_attempts, found
