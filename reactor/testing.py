"""Helpers for testing code that uses reactor: time that moves when told to, and the
upkeep run by hand.

```python
import reactor
from reactor.testing import ManualClock, run_upkeep

clock = ManualClock()
with reactor.open(":memory:", clock=clock, sweep_interval=1e6) as state:
    state.scope("cache").set("quote", 1.08, ttl=30)
    clock.advance(31)
    assert run_upkeep(state).keys_expired == 1   # gone, its `expired` event published
```

An engine's background sweeper runs the same chores every ``sweep_interval`` seconds
(an option of ``open``); ``run_upkeep`` runs them at once and waits for them, so a
test needs no sleep. Its counts are what that call did: the sweeper may have done
some of it first. Open with a long ``sweep_interval`` (``1e6``, say) to leave it all to
``run_upkeep`` (timers due at the clock's time still wake the sweeper). The guide:
docs/guides/testing.md.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ._base.clock import ManualClock
from ._base.results import Upkeep
from ._handles.binding import engine_of
from ._handles.state import State
from ._handles.transaction import held_scopes
from .aio.exclusive import held_scopes as task_held_scopes
from .aio.state import AsyncState, link_of

if TYPE_CHECKING:
    from ._engine.port import EnginePort

__all__ = ["ManualClock", "Upkeep", "run_upkeep", "run_upkeep_async"]


def run_upkeep(state: State) -> Upkeep:
    """Run the engine's upkeep once, now, in this thread, and wait for it: expire the
    keys whose TTL has run out, fire the timers that are due, turn back the queue jobs
    whose lease ran out, compact the change log to its retention. What it did; its
    events are published as the background sweeper's would be.

    Raises:
        ReentrancyError: a key or timer is due in a scope that a transaction body of
            this thread (or asyncio task) holds: the upkeep would wait for that body
            forever. Nothing else in a body refuses it.
        ReadOnlyError: the handle is read-only (the upkeep writes).
        ClosedError: the handle is closed.
        OperationTimeout: a scope's actor did not answer within the ``timeout`` of
            ``open`` (another thread's transaction held it).
        StorageError: a write of the upkeep failed.
    """
    engine = _engine(state)
    return engine.upkeep(_held(engine))


async def run_upkeep_async(state: AsyncState) -> Upkeep:
    """``run_upkeep`` for a ``reactor.aio`` handle: the loop goes on while it runs (in
    a thread of the loop's default executor).

    Raises:
        TypeError: ``state`` is not a ``reactor.aio`` handle.
        ReentrancyError: as ``run_upkeep``, for a transaction body of this task; and
            the other errors of ``run_upkeep``.
    """
    if not isinstance(state, AsyncState):
        raise TypeError(f"expected a reactor.aio.AsyncState, not {type(state).__name__}")
    engine = _engine(await link_of(state).sync())
    return await asyncio.to_thread(engine.upkeep, _held(engine))


def _engine(state: object) -> EnginePort:
    if not isinstance(state, State):
        raise TypeError(f"expected a reactor.State, not {type(state).__name__}")
    return engine_of(state)


def _held(engine: EnginePort) -> set[str]:
    """The scopes of ``engine`` held by the transaction bodies this thread (or task)
    is inside: their actors answer nothing until the body ends."""
    return {*held_scopes(engine), *task_held_scopes(id(engine))}


for _public in (ManualClock, Upkeep, run_upkeep, run_upkeep_async):
    _public.__module__ = __name__  # where users find them (repr, help, pickle)
del _public
