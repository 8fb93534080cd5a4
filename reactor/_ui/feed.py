"""The change feed as Server-Sent Events: ``GET /api/events?scope=GLOB&key=GLOB``.

Each change is an event ``change`` whose ``id`` is its revision and whose data is
``ChangeEvent.as_dict()`` with the values as JSON text and an update's JSON Patch
(``changes.change_view``). A stream opens with an event ``ready`` whose ``id`` is the
revision it follows from, so that a browser that loses the connection before any
change still knows where it was.

The feed resumes: a reconnecting ``EventSource`` sends the last id it saw as
``Last-Event-ID`` (a first connection may say ``since=REVISION``), and the stream
replays the change log after it before going live, with no gap and no repeat (a
subscription with ``since``). A client that falls more than ``_BACKLOG`` events behind
is disconnected, to come back and read the rest from the log. If the log no longer
holds that revision, the ``ready`` event carries a ``notice`` saying so, and the
stream follows from the current revision.

Every stream ends when its client goes, and when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from reactor._engine.events import ChangeEvent
from reactor._handles.subscriptions import Subscription
from reactor.aio import AsyncState
from reactor.errors import InvalidArgumentError, RevisionCompactedError

from .changes import change_view

__all__ = ["DEFAULT_PING", "events"]

DEFAULT_PING: Final = 15.0  # seconds between keep-alive comments
_BACKLOG: Final = 10_000  # events queued for a slow client before it is cut off
_RETRY_MS: Final = 2_000  # how long a browser waits before reconnecting
_SHUTDOWN_GRACE: Final = 1.0  # seconds a stream has to end once the server stops
_END: Final = object()


async def events(request: Request) -> Response:
    """The change feed, filtered by the ``scope`` and ``key`` globs."""
    state: AsyncState = request.app.state.reactor
    scope = request.query_params.get("scope") or None
    key = request.query_params.get("key") or None
    since = _since(request)
    follower = _Follower(asyncio.get_running_loop())
    notice = None
    current = await _revision(state)
    if since is None or since > current:
        if since is not None:  # another database, or one restored from a backup
            notice = f"revision {since} is ahead of the database (at {current})"
        since = current
    try:
        subscription = await state.subscribe(follower.offer, scope=scope, key=key, since=since)
    except RevisionCompactedError as exc:
        since = await _revision(state)
        notice = f"{exc}: the changes in between are not shown"
        subscription = await state.subscribe(follower.offer, scope=scope, key=key, since=since)
    ready = ServerSentEvent(
        json.dumps({"revision": since, "notice": notice}),
        event="ready",
        id=str(since),
        retry=_RETRY_MS,
    )
    return _FeedResponse(follower, ready, subscription, ping=request.app.state.ping)


def _since(request: Request) -> int | None:
    """Where the client was: ``Last-Event-ID`` (a reconnection), else ``since``."""
    given = request.headers.get("last-event-id") or request.query_params.get("since")
    if given is None or given == "":
        return None
    if not given.isdigit() or not given.isascii():
        raise InvalidArgumentError(f"since must be a revision (an int >= 0), not {given!r}")
    return int(given)


async def _revision(state: AsyncState) -> int:
    revision: int = (await state.stats())["revision"]
    return revision


class _Follower:
    """Hands a subscription's events, from its thread, to one stream on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._cut_off = False

    def offer(self, event: ChangeEvent) -> None:
        """The subscription's callback (on its thread): queue ``event`` for the stream."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens
            self._loop.call_soon_threadsafe(self._put, event)

    def _put(self, event: ChangeEvent | object) -> None:
        if self._cut_off:
            return
        if event is _END or self._queue.qsize() >= _BACKLOG:
            # Past the backlog, rather than drop events, end the stream: the browser
            # reconnects with the last revision it saw and reads the rest from the log.
            self._cut_off = True
            event = _END
        self._queue.put_nowait(event)

    async def end_on(self, shutdown: anyio.Event) -> None:
        """End the stream (cleanly, its response complete) once ``shutdown`` is set."""
        await shutdown.wait()
        self._put(_END)

    async def stream(self, ready: ServerSentEvent) -> AsyncIterator[ServerSentEvent]:
        """The ``ready`` event, then one event per change, until the stream ends."""
        yield ready
        while (item := await self._queue.get()) is not _END:
            data = json.dumps(change_view(item), ensure_ascii=False)
            yield ServerSentEvent(data, event="change", id=str(item.revision))


class _FeedResponse(EventSourceResponse):
    """An event stream that ends cleanly when the server stops, and closes its
    subscription however it ends."""

    def __init__(
        self,
        follower: _Follower,
        ready: ServerSentEvent,
        subscription: Subscription,
        *,
        ping: float,
    ) -> None:
        self._shutdown = anyio.Event()  # set by sse-starlette when the server stops
        super().__init__(
            follower.stream(ready),
            ping=ping,
            shutdown_event=self._shutdown,
            shutdown_grace_period=_SHUTDOWN_GRACE,
        )
        self._follower = follower
        self._subscription = subscription

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._follower.end_on(self._shutdown))
        try:
            await super().__call__(scope, receive, send)
        finally:
            watcher.cancel()
            # Quick: the subscription's thread wakes at once, and only ever queues.
            self._subscription.close(timeout=1.0)
