"""``AsyncQueue`` and ``AsyncJob``: a durable work queue's verbs as coroutines.

A take that waits holds no thread: puts and leases running out wake the task through
the loop's bridge (``take_waits.take_async``). The other verbs are short blocking calls,
run in the handle's worker threads.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any, Unpack

from reactor._base.checks import check_timeout
from reactor._handles import queues as _queues
from reactor._handles import take_waits as _take_waits
from reactor._handles.binding import binding_of
from reactor._work import jobs as _jobs
from reactor._work import queue_settings as _settings

if TYPE_CHECKING:
    from reactor._base.results import Timer
    from reactor._handles.jobs import JobInfo
    from reactor._work.jobs import PutOptions

    from .link import Link

__all__ = ["AsyncJob", "AsyncQueue"]


class AsyncQueue:
    """A durable work queue's verbs as coroutines (see ``reactor.Queue``). A take that
    waits holds no thread: puts and leases running out wake the task through the loop."""

    __slots__ = ("_link", "_max_attempts", "_options", "_queue", "name")

    def __init__(
        self,
        link: Link,
        name: str,
        max_attempts: int | None,
        options: _settings.QueueOptions | None = None,
    ) -> None:
        self._link = link
        self.name: str = _jobs.check_queue(name)
        """The queue's name; its events have scope ``queue:NAME``."""
        self._options: _settings.QueueOptions = options or {}
        _settings.check_settings(max_attempts, **self._options)  # bad ones raise here
        self._max_attempts = max_attempts
        self._queue: _queues.Queue | None = None

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncQueue {self.name!r}>"

    async def _sync(self) -> _queues.Queue:
        if self._queue is None:
            state = await self._link.sync()
            self._queue = state.queue(self.name, self._max_attempts, **self._options)
        return self._queue

    async def put(
        self,
        item: Any,
        delay: float | None = None,
        key: str | None = None,
        **options: Unpack[PutOptions],
    ) -> int:
        """``Queue.put``: add a job (after ``delay`` seconds, with its ``priority``,
        ``group``, ``debounce``); its id. ``key``: a put with the key of a job the
        queue holds adds nothing, and returns that job's id."""
        queue = await self._sync()
        return await self._link.run(lambda: queue.put(item, delay, key, **options))

    async def put_every(
        self,
        item: Any,
        *,
        key: str,
        every: float | None = None,
        cron: str | None = None,
        tz: str | None = None,
    ) -> Timer:
        """``Queue.put_every``: a timer that puts a job of ``item`` at each due time."""
        queue = await self._sync()
        return await self._link.run(
            lambda: queue.put_every(item, key=key, every=every, cron=cron, tz=tz)
        )

    async def take(
        self, timeout: float | None = None, lease: float = _jobs.DEFAULT_LEASE
    ) -> AsyncJob | None:
        """``Queue.take``: the next ready job, for ``lease`` seconds, or None if none
        came within ``timeout`` seconds (None: wait until one comes; 0: look once).

        No thread waits. Cancelling the task ends the wait; a job taken meanwhile is
        given back as it was (its attempts unchanged).

        Raises:
            ClosedError: the engine closed while it waited.
            InvalidArgumentError: a bad ``timeout`` or ``lease``.
            ReadOnlyError: the engine is read-only.
        """
        seconds = _jobs.check_lease(lease)
        wait = check_timeout(timeout)
        queue = await self._sync()
        engine = _take_waits.writable_engine(binding_of(await self._link.sync()))
        start = perf_counter()
        try:
            job = await _take_waits.take_async(queue, engine, seconds, wait, self._link)
        finally:
            engine.stats.record("queue.take", perf_counter() - start)
        return None if job is None else AsyncJob(self._link, job)

    async def stats(self) -> dict[str, Any]:
        """``Queue.stats``: how many jobs are ready, delayed, taken and dead; taken by
        group, and the rate window's takes."""
        return await self._link.run((await self._sync()).stats)

    async def settings(self) -> dict[str, Any]:
        """``Queue.settings``: the queue's settings, once this handle's are saved."""
        return await self._link.run((await self._sync()).settings)

    async def job(self, job_id: int) -> JobInfo | None:
        """``Queue.job``: job ``job_id`` as it is now; None if there is none."""
        return await self._link.run((await self._sync()).job, job_id)

    async def cancel(self, job_id: int) -> bool:
        """``Queue.cancel``: remove job ``job_id``; whether the queue held it."""
        return await self._link.run((await self._sync()).cancel, job_id)

    async def purge(self, state: str | list[str] | None = None) -> int:
        """``Queue.purge``: remove the jobs in ``state`` (None: all); how many."""
        return await self._link.run((await self._sync()).purge, state)

    async def dead(self, limit: int | None = None) -> list[AsyncJob]:
        """``Queue.dead``: the dead jobs, in the order they died."""
        jobs = await self._link.run((await self._sync()).dead, limit)
        return [AsyncJob(self._link, job) for job in jobs]

    async def retry_dead(self) -> int:
        """``Queue.retry_dead``: make every dead job ready again; how many."""
        return await self._link.run((await self._sync()).retry_dead)


class AsyncJob:
    """A job taken from an ``AsyncQueue``, its ``ack``, ``nack`` and ``extend`` as
    coroutines (see ``reactor.Job``)."""

    __slots__ = ("_job", "_link", "attempts", "errors", "group", "id", "item", "priority", "queue")

    def __init__(self, link: Link, job: _queues.Job) -> None:
        self._link = link
        self._job = job
        self.id: int = job.id
        """The job's id in its queue."""
        self.item: Any = job.item
        """The job's item."""
        self.attempts: int = job.attempts
        """How many times it has been taken (1 at its first take)."""
        self.queue: str = job.queue
        """The name of the job's queue."""
        self.priority: int = job.priority
        """Its priority."""
        self.group: str | None = job.group
        """Its group."""
        self.errors: list[dict[str, Any]] = job.errors
        """The errors of its failed attempts (see ``Job.errors``)."""

    def __repr__(self) -> str:
        return f"AsyncJob(id={self.id}, item={self.item!r}, attempts={self.attempts})"

    async def ack(self) -> None:
        """``Job.ack``: done, removed. Raises ``LockNotOwnedError`` if the lease is lost."""
        await self._link.run(self._job.ack)

    async def nack(
        self, delay: float | None = None, error: str | BaseException | None = None
    ) -> None:
        """``Job.nack``: back to the queue (after ``delay``, or the queue's backoff),
        or dead after its last attempt; ``error`` says why."""
        await self._link.run(self._job.nack, delay, error)

    async def extend(self, seconds: float | None = None) -> None:
        """``Job.extend``: the lease now ends ``seconds`` from now."""
        await self._link.run(self._job.extend, seconds)
