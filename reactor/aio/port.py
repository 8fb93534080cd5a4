"""What the parts of ``reactor.aio`` (scopes, transactions, locks, queues, watches) may
use of the ``AsyncState`` they came from: a ``Protocol``, so that they need not import
the handle that imports them all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future

    from reactor._engine.port import EnginePort
    from reactor._handles.state import State

__all__ = ["Handle"]

T = TypeVar("T")


class Handle(Protocol):
    """An asyncio handle, as its parts see it (``AsyncState`` is the one)."""

    @property
    def closed(self) -> bool:
        """Whether the handle is closed (or its engine is)."""
        ...

    async def _sync(self) -> State:
        """The synchronous handle, opened on first use.

        Raises:
            ClosedError: the handle is closed.
        """
        ...

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in the handle's worker threads: a short blocking call."""
        ...

    def _answer(self, engine: EnginePort, scope: str, future: Future[T]) -> asyncio.Future[T]:
        """The answer of ``scope``'s actor to a request, awaited on the loop."""
        ...
