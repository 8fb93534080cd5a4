"""``AsyncRun``: what an ``async def`` workflow is given (SPEC §14, asyncio). The run
is the same, with the same records: an async workflow runs in its worker's thread, in
an event loop of its own for the call, so that sync and async workflows share one
pool of workers (and one database's runs). A step's function may be a coroutine
function; the records are written from the loop's thread, a few hundred microseconds
each."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

from .run import Run, StepCall, replayed
from .transaction import MultiTransaction

__all__ = ["AsyncRun"]


class AsyncRun:
    """An async workflow's run: ``await run.step(...)`` and the same verbs as ``Run``."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self.id: str = run.id
        """The run's id."""
        self.workflow: str = run.workflow
        """The workflow's name."""
        self.input: Any = run.input
        """What the run was started with."""
        self.attempts: int = run.attempts
        """1 at its first take; one more each time it was taken after a lease ran out."""

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncRun {self.id!r} of {self.workflow!r}>"

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: int = 0,
        backoff: float = 1.0,
        **kwargs: Any,
    ) -> Any:
        """``Run.step``; ``fn`` may be a coroutine function (awaited)."""
        call = StepCall(self._run, name, retries, backoff)
        if call.recorded is not None:
            return replayed(call.recorded)
        runner = self._run.runner
        for attempt in range(retries + 1):
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                await asyncio.sleep(call.failed(attempt, exc))
                if runner.stopping.is_set():
                    raise runner.release() from exc
                continue
            return call.succeeded(result)
        raise AssertionError("the last attempt returns or raises")  # pragma: no cover

    async def sleep(self, seconds: float) -> None:
        """``Run.sleep``."""
        self._run.sleep(seconds)

    async def sleep_until(self, epoch: float) -> None:
        """``Run.sleep_until``."""
        self._run.sleep_until(epoch)

    async def receive(self, topic: str, timeout: float | None = None) -> Any:
        """``Run.receive``."""
        return self._run.receive(topic, timeout)

    async def wait_for(
        self,
        scope: str,
        key: str,
        predicate: Callable[[Any], bool] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``Run.wait_for``."""
        return self._run.wait_for(scope, key, predicate, timeout)

    async def call(self, workflow: str, input: Any = None, id: str | None = None) -> Any:  # noqa: A002 - the spec's names
        """``Run.call``."""
        return self._run.call(workflow, input, id)

    @contextlib.asynccontextmanager
    async def transaction(self, *scopes: str) -> AsyncIterator[MultiTransaction]:
        """``Run.transaction``: ``async with run.transaction(...) as tx``, whose verbs
        are the synchronous ones (the workflow runs in its worker's thread)."""
        with self._run.transaction(*scopes) as tx:
            yield tx


def call_workflow(fn: Callable[..., Any], run: Run, value: Any) -> Any:
    """Call a workflow function: an ``async def`` one with an ``AsyncRun``, in an event
    loop of its own; what it returned."""
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(AsyncRun(run), value))
    return fn(run, value)
