"""Durable workflows from asyncio (SPEC §14): ``AsyncRunHandle``, and the workflow
verbs of ``AsyncState`` (``AsyncWorkflows``): registration, start, serve, send,
cancel, look-ups. Workers are threads (``state.serve``), whatever the workflows: an
``async def`` workflow runs in its worker's thread, in an event loop of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from reactor._base.results import RunInfo
from reactor._handles.run_handle import RunHandle, outcome
from reactor._handles.run_workers import Workers
from reactor._handles.state import workflows_of
from reactor._handles.workflows import Workflows
from reactor._work import runs as _runs

from .scope import AsyncScope

if TYPE_CHECKING:
    from .link import Link

__all__ = ["AsyncRunHandle", "AsyncWorkers", "AsyncWorkflows"]

W = TypeVar("W", bound=Callable[..., Any])


class AsyncRunHandle:
    """A workflow's run, by its id: ``await status()``, ``await result(timeout)``."""

    def __init__(self, link: Link, handle: RunHandle) -> None:
        self._link = link
        self._handle = handle
        self.id: str = handle.id
        """The run's id."""
        self.workflow: str = handle.workflow
        """Its workflow's name."""

    def __repr__(self) -> str:
        return f"<reactor.aio.AsyncRunHandle {self.id!r} of {self.workflow!r}>"

    async def status(self) -> str:
        """``RunHandle.status``."""
        return await self._link.run(self._handle.status)

    async def result(self, timeout: float | None = None) -> Any:
        """``RunHandle.result``: waits on the run's changes through the loop (no
        thread waits), across processes."""
        scope = AsyncScope(self._link, _runs.scope_of(self.workflow))

        def ended(doc: Any) -> bool:
            return isinstance(doc, dict) and doc.get("status") in _runs.FINAL

        return outcome(await scope.wait_for(self.id, ended, timeout))


class AsyncWorkers:
    """``state.serve``'s worker threads, stopped with ``await stop()``."""

    def __init__(self, link: Link, workers: Workers) -> None:
        self._link = link
        self._workers = workers

    @property
    def workflows(self) -> list[str]:
        """The names of the workflows served."""
        return self._workers.workflows

    async def stop(self, timeout: float = 30.0) -> None:
        """``Workers.stop``, waited for in a worker thread."""
        await self._link.run(self._workers.stop, timeout)

    async def __aenter__(self) -> AsyncWorkers:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()


class AsyncWorkflows:
    """The workflow verbs of an asyncio handle, on its link."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._pending: list[tuple[str, int, float, Callable[..., Any]]] = []

    def workflow(self, name: str, max_attempts: int, lease: float) -> Callable[[W], W]:
        """Register a workflow function (sync or ``async def``), when the database is
        open (at once if it is)."""
        Workflows.check(name, max_attempts, lease)

        def decorate(fn: W) -> W:
            self._pending.append((name, max_attempts, lease, fn))
            return fn

        return decorate

    async def _workflows(self) -> Workflows:
        """The handle's workflows, with those registered before it opened."""
        workflows = workflows_of(await self._link.sync())
        while self._pending:
            name, max_attempts, lease, fn = self._pending.pop(0)
            workflows.register(name, max_attempts, lease)(fn)
        return workflows

    async def start(self, workflow: str, input: Any, run_id: str | None) -> AsyncRunHandle:  # noqa: A002 - the spec's name
        workflows = await self._workflows()
        handle = await self._link.run(workflows.start, workflow, input, run_id)
        return AsyncRunHandle(self._link, handle)

    async def run(self, run_id: str) -> AsyncRunHandle:
        workflows = await self._workflows()
        return AsyncRunHandle(self._link, await self._link.run(workflows.handle, run_id))

    async def serve(self, names: list[str] | None, concurrency: int) -> AsyncWorkers:
        await self._workflows()
        state = await self._link.sync()
        return AsyncWorkers(self._link, await self._link.run(state.serve, names, concurrency))

    async def send(self, run_id: str, topic: str, message: Any) -> None:
        workflows = await self._workflows()
        await self._link.run(workflows.send, run_id, topic, message)

    async def cancel(self, run_id: str) -> bool:
        workflows = await self._workflows()
        return bool(await self._link.run(workflows.cancel, run_id))

    async def runs(self, workflow: str, status: str | None) -> list[RunInfo]:
        workflows = await self._workflows()
        return await self._link.run(workflows.runs, workflow, status)

    async def run_info(self, run_id: str) -> RunInfo:
        workflows = await self._workflows()
        return await self._link.run(workflows.run_info, run_id)
