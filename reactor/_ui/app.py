"""The dashboard's web app: the page, a JSON API to read, and (``--write``) to write.

```text
GET  /                    the page (static HTML, JS and CSS under /static)
GET  /api/info            {"database", "write", "version"}
GET  /api/scopes          {"scopes": {name: key count}}
GET  /api/keys?scope=S&pattern=GLOB           {"scope", "pattern", "keys": [...]}
GET  /api/value?scope=S&key=K
     {"scope", "key", "value", "text", "ttl", "version", "revision", "created_revision"}
GET  /api/history?scope=S&key=K&limit=N     {"scope", "key", "changes": [...], "compacted"}
GET  /api/locks           {"locks": [{"name", "holder", "token", "expires_in"}], "held"}
GET  /api/timers          {"timers": [{"id", "scope", "key", "due", "due_in", "every",
                                       "cron", "tz", "value", "ops"}], "pending"}
GET  /api/stats           state.stats() (durable subscribers' lag included)
GET  /api/events?scope=GLOB&key=GLOB&since=R  the change feed, as Server-Sent Events
GET  /api/series          the charts' figures over the last hour (see ``series``)
POST /api/set     {"scope", "key", "value", "ttl"?, "keep_ttl"?}  {"old_value", "new_value"}
POST /api/update  {"scope", "key", "ops", "atomic"?}
                  {"old_value", "new_value", "errors", "applied": "all" | "some" | "none"}
POST /api/delete  {"scope", "key"}                     {"deleted", "old_value"}
POST /api/cancel_timer  {"id"}                         {"cancelled": true}; 404 if not pending
```

And the queues' (``queue_routes``):

```text
GET  /api/queues          {"queues": [{"name", "max_attempts", "ready", "delayed", "taken",
                                       "dead", "oldest_ready_age", ...}], "count", "dead"}
GET  /api/dead?queue=Q&limit=N  {"queue", "jobs": [{"id", "item", "attempts", "died",
                                                    "error"}], "dead"}
GET  /api/jobs?queue=Q&state=S&limit=N  the same for the jobs in state S (ready, taken or
                                dead), each with "ready_at" for "died", and "state"
GET  /api/job?queue=Q&id=N      Queue.job(N): {"queue", "id", "state", "item", "attempts",
                                "max_attempts", "priority", "group", "key", "ready_at",
                                "created_at", "worker", "errors"}; 404 if no such job
POST /api/retry_dead    {"queue"}           {"retried": N}; 404 if no such queue
POST /api/cancel_job    {"queue", "id"}     {"cancelled": true}; 404 if no such job
POST /api/purge         {"queue", "state"}  {"purged": N}; 404 if no such queue
```

And the durable workflows' runs (``run_routes``):

```text
GET  /api/runs?workflow=GLOB&status=S  {"runs": [{"id", "workflow", "status", "attempts",
                                        "steps", "input", "result", "error", "created",
                                        "updated"}], "count", "failed"}: newest first
GET  /api/run?id=ID             the same for one run, "steps": [{"name", "status",
                                "result", "error", "started", "ended"}]; 404 if none
POST /api/cancel_run    {"id"}              {"cancelled": bool}; 404 if no such run
```

A change (in the feed and in a key's history) is ``changes.change_view``: the event's
fields, its values as JSON text, and an update's JSON Patch.

A refused or failed request answers ``{"error": NAME, "message": TEXT}``: 400 with the
name of reactor's error for bad input (nothing is written), 403 for a write the server
does not allow (see ``guard``), 404 for a missing key, a timer no longer pending or a
queue that does not exist.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from reactor._base.keys import check_key
from reactor._base.update_ops import op_style
from reactor._engine.events import ChangeEvent
from reactor._storage.records import ChangeRecord, TimerRow
from reactor._storage.store import StoreReads
from reactor._version import __version__
from reactor.aio import AsyncState
from reactor.aio import open as open_async
from reactor.aio.state import link_of
from reactor.errors import InvalidArgumentError, ReactorError

from . import derived_routes, queue_routes, run_routes
from .changes import change_view
from .feed import DEFAULT_PING, events
from .guard import LOOPBACK_NAMES, HostGuard, write_refusal
from .requests import (
    TEXT_MAX,
    Problem,
    body_of,
    clipped,
    param,
    problem_answer,
    reactor_error_answer,
    shortened,
    state_of,
    store_read,
)
from .series import DEFAULT_INTERVAL, Sampler, series

__all__ = ["Problem", "build_app", "create_app"]

STATIC: Final = Path(__file__).resolve().parent / "static"
HISTORY_LIMIT: Final = 50  # changes of a key shown by default
HISTORY_MAX: Final = 500
LOCKS_MAX: Final = 200  # locks listed, at most (``held`` counts them all)
TIMERS_MAX: Final = 200  # timers listed, at most (``pending`` counts them all)
TIMER_TEXT_MAX: Final = TEXT_MAX  # characters of a timer's value or ops sent, at most
TIMER_ID_MAX: Final = 200  # characters of a timer id looked up, at most (reactor's are 32)
# The page loads nothing from elsewhere, and no other site may frame it.
_PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Endpoint = Callable[[Request], Awaitable[Response]]


def create_app(
    target: str | os.PathLike[str] | None,
    *,
    write: bool = False,
    hosts: list[str] | None = None,
    ping: float = DEFAULT_PING,
) -> Starlette:
    """The dashboard for the database ``target`` (what ``reactor.open`` takes), as
    ``reactor ui`` serves it.

    ``write`` allows the write endpoints; ``hosts`` are the names the ``Host`` header
    may carry (the loopback names by default); ``ping`` is the seconds between the
    feed's keep-alive comments. The database opens when the app starts, and closes
    when it stops.
    """
    return build_app(
        open_async(target), owned=True, write=write, hosts=hosts or [*LOOPBACK_NAMES], ping=ping
    )


def build_app(
    handle: AsyncState,
    *,
    owned: bool,
    write: bool,
    hosts: Sequence[str] | None,
    ping: float,
    sample_every: float = DEFAULT_INTERVAL,
) -> Starlette:
    """The dashboard on ``handle`` (``owned``: opened when the app starts; else open
    already, the caller's); ``hosts`` None: no check of the ``Host`` header (the app
    it is mounted in decides who may reach it); the charts' figures sampled every
    ``sample_every`` seconds. The sampler and the handle stop when the app stops.
    """
    sampler = Sampler(handle, sample_every)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if owned:
                await stack.enter_async_context(handle)  # the database opens (or fails) now
            else:
                stack.push_async_callback(handle.close)  # its threads, not the caller's State
            stack.push_async_callback(sampler.stop)  # first: before the handle closes
            sampler.start()
            yield

    middleware = [] if hosts is None else [Middleware(HostGuard, allowed_hosts=list(hosts))]
    app = Starlette(
        routes=_routes(write),
        middleware=middleware,
        exception_handlers={Problem: problem_answer, ReactorError: reactor_error_answer},
        lifespan=lifespan,
    )
    app.state.reactor = handle
    app.state.write = write
    app.state.ping = ping
    app.state.sampler = sampler
    return app


def _routes(write: bool) -> list[Route | Mount]:
    """Every route; the writes behind ``guard.write_refusal`` (``write``: allowed)."""

    def guarded(endpoint: Endpoint) -> Endpoint:
        async def guard(request: Request) -> Response:
            refusal = write_refusal(request, write)
            if refusal is not None:
                raise Problem(403, "Forbidden", refusal)
            return await endpoint(request)

        return guard

    reads: list[tuple[str, Endpoint]] = [
        ("/", _page),
        ("/api/info", _info),
        ("/api/scopes", _scopes),
        ("/api/keys", _keys),
        ("/api/value", _value),
        ("/api/history", _history),
        ("/api/locks", _locks),
        ("/api/timers", _timers),
        ("/api/stats", _stats),
        ("/api/events", events),
        ("/api/series", series),
    ]
    writes: list[tuple[str, Endpoint]] = [
        ("/api/set", _set),
        ("/api/update", _update),
        ("/api/delete", _delete),
        ("/api/cancel_timer", _cancel_timer),
    ]
    for path, endpoint, writing in (
        *queue_routes.ROUTES,
        *run_routes.ROUTES,
        *derived_routes.ROUTES,
    ):
        (writes if writing else reads).append((path, endpoint))
    return [
        *(Route(path, endpoint) for path, endpoint in reads),
        *(Route(path, guarded(endpoint), methods=["POST"]) for path, endpoint in writes),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


# -- the page and the reads -------------------------------------------------------
async def _page(_request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers=_PAGE_HEADERS)


async def _info(request: Request) -> Response:
    stats = await state_of(request).stats()
    return JSONResponse(
        {"database": stats["database"], "write": request.app.state.write, "version": __version__}
    )


async def _scopes(request: Request) -> Response:
    counts: dict[str, int] = (await state_of(request).stats())["scopes"]
    return JSONResponse({"scopes": dict(sorted(counts.items()))})


async def _keys(request: Request) -> Response:
    scope, pattern = param(request, "scope"), param(request, "pattern", "*")
    keys = await state_of(request).scope(scope).keys(pattern)
    return JSONResponse({"scope": scope, "pattern": pattern, "keys": keys})


async def _value(request: Request) -> Response:
    scope, key = param(request, "scope"), param(request, "key")
    handle = state_of(request)
    entry = await handle.scope(scope).entry(key)  # one read: the value and its versions
    if entry is None:
        raise Problem(404, "NotFound", f"no key {key!r} in scope {scope!r}")
    now = (await link_of(handle).engine()).now()
    return JSONResponse(
        {
            "scope": scope,
            "key": key,
            "value": entry.value,
            # As stored: the page shows (and edits) 1.0 as 1.0, not as JavaScript's 1.
            "text": json.dumps(entry.value, indent=2, ensure_ascii=False),
            "ttl": None if entry.expires_at is None else round(max(0.0, entry.expires_at - now), 3),
            "version": entry.version,
            "revision": entry.revision,
            "created_revision": entry.created_revision,
        }
    )


async def _history(request: Request) -> Response:
    scope = check_key(param(request, "scope"), "scope name")
    key = check_key(param(request, "key"))
    given = param(request, "limit", str(HISTORY_LIMIT))
    if not (given.isascii() and given.isdigit() and 1 <= int(given) <= HISTORY_MAX):
        raise Problem(400, "InvalidRequest", f"limit must be 1 to {HISTORY_MAX}, not {given!r}")

    def read(store: StoreReads, _now: float) -> tuple[list[ChangeRecord], int]:
        return store.history(scope, key, int(given)), store.compacted()

    records, compacted = await store_read(request, read)
    return JSONResponse(
        {
            "scope": scope,
            "key": key,
            "changes": [change_view(ChangeEvent(record)) for record in records],
            # Changes up to this revision may be gone from the log (compacted).
            "compacted": compacted,
        }
    )


async def _locks(request: Request) -> Response:
    def read(store: StoreReads, now: float) -> tuple[list[dict[str, Any]], int]:
        held = store.held_locks(now, LOCKS_MAX)
        listed = [
            {
                "name": name,
                "holder": row.owner,
                "token": row.token,
                "expires_in": round(max(0.0, (row.expires_at or now) - now), 3),
            }
            for name, row in held
        ]
        return listed, len(held) if len(held) < LOCKS_MAX else store.locks_held(now)

    listed, count = await store_read(request, read)
    return JSONResponse({"locks": listed, "held": count})


async def _timers(request: Request) -> Response:
    def read(store: StoreReads, now: float) -> tuple[list[dict[str, Any]], int]:
        pending = store.timers(TIMERS_MAX)  # earliest first
        count = len(pending) if len(pending) < TIMERS_MAX else store.timers_pending()
        return [_timer_view(row, now) for row in pending], count

    listed, count = await store_read(request, read)
    return JSONResponse({"timers": listed, "pending": count})


def _timer_view(row: TimerRow, now: float) -> dict[str, Any]:
    """A pending timer as the page shows it: what it writes as JSON text (the value's,
    or the ops'; the other None), cut short past ``TIMER_TEXT_MAX`` characters."""
    return {
        "id": row.id,
        "scope": row.scope,
        "key": row.key,
        "due": row.due,
        "due_in": round(row.due - now, 3),  # below zero: overdue (no process fires it)
        "every": row.every,
        "cron": row.cron,
        "tz": row.tz,
        "value": shortened(row.value),
        "ops": shortened(row.ops),
    }


async def _stats(request: Request) -> Response:
    return JSONResponse(await state_of(request).stats())


# -- the writes (behind guard.write_refusal) -----------------------------------------
async def _set(request: Request) -> Response:
    data = await body_of(request, ("scope", "key", "value"), ("ttl", "keep_ttl"))
    scope = state_of(request).scope(data["scope"])
    keep_ttl = data.get("keep_ttl", False)
    if type(keep_ttl) is not bool:
        raise Problem(400, "InvalidRequest", f"keep_ttl must be true or false, not {keep_ttl!r}")
    change = await scope.set(data["key"], data["value"], ttl=data.get("ttl"), keep_ttl=keep_ttl)
    return JSONResponse({"old_value": change.old_value, "new_value": change.new_value})


async def _update(request: Request) -> Response:
    data = await body_of(request, ("scope", "key", "ops"), ("atomic",))
    scope = state_of(request).scope(data["scope"])
    ops = data["ops"]
    if isinstance(ops, dict):
        ops = [ops]  # one op alone, as the command line takes it
    atomic = data.get("atomic")
    if atomic is not None and type(atomic) is not bool:
        raise Problem(400, "InvalidRequest", f"atomic must be true, false or null, not {atomic!r}")
    result = await scope.update(data["key"], ops, atomic=atomic)
    # What was written: all the ops, some (update ops without atomic skip those that do
    # not apply), or none (an all-or-nothing update with an error, or no op applied).
    applied = "all"
    if result.errors:
        all_or_nothing = atomic is True or op_style(ops) == "patch"
        applied = "none" if all_or_nothing or len(result.errors) >= len(ops) else "some"
    return JSONResponse(
        {
            "old_value": result.old_value,
            "new_value": result.new_value,
            "errors": result.errors,
            "applied": applied,
        }
    )


async def _delete(request: Request) -> Response:
    data = await body_of(request, ("scope", "key"), ())
    scope = state_of(request).scope(data["scope"])
    existed = await scope.exists(data["key"])
    old = await scope.delete(data["key"])
    return JSONResponse({"deleted": existed or old is not None, "old_value": old})


async def _cancel_timer(request: Request) -> Response:
    data = await body_of(request, ("id",), ())
    timer_id = data["id"]
    if type(timer_id) is str and not _storable_id(timer_id):
        # No timer has such an id; and the database could not even look it up.
        raise InvalidArgumentError(f"not a timer id: {clipped(timer_id)!r}")
    if not await state_of(request).cancel_timer(timer_id):  # not a str: 400
        message = f"no pending timer {clipped(timer_id)!r} (it fired, or was cancelled)"
        raise Problem(404, "NotFound", message)
    return JSONResponse({"cancelled": True})


def _storable_id(text: str) -> bool:
    """Whether ``text`` can be looked up: not too long, and UTF-8 text without NUL (which
    PostgreSQL's text refuses)."""
    if not 0 < len(text) <= TIMER_ID_MAX or "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \ud800 can give
        return False
    return True
