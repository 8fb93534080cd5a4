"""``AsyncWatch``: ``async for event in state.watch(...)``, with no thread waiting."""

from __future__ import annotations

import asyncio
import collections
import functools
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from reactor._base.keys import Globs
from reactor._engine.events import ChangeEvent
from reactor._handles.subscriptions import _PAGE, Watch

from .bridge import bridge

if TYPE_CHECKING:
    from .link import Link

__all__ = ["AsyncWatch"]


class AsyncWatch:
    """``async for event in state.watch(...)``; ends when closed or when the engine
    closes. Waiting for the next event holds no thread: the watch wakes the loop when
    events arrive (one wake-up for a burst, shared by every watch on the loop). The
    replay of the log after ``since`` is read a page at a time in the handle's worker
    threads. Until its first iteration a watch holds nothing (no feed, no buffer): the
    replay covers what was committed since it was made (``since``: ``state.watch``
    sets it to "now" when none is given)."""

    def __init__(
        self, link: Link, since: int | None, scope: Globs | None, key: Globs | None
    ) -> None:
        self._link = link
        self._args = (since, scope, key)
        self._watch: Watch | None = None
        self._replay: Iterator[ChangeEvent] | None = None
        self._page: collections.deque[ChangeEvent] = collections.deque()
        self._failed: Exception | None = None
        self._arrived = asyncio.Event()
        if since is None:  # it starts where the engine is when the handle opens
            link.when_open(weakref.WeakMethod(self._begin_at))

    def __aiter__(self) -> AsyncIterator[ChangeEvent]:
        return self

    async def __anext__(self) -> ChangeEvent:
        watch = self._watch or await self._start()
        replay = self._replay
        if not self._page and replay is not None:
            page, more, failed = await self._link.run(_next_page, replay)
            if self._replay is replay:  # not closed meanwhile
                self._page.extend(page)
                self._failed = failed
                if not more:
                    self._replay = None
        if self._page:
            return self._page.popleft()
        if self._failed is not None:  # the replay cannot go on: the watch ends with it
            error, self._failed = self._failed, None
            watch.close()
            raise error
        while True:
            self._arrived.clear()  # before looking: an event offered from now on sets it
            item = watch.poll()
            if isinstance(item, ChangeEvent):
                return item
            if item:
                raise StopAsyncIteration
            await self._arrived.wait()

    def _begin_at(self, revision: int) -> None:
        """Start after ``revision`` (a watch made before its handle opened)."""
        since, scope, key = self._args
        if since is None and self._watch is None:
            self._args = (revision, scope, key)

    async def _start(self) -> Watch:
        state = await self._link.sync()
        creating = asyncio.ensure_future(self._link.run(state.watch, *self._args))
        try:
            watch = await asyncio.shield(creating)
        except asyncio.CancelledError:
            creating.add_done_callback(_close_created)  # nobody will iterate it
            raise
        watch.when_ready(functools.partial(bridge().call_soon, self._arrived.set))
        if self._args[0] is not None:
            self._replay = watch.replay()
        self._watch = watch
        return watch

    async def aclose(self) -> None:
        """Stop the watch; iteration ends."""
        self._replay = None
        self._page.clear()
        if self._watch is not None:
            self._watch.close()

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        await self.aclose()


def _next_page(
    replay: Iterator[ChangeEvent],
) -> tuple[list[ChangeEvent], bool, Exception | None]:
    """Up to a page of a watch's replay (in a worker thread): the events, whether the
    replay goes on, and the error that ended it, if one did (raised once the events
    read before it are taken)."""
    page: list[ChangeEvent] = []
    try:
        for event in replay:
            page.append(event)
            if len(page) >= _PAGE:
                return page, True, None
    except Exception as exc:  # noqa: BLE001 - raised to the iterator after this page
        return page, False, exc
    return page, False, None


def _close_created(creating: asyncio.Future[Watch]) -> None:
    if not creating.cancelled() and creating.exception() is None:
        creating.result().close()
