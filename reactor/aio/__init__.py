"""reactor for asyncio: the same engine, with verbs as coroutines.

```python
import reactor.aio

async with reactor.aio.open("state.db") as state:
    orders = state.scope("orders")
    await orders.set("o-1", {"total": 120})
    async for event in state.watch(scope="orders"):
        ...
```

No call blocks the event loop. Writes are validated and encoded on the loop (CPU only),
then queued for the scope's actor, so 100 tasks writing at once give the actor 100
requests to commit together. The answers come back to the loop together too: a loop
bridge wakes the loop once for all the results a batch produced, instead of once per
result as ``asyncio.wrap_future`` would.

Nothing waits in a thread. A request waiting for its answer (a write, a transaction's
turn at its scope, a commit) is an asyncio future the bridge settles; an idle watch is
an asyncio event its feed sets through the bridge; a task waiting for a lock sleeps on
the loop. Only short blocking calls (reads, a transaction body's verbs, a lock's try,
opening) run in threads: a few workers of the handle's own, not the loop's default
executor, so the application's ``asyncio.to_thread`` work and reactor's never queue
behind each other. Closing runs in a thread of its own.

The modules, from the bottom: ``bridge`` (results from threads, timeouts), ``port``
(what the parts use of their handle), ``reads`` and ``verbs`` (a scope's verbs, each
written once over one hook), ``exclusive`` (transactions and locks), ``scope``,
``queue``, ``watch``, and ``state`` (the handle, which makes them all).
"""

from __future__ import annotations

from reactor._handles.async_run import AsyncRun

from .derived import AsyncDerived
from .exclusive import AsyncLock, AsyncMultiTransaction, AsyncTransaction
from .queue import AsyncJob, AsyncQueue
from .runs import AsyncRunHandle, AsyncWorkers
from .scope import AsyncScope
from .state import AsyncState, open  # noqa: A004 - reactor.aio.open, as reactor.open
from .watch import AsyncWatch

__all__ = [
    "AsyncDerived",
    "AsyncJob",
    "AsyncLock",
    "AsyncMultiTransaction",
    "AsyncQueue",
    "AsyncRun",
    "AsyncRunHandle",
    "AsyncScope",
    "AsyncState",
    "AsyncTransaction",
    "AsyncWatch",
    "AsyncWorkers",
    "open",
]

# Where users find them (repr, help, pickle), as in reactor/__init__.py.
for _public in (
    AsyncDerived,
    AsyncJob,
    AsyncLock,
    AsyncMultiTransaction,
    AsyncQueue,
    AsyncRun,
    AsyncRunHandle,
    AsyncScope,
    AsyncState,
    AsyncTransaction,
    AsyncWatch,
    AsyncWorkers,
    open,
):
    _public.__module__ = __name__
del _public
