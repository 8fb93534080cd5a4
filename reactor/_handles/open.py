"""``reactor.open``: the way in."""

from __future__ import annotations

import os

from reactor._base.clock import Clock
from reactor._base.codecs import Codec, check_codec
from reactor._engine.options import Durability

from .registry import acquire_engine
from .state import State

__all__ = ["open"]


def open(  # noqa: A001 - reactor.open is the name users expect, as with io.open
    target: str | os.PathLike[str] | None = None,
    *,
    durability: Durability | None = None,
    max_value_bytes: int | None = None,
    max_depth: int | None = None,
    max_actors: int | None = None,
    log_retention: int | None = None,
    log_retention_seconds: float | None = None,
    sweep_interval: float | None = None,
    clock: Clock | None = None,
    timeout: float | None = None,
    readonly: bool | None = None,
    codec: Codec | None = None,
) -> State:
    """Open a database and return a handle to its engine.

    ``target``: a file path (created, with its folder, if missing), ``":memory:"``
    (private), ``":memory:NAME"`` (shared in this process by that name), a database
    URL; None: ``$REACTOR_DB``, else ``~/.reactor/state.db``.

    Options (keyword-only, None for the default): ``durability`` (``"normal"``,
    ``"full"``, ``"memory"``), ``max_value_bytes`` (16 MiB), ``max_depth`` (64),
    ``max_actors`` (64), ``log_retention`` (100,000 events), ``log_retention_seconds``
    (none), ``sweep_interval`` (0.25 s: how often the background upkeep expires keys,
    turns back run-out leases and compacts the log; 0.01 to 1,000,000; timers fire at
    their due time whatever it is), ``clock`` (an object with ``time()``), ``timeout``
    (30 s: how long a verb waits for its scope's actor, and for another process's lock
    on the database), ``readonly`` (False), ``codec`` (None: strict JSON; this
    handle's, see ``reactor.codecs``). ``readonly=True`` reads a database that this
    process may read but not write: it never creates, migrates or changes the database
    (nor makes its ``-wal`` and ``-shm`` files), every write raises ``ReadOnlyError``,
    and so does a durable subscription (it stores its position); expired keys are
    hidden but not swept. Subscriptions and watches still see every other process's
    changes. The file (and its folder) needs no write access. Read-write, a file this
    process may not write is refused. Handles to one database share one engine; a
    later ``open``'s options must match.

    Raises:
        InvalidArgumentError: an option out of range, or in conflict with the engine's.
        SchemaError: the database comes from a newer version of reactor.
        ReadOnlyError: read-write, the database cannot be written by this process;
            read-only, it cannot be read without a write first (it does not exist, is
            empty, or needs a migration or recovery).
        StorageError: the database could not be opened.
    """
    checked = check_codec(codec)
    options = {
        "durability": durability,
        "max_value_bytes": max_value_bytes,
        "max_depth": max_depth,
        "max_actors": max_actors,
        "log_retention": log_retention,
        "log_retention_seconds": log_retention_seconds,
        "sweep_interval": sweep_interval,
        "clock": clock,
        "timeout": timeout,
        "readonly": readonly,
    }
    return State(acquire_engine(target, options), checked)
