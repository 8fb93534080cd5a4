"""``EnginePort``: what the layers above may use of an engine.

Features — the work layer's chores, the handles, ``reactor.aio``, the backup — are
written against this protocol, not the concrete ``Engine``: reading it tells a newcomer
everything a feature may touch. Writes go through its door (``write``, ``submit``,
``hold``/``release``, ``commit``), which publishes every commit; changes are heard
through its ``hub``; reads go to its ``store`` (never its ``write``: see
``tests/test_layers.py``). Only the registry, which builds engines, knows the class.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol, TypeVar

from reactor._base.results import Upkeep
from reactor._storage.store import StoreReads
from reactor._storage.txn import Work, WriteTxn

from .dispatch import Dispatcher
from .hub import Hub
from .mailbox import Reply
from .options import Options
from .reply import ThreadReply
from .stats import Stats, UpkeepProgress

__all__ = ["EnginePort"]

T = TypeVar("T")


class EnginePort(Protocol):
    """The engine of one database in this process, as features see it."""

    @property
    def key(self) -> str:
        """The database's identity in this process (its resolved path or URL)."""
        ...

    @property
    def options(self) -> Options: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def store(self) -> StoreReads:
        """For reads (``reader()``, ``get``, ``log_after``...): writes go by the door."""
        ...

    @property
    def hub(self) -> Hub: ...

    @property
    def dispatcher(self) -> Dispatcher:
        """For ``published`` and ``delivering()``; listeners join the ``hub``."""
        ...

    @property
    def closed(self) -> bool: ...

    @property
    def now(self) -> Callable[[], float]:
        """The clock: ``now()`` is the time in epoch seconds."""
        ...

    def encode(self, value: Any) -> str: ...

    # -- the door ------------------------------------------------------------------
    def write(self, scope: str, work: Work[T]) -> T: ...

    def submit(
        self,
        scope: str,
        work: Work[T],
        *,
        owner: object = None,
        scopes: tuple[str, ...] | None = None,
        alone: bool = False,
    ) -> ThreadReply[T]: ...

    def send(self, scope: str, work: Work[Any], reply: Reply) -> None:
        """``submit``, its outcome settled on ``reply`` rather than a new ``ThreadReply``."""
        ...

    def hold(self, scope: str, owner: object) -> ThreadReply[None]: ...

    def release(self, scope: str, owner: object) -> None: ...

    def moved(self, scope: str) -> float | None: ...

    def commit(
        self,
        work: Callable[[WriteTxn], T],
        *,
        scopes: Collection[str] | None = None,
        reads: Collection[tuple[str, str]] = (),
        combine: bool = False,
    ) -> T: ...

    def wait(self, scope: str, future: ThreadReply[T]) -> T: ...

    def reclaim(self) -> None:
        """Give back the writers' turn if this thread lost it to a Ctrl-C: before a
        wait on another thread's write."""
        ...

    def actors(self) -> int: ...

    def upkeep_progress(self) -> UpkeepProgress | None:
        """How the background upkeep is getting on (None: read-only, there is none)."""
        ...

    def upkeep(self, held: Collection[str] = ()) -> Upkeep:
        """Run the sweeper's chores once, now, in this thread (``reactor.testing``);
        ``held``: the scopes the caller's own transaction holds."""
        ...
