"""The charts' figures over the last hour: ``GET /api/series``.

A sampler (an asyncio task of the app's lifespan) reads the figures every
``interval`` seconds, in the handle's worker threads, into a ring buffer that holds the
last hour. ``figures`` is the one function that reads them: the database's figures
(``reactor._handles.figures``, what every process sees alike), and one counter of this
process (the events handed to its subscribers).

```text
GET /api/series   {"interval", "window", "t": [epoch seconds], "writes": [per second],
                   "events": [per second], "timer_lag": [seconds],
                   "queues": {name: [jobs waiting]}, "lag": {subscriber: [revisions]}}
```

``writes`` are the changes committed per second by every process (the revision's
rise), ``events`` those delivered to this process's subscribers (the page's change
feed among them), a queue's depth its jobs ready or delayed (waiting), a subscriber's
lag how many revisions it is behind. A series is None where a sample has no figure (a
queue that did not exist yet; the first sample's rates).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reactor._engine.port import EnginePort
from reactor._handles.figures import database_figures
from reactor.aio import AsyncState
from reactor.aio.state import link_of
from reactor.errors import ClosedError, ReactorError

__all__ = ["DEFAULT_INTERVAL", "WINDOW", "Sampler", "figures", "series"]

logger = logging.getLogger("reactor")

DEFAULT_INTERVAL: Final = 5.0  # seconds between samples
WINDOW: Final = 3600.0  # seconds of samples kept
SERIES_MAX: Final = 12  # queues (the deepest) and subscribers (the furthest behind) charted


def figures(engine: EnginePort) -> dict[str, Any]:
    """What one sample reads: ``revision``, ``delivered`` (events handed to this
    process's subscribers so far), ``timer_lag`` (seconds the oldest due timer has
    waited), ``queues`` (jobs waiting by queue) and ``lag`` (revisions behind, by
    durable subscriber)."""
    found = database_figures(engine)
    counters = engine.stats.snapshot()["counters"]
    return {
        "revision": found["revision"],
        "delivered": counters.get("events_delivered", 0),
        "timer_lag": found["timers"]["lag"],
        "queues": {name: jobs["ready"] + jobs["delayed"] for name, jobs in found["queues"].items()},
        "lag": {name: sub["lag"] for name, sub in found["durable_subscribers"].items()},
    }


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float  # epoch seconds
    writes: float | None  # per second since the sample before
    events: float | None
    timer_lag: float
    queues: dict[str, int]
    lag: dict[str, int]


class Sampler:
    """Samples ``handle``'s figures every ``interval`` seconds into the last hour's
    ring buffer, from ``start`` (on the running loop) until ``stop``."""

    def __init__(self, handle: AsyncState, interval: float) -> None:
        self.interval = interval
        self._handle = handle
        self._samples: collections.deque[_Sample] = collections.deque(
            maxlen=max(2, round(WINDOW / interval))
        )
        self._task: asyncio.Task[None] | None = None
        self._last: tuple[float, dict[str, Any]] | None = None  # (monotonic, figures)

    def start(self) -> None:
        """Start sampling, if not yet (idempotent; on the running loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="reactor-ui")

    async def stop(self) -> None:
        """Stop sampling, and wait for it (a sample under way ends first: it is short)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def samples(self) -> list[_Sample]:
        return list(self._samples)

    async def _run(self) -> None:
        link = link_of(self._handle)
        while True:
            try:
                engine = await link.engine()
                read = await link.run(figures, engine)
            except ClosedError:
                return  # the handle closed: nothing more to sample
            except ReactorError as exc:  # a busy or unreachable database: try again later
                logger.warning("the dashboard could not sample the figures: %s", exc)
            else:
                self._add(time.monotonic(), read)
            await asyncio.sleep(self.interval)

    def _add(self, now: float, read: dict[str, Any]) -> None:
        writes = events = None
        if self._last is not None:
            then, before = self._last
            elapsed = max(now - then, 1e-6)
            writes = round(max(0, read["revision"] - before["revision"]) / elapsed, 3)
            events = round(max(0, read["delivered"] - before["delivered"]) / elapsed, 3)
        self._last = (now, read)
        self._samples.append(
            _Sample(time.time(), writes, events, read["timer_lag"], read["queues"], read["lag"])
        )


def _by_name(samples: list[_Sample], field: str, deepest: bool) -> dict[str, list[Any]]:
    """One series per name of ``field`` (queues, lag): the ``SERIES_MAX`` names with the
    largest figures in the last sample, each None where a sample lacks it."""
    last: dict[str, int] = getattr(samples[-1], field) if samples else {}
    names = sorted(last, key=lambda name: (-last[name], name) if deepest else name)
    chosen = sorted(names[:SERIES_MAX])
    return {name: [getattr(sample, field).get(name) for sample in samples] for name in chosen}


async def series(request: Request) -> Response:
    """``GET /api/series``: the last hour's samples, starting the sampler if the app's
    lifespan did not (a mounted app whose lifespan nobody ran)."""
    sampler: Sampler = request.app.state.sampler
    sampler.start()
    samples = sampler.samples()
    return JSONResponse(
        {
            "interval": sampler.interval,
            "window": WINDOW,
            "t": [round(sample.at, 3) for sample in samples],
            "writes": [sample.writes for sample in samples],
            "events": [sample.events for sample in samples],
            "timer_lag": [sample.timer_lag for sample in samples],
            "queues": _by_name(samples, "queues", deepest=True),
            "lag": _by_name(samples, "lag", deepest=True),
        }
    )
