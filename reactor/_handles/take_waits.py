"""How a take waits for a job (``Queue.take``, its asyncio twin, ``queues.take_then``).

A take that finds no job waits in its queue's line: one per engine and queue, in order
of arrival, behind one receiver of the engine's dispatcher, which hands it the events of
scope ``queue:NAME`` (this process's, and other processes' through the follower).
Nobody polls. Only the first in line (the head) looks again: when a job becomes ready
(an event), and when the next delayed job is due or the next lease runs out (a time it
read). A head that leaves, with a job or out of time, hands the turn on to the next,
which looks at once: a burst of jobs goes to one waiter after another, and a hundred
waiters cost one look per job, not a hundred.

No event is missed: a waiter joins its line (and the line the dispatcher) before it
looks, so a job that becomes ready after the look wakes the head, and one that became
ready before it is seen by it. A look reads first (two seeks of an index: is a job
ready, or a lease run out?) and writes only then; the write decides, under the queue's
lock, who gets the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from reactor._storage.txn import WriteTxn
from reactor._work import jobs as _jobs
from reactor.errors import ClosedError, ReadOnlyError

from . import takers as _takers
from .jobs import Job
from .waiting import OnLoop

if TYPE_CHECKING:
    from reactor._engine.port import EnginePort

    from .binding import Binding

__all__ = ["Looks", "Then", "take_async", "wait_take", "writable_engine"]

logger = logging.getLogger("reactor")


def writable_engine(binding: Binding) -> EnginePort:
    """The engine, if it may write.

    Raises:
        ClosedError: the handle is closed.
        ReadOnlyError: the engine is read-only (a take might otherwise wait on, without
            ever trying to write).
    """
    engine = binding.engine
    if engine.options.readonly:
        raise ReadOnlyError(
            f"cannot write {engine.store.location}: it is open read-only (readonly=True)"
        )
    return engine


def _closed(queue: Looks) -> ClosedError:
    return ClosedError(f"the engine closed while taking from queue {queue.name!r}")


def _after(
    queue: Looks,
    engine: EnginePort,
    line: _takers.Line,
    waiter: _takers.Waiter,
    found: tuple[Job | None, float | None],
    deadline: float | None,
    now: Callable[[], float],
) -> tuple[bool, Job | None, float | None]:
    """What a waiting take does after a look that ``found`` (a job, or when one may be
    next), for threads and tasks alike: (whether it is over, the job, the pause before
    it looks again unless woken; None: until woken).

    Raises:
        ClosedError: the engine is closing.
    """
    job, next_at = found
    if job is not None:
        return True, job, None
    if waiter.closing:
        raise _closed(queue)
    left = None if deadline is None else deadline - now()
    if left is not None and left <= 0:
        return True, None, None
    return False, None, _takers.pause(engine, line, waiter, next_at, left)


class Then(Protocol):
    """What a take's own transaction does with the job it took (``take_then``)."""

    scopes: tuple[str, ...]  # what it writes besides the queue

    def made(self, txn: WriteTxn, job: Job) -> None: ...


class Looks(Protocol):
    """What a waiting take needs of its queue (a ``Queue``: its look, a friend's call)."""

    name: str

    def _look(
        self, engine: EnginePort, lease: float, then: Then | None = None
    ) -> tuple[Job | None, float | None]: ...


def wait_take(
    queue: Looks, engine: EnginePort, lease: float, timeout: float | None, then: Then | None = None
) -> Job | None:
    """``take`` that may wait: in the calling thread, on an event."""
    deadline = None if timeout is None else time.monotonic() + timeout
    ready = threading.Event()
    waiter = _takers.Waiter(_jobs.lock_name(queue.name), ready.set)
    line = _takers.join(engine, waiter)
    try:
        while True:
            ready.clear()  # before looking: a wake from now on sets it again
            # A friend of Queue (SLF001): its take's waiting, written apart for both kinds.
            found = queue._look(engine, lease, then)  # noqa: SLF001
            done, job, pause = _after(queue, engine, line, waiter, found, deadline, time.monotonic)
            if done:
                return job
            ready.wait(None if pause is None else min(pause, threading.TIMEOUT_MAX))
    finally:
        line.remove(waiter)


async def take_async(
    queue: Looks,
    engine: EnginePort,
    lease: float,
    timeout: float | None,
    on_loop: OnLoop,
) -> Job | None:
    """``take`` on the running event loop, holding no thread while it waits (``on_loop``
    runs a look, or joining the line, in a worker thread). Cancelling the task ends the
    wait; a job its look took meanwhile is given back as it was."""
    run = on_loop.run
    if timeout == 0:
        return (await _look_async(queue, engine, lease, run))[0]
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    arrived = asyncio.Event()
    waiter = _takers.Waiter(_jobs.lock_name(queue.name), on_loop.waker(arrived.set))
    joining: asyncio.Future[_takers.Line] = asyncio.ensure_future(run(_takers.join, engine, waiter))
    try:
        line = await asyncio.shield(joining)
    except asyncio.CancelledError:
        joining.add_done_callback(functools.partial(_leave_joined, waiter))
        raise
    try:
        while True:
            arrived.clear()  # before looking: a wake from now on sets it again
            found = await _look_async(queue, engine, lease, run)
            done, job, pause = _after(queue, engine, line, waiter, found, deadline, loop.time)
            if done:
                return job
            if pause is None:
                await arrived.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await arrived.wait()
    finally:
        line.remove(waiter)


def _leave_joined(waiter: _takers.Waiter, joining: asyncio.Future[_takers.Line]) -> None:
    """Take ``waiter`` out of the line it joined, if the join went through."""
    if not joining.cancelled() and joining.exception() is None:
        joining.result().remove(waiter)


async def _look_async(
    queue: Looks, engine: EnginePort, lease: float, run: Callable[..., Awaitable[Any]]
) -> tuple[Job | None, float | None]:
    looking = asyncio.ensure_future(run(queue._look, engine, lease))  # noqa: SLF001 - a friend, as wait_take
    try:
        found: tuple[Job | None, float | None] = await asyncio.shield(looking)
    except asyncio.CancelledError:
        # The look goes on in its thread: a job it takes goes back as it was.
        looking.add_done_callback(functools.partial(_give_back, run))
        raise
    return found


def _give_back(run: Callable[..., Awaitable[Any]], looking: asyncio.Future[Any]) -> None:
    if looking.cancelled() or looking.exception() is not None:
        return
    job: Job | None = looking.result()[0]
    if job is None:
        return
    giving = asyncio.ensure_future(run(job._untake))  # noqa: SLF001 - a friend: the take's own undo
    giving.add_done_callback(functools.partial(_log_failure, job))


def _log_failure(job: Job, done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and (error := done.exception()) is not None:
        logger.warning(
            "job %d of queue %r, taken by a cancelled take, was not given back (it comes "
            "back when its lease runs out): %s",
            job.id,
            job.queue,
            error,
        )
