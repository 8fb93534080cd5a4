"""The adapter every system ``reactor bench`` measures stands behind (``Peer``), and the
value and update they all store.

Every adapter takes a fresh directory (``location``) to keep its files in (reactor's
may instead be a PostgreSQL URL naming a fresh schema: see ``backends``) and has the
verbs ``set``, ``get``, ``increment``, ``update`` (three field changes to a stored
dict), ``delete``, plus ``count`` (read a counter), ``flush`` (commit pending work),
``acall`` (one verb from asyncio), ``transactions`` (how many it committed, where it
can tell), ``cleanup`` (remove what it stored outside ``location``) and ``close``.
Several adapters on one ``location``, in several processes, share the same data: that
is how the process workloads run.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, ClassVar

__all__ = ["UPDATE_NAME", "Peer", "apply_update", "make_value", "reactor_target"]

UPDATE_NAME = "order-updated"
_NOTE = "x" * 24


def make_value(i: int) -> dict[str, Any]:
    """The stored value: a dict of about 100 bytes as JSON."""
    return {
        "id": i,
        "name": f"order-{i % 100_000:05d}",
        "tags": ["a", "b", "c"],
        "total": 123.45,
        "paid": True,
        "note": _NOTE,
    }


def apply_update(value: dict[str, Any]) -> dict[str, Any]:
    """What ``update`` does, for peers without update ops: the same three changes as
    reactor's ``[increment("n"), set("name", ...), merge({"ok": False})]``."""
    value["n"] = value.get("n", 0) + 1
    value["name"] = UPDATE_NAME
    value.update({"ok": False})
    return value


class Peer:
    """One system under measurement. Subclasses fill in the verbs."""

    name: ClassVar[str]
    """Short name, used as the key in JSON and as a column heading."""
    in_memory: ClassVar[bool] = False
    """Whether its data lives in one process only (then no process workloads)."""
    notes: ClassVar[tuple[str, ...]] = ()
    """How it is driven, where that differs from the obvious."""
    aio: ClassVar[str] = "asyncio.to_thread"
    """How the asyncio workload drives it."""

    def __init__(self, location: str) -> None:
        self.location = location

    def set(self, key: str, value: dict[str, Any]) -> None:
        raise NotImplementedError

    def get(self, key: str) -> Any:
        raise NotImplementedError

    def increment(self, key: str) -> int:
        raise NotImplementedError

    def update(self, key: str) -> Any:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def count(self, key: str) -> int:
        """The counter at ``key``, as ``increment`` left it (0 when absent)."""
        raise NotImplementedError

    def flush(self) -> None:
        """Commit whatever this thread has pending (only batching peers have any)."""

    async def astart(self) -> None:
        """Prepare for ``acall`` on the running loop."""

    async def astop(self) -> None:
        """Undo ``astart``."""

    async def acall(self, verb: str, *args: Any) -> Any:
        """Run one verb from asyncio; by default in the loop's thread pool."""
        return await asyncio.to_thread(getattr(self, verb), *args)

    def transactions(self) -> int | None:
        """How many transactions it has committed since it opened (None: it cannot
        tell), for the writes per transaction of a phase."""
        return None

    def cleanup(self) -> None:
        """Remove what this peer stored outside its ``location`` (once, after a run)."""

    def close(self) -> None:
        raise NotImplementedError


def reactor_target(location: str) -> str:
    """What ``reactor.open`` is given for ``location``: a PostgreSQL URL as it is (a
    schema of its own), else a file in that directory."""
    return location if "://" in location else os.path.join(location, "reactor.db")
