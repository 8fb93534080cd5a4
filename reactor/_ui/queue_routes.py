"""The dashboard's endpoints of work queues: the queues with their counts and settings,
a queue's dead letters or its jobs in another state, a job by id; with ``--write``,
retrying a queue's dead letters, cancelling a job, purging a queue's jobs of some
states."""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reactor._handles import queues as _queues
from reactor._storage.records import JobRow
from reactor._storage.statements import JobReads
from reactor._storage.store import StoreReads
from reactor._work.attempts import last_error
from reactor._work.jobs import check_queue
from reactor._work.queue_settings import settled

from .requests import Problem, body_of, clipped, param, shortened, state_of, store_read

__all__ = ["JOB_TEXT_MAX", "QUEUES_MAX", "ROUTES"]

QUEUES_MAX: Final = 200  # queues listed, at most (``count`` counts them all)
DEAD_LIMIT: Final = 50  # dead letters of a queue listed by default
DEAD_MAX: Final = 500
JOB_TEXT_MAX: Final = 2000  # characters of a dead letter's item sent, at most
JOB_STATES: Final = ("ready", "taken", "dead")  # as stored


async def _queue_list(request: Request) -> Response:
    def read(store: StoreReads, now: float) -> tuple[list[dict[str, Any]], int]:
        jobs = store.reader().jobs()
        names = jobs.queue_names()  # sorted
        return [_queue_view(jobs, name, now) for name in names[:QUEUES_MAX]], len(names)

    listed, count = await store_read(request, read)
    # The dead letters of the queues listed (all of them, unless more than QUEUES_MAX).
    dead = sum(queue["dead"] for queue in listed)
    return JSONResponse({"queues": listed, "count": count, "dead": dead})


def _queue_view(jobs: JobReads, name: str, now: float) -> dict[str, Any]:
    """A queue as the page shows it: ``Queue.stats()``'s counts, its ``max_attempts``,
    and how long the job first in line has been ready (None: no job is ready now); each
    a seek or a range of the jobs' index."""
    max_attempts, counts = _queues.counts(jobs, name, now)
    first, _ = jobs.next_times(name)  # the earliest ready_at of the ready jobs
    waited = None if first is None or first > now else round(now - first, 3)
    row = settled(jobs.queue(name), None)
    return {
        "name": name,
        "max_attempts": max_attempts,
        **counts,
        "oldest_ready_age": waited,
        "concurrency": row.concurrency,
        "group_concurrency": row.group_concurrency,
        "rate": None if row.rate_limit is None else [row.rate_limit, row.rate_seconds],
        "backoff": None if row.backoff_base is None else [row.backoff_base, row.backoff_max],
    }


async def _dead(request: Request) -> Response:
    """``GET /api/dead?queue=Q&limit=N``: the queue's dead letters, in the order they
    died (``/api/jobs`` with ``state=dead``, and ``died`` for ``ready_at``)."""
    answer = await _jobs_in(request, "dead")
    del answer["state"]
    for job in answer["jobs"]:
        job["died"] = job.pop("ready_at")
    return JSONResponse(answer)


async def _jobs(request: Request) -> Response:
    """``GET /api/jobs?queue=Q&state=S&limit=N``: the queue's jobs in state ``S`` (as
    stored: ``ready``, the delayed among them, ``taken`` or ``dead``), by ``ready_at``."""
    state = param(request, "state", "dead")
    if state not in JOB_STATES:
        raise Problem(400, "InvalidRequest", f"state must be one of {', '.join(JOB_STATES)}")
    return JSONResponse(await _jobs_in(request, state))


async def _jobs_in(request: Request, state: str) -> dict[str, Any]:
    name = check_queue(param(request, "queue"))
    given = param(request, "limit", str(DEAD_LIMIT))
    if not (given.isascii() and given.isdigit() and 1 <= int(given) <= DEAD_MAX):
        raise Problem(400, "InvalidRequest", f"limit must be 1 to {DEAD_MAX}, not {given!r}")

    def read(store: StoreReads, now: float) -> tuple[list[JobRow], int] | None:
        jobs = store.reader().jobs()
        if jobs.queue(name) is None:
            return None
        # ``dead`` also counts a lease run out after the last attempt, which the sweeper
        # has yet to move; ``ready`` as stored holds the delayed jobs too.
        counts = _queues.counts(jobs, name, now)[1]
        total = counts["ready"] + counts["delayed"] if state == "ready" else counts[state]
        return jobs.in_state(name, state, int(given)), total

    found = await store_read(request, read)
    if found is None:
        raise Problem(404, "NotFound", f"no queue {clipped(name)!r}")
    rows, total = found
    return {
        "queue": name,
        "state": state,
        "jobs": [
            {
                "id": row.id,
                "item": shortened(row.item, JOB_TEXT_MAX),  # JSON text, as stored
                "attempts": row.attempts,
                # Epoch seconds: when it is (or was) ready, its lease ends, or it died.
                "ready_at": row.ready_at,
                # Why: the last failed attempt's error (None: none given).
                "error": shortened(last_error(row.errors), JOB_TEXT_MAX),
            }
            for row in rows
        ],
        state: total,
    }


