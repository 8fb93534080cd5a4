"""``State``: the handle ``reactor.open()`` returns."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from ._engine import Engine
from ._locks import Lock
from ._scope import Scope
from .errors import ClosedError

__all__ = ["State"]


class State:
    """A handle to an engine: scopes, and what spans them.

    Handles to the same database in one process share one engine, which stops when its
    last handle closes. Use it as a context manager, or call `close()`.
    """

    location: str
    """Where the database is: a file path, or ``":memory:"``."""

    def __init__(self, engine: Engine) -> None:
        self._engine: Engine | None = engine
        self._lock = threading.Lock()
        self.location: str = engine.store.location

    def __repr__(self) -> str:
        status = "closed" if self._engine is None else "open"
        return f"<reactor.State {self.location!r} ({status})>"

    def _engine_or_raise(self) -> Engine:
        engine = self._engine
        if engine is None or engine.closed:
            raise ClosedError("this reactor handle is closed")
        return engine

    @property
    def closed(self) -> bool:
        """Whether this handle is closed."""
        return self._engine is None or self._engine.closed

    def scope(self, name: str) -> Scope:
        """The handle to scope ``name`` (created when first written).

        Raises:
            InvalidKeyError: ``name`` is not a valid scope name.
        """
        self._engine_or_raise()
        return Scope(self, name)

    def scopes(self) -> list[str]:
        """The names of the scopes that hold at least one live key, sorted."""
        engine = self._engine_or_raise()
        return engine.store.scopes(engine.now())

    def lock(self, name: str, ttl: float, timeout: float | None = None) -> Lock:
        """A lease on ``name`` for ``ttl`` seconds, shared by every process on this
        database; ``timeout`` is how long ``with`` waits to acquire it.

        Raises:
            InvalidKeyError: ``name`` is not a valid name.
            InvalidArgumentError: ``ttl`` is not a number > 0.
        """
        self._engine_or_raise()
        return Lock(self, name, ttl, timeout)

    def stats(self) -> dict[str, Any]:
        """Keys per scope, operations and latency by verb, events, expiry, size."""
        return self._engine_or_raise().stats_snapshot()

    def close(self) -> None:
        """Close this handle; the last handle of an engine stops its actors and threads
        and releases the database. Idempotent."""
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.detach()

    def __enter__(self) -> State:
        self._engine_or_raise()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