async def _retry_dead(request: Request) -> Response:
    data = await body_of(request, ("queue",), ())
    queue = state_of(request).queue(data["queue"])  # a bad name: InvalidKeyError, 400
    await _existing(request, queue.name)
    return JSONResponse({"retried": await queue.retry_dead()})


async def _job(request: Request) -> Response:
    """``GET /api/job?queue=Q&id=N``: ``Queue.job(N)`` (404 if the queue holds no such
    job), its item as JSON text cut short past ``JOB_TEXT_MAX`` characters, and each
    attempt's error too."""
    queue = state_of(request).queue(param(request, "queue"))
    info = await queue.job(_job_id(param(request, "id")))
    if info is None:
        raise Problem(
            404, "NotFound", f"no job {param(request, 'id')} in queue {clipped(queue.name)!r}"
        )
    return JSONResponse(
        {
            "queue": info.queue,
            "id": info.id,
            "state": info.state,
            "item": shortened(_json_text(info.item), JOB_TEXT_MAX),
            "attempts": info.attempts,
            "max_attempts": await _max_attempts(request, info.queue),
            "priority": info.priority,
            "group": info.group,
            "key": info.key,
            "ready_at": info.ready_at,
            "created_at": info.created_at,
            "worker": info.worker,
            "errors": [
                {**error, "error": shortened(error.get("error"), JOB_TEXT_MAX)}
                for error in info.errors
            ],
        }
    )


async def _cancel_job(request: Request) -> Response:
    """``POST /api/cancel_job {"queue", "id"}``: ``Queue.cancel``; 404 if no such job."""
    data = await body_of(request, ("queue", "id"), ())
    queue = state_of(request).queue(data["queue"])
    if not await queue.cancel(data["id"]):  # not an int: InvalidArgumentError, 400
        raise Problem(404, "NotFound", f"no job {data['id']!r} in queue {clipped(queue.name)!r}")
    return JSONResponse({"cancelled": True})


async def _purge(request: Request) -> Response:
    """``POST /api/purge {"queue", "state"}``: ``Queue.purge(state)`` (a state, a list
    of them, or null: every job); 404 if no such queue."""
    data = await body_of(request, ("queue", "state"), ())
    queue = state_of(request).queue(data["queue"])
    await _existing(request, queue.name)
    return JSONResponse({"purged": await queue.purge(data["state"])})


async def _existing(request: Request, name: str) -> None:
    """Raises:
    Problem: 404, no queue ``name``.
    """

    def exists(store: StoreReads, _now: float) -> bool:
        return store.reader().jobs().queue(name) is not None

    if not await store_read(request, exists):
        raise Problem(404, "NotFound", f"no queue {clipped(name)!r}")


async def _max_attempts(request: Request, name: str) -> int:
    def read(store: StoreReads, _now: float) -> int:
        return settled(store.reader().jobs().queue(name), None).max_attempts

    return await store_read(request, read)


def _job_id(text: str) -> int:
    """Raises:
    Problem: 400, ``text`` is not a job id.
    """
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise Problem(400, "InvalidRequest", f"id must be a job's number, not {clipped(text)!r}")
    return int(text)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # as /api/dead's


# (path, endpoint, whether it writes): the writes go behind the app's guard.
ROUTES: Final = (
    ("/api/queues", _queue_list, False),
    ("/api/dead", _dead, False),
    ("/api/jobs", _jobs, False),
    ("/api/job", _job, False),
    ("/api/retry_dead", _retry_dead, True),
    ("/api/cancel_job", _cancel_job, True),
    ("/api/purge", _purge, True),
)
