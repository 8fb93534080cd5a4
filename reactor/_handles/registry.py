"""The engines of this process: one per database, shared by every handle ``open()``
returns, started with the first handle and closed with the last (or at exit).

A database's engine is in ``_engines`` while it runs. While one thread starts it, its
key is in ``_opening`` (other threads wait for it). Once its last handle has closed, it
is in ``_closing`` until its ``close()`` returns: a new engine for the key waits for
that (within the timeout), so that one database does not get two sets of actors, nor a
durable subscriber two deliverers, in one process.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reactor._engine.engine import Engine
from reactor._engine.options import Options
from reactor._storage.locate import default_folder, leave_if_moved, locate
from reactor._work.sweeper import Sweeper
from reactor.errors import BusyError, InvalidArgumentError, StorageError

if TYPE_CHECKING:  # SQLAlchemy is imported when used: only for PostgreSQL
    import sqlalchemy as sa

__all__ = ["acquire_engine", "release_engine"]

logger = logging.getLogger("reactor")


@dataclass(eq=False)
class _Closing:
    engine: Engine
    thread: int  # the thread closing it: it must not wait for itself
    done: threading.Event = field(default_factory=threading.Event)


_engines: dict[str, Engine] = {}
_opening: dict[str, threading.Event] = {}
_closing: dict[str, _Closing] = {}
_lock = threading.Lock()
_live_engines: weakref.WeakSet[Engine] = weakref.WeakSet()  # closed at exit


def acquire_engine(target: str | os.PathLike[str] | None, asked: dict[str, Any]) -> Engine:
    """The engine for ``target``, started if need be, with one more handle attached
    (``asked``: the options of ``open``, None for the default).

    An engine whose last handle is closing is never joined: this waits for it to
    finish closing (within the timeout) and starts another. Engines start outside the
    registry's lock: opening one database does not hold up opening or closing others.

    Raises:
        InvalidArgumentError: an option is out of range, or differs from the options the
            running engine for this database was opened with; ``readonly`` in memory.
        StorageError: the database cannot be opened (or its folder made); for
            ``ReadOnlyError``, see ``reactor.open``.
        BusyError: another thread of this process kept starting it past the timeout.
    """
    given = {name: value for name, value in asked.items() if value is not None}
    options = Options(**given)
    key, location = locate(target, options.durability)
    if options.readonly and location is None:
        raise InvalidArgumentError(
            "readonly=True needs a database file or PostgreSQL: a database in memory "
            "starts empty, and only its own handles write it"
        )
    if key is None:  # private: nobody to share it with
        private = _start(f"memory#{id(options)}", location, options)
        private.attach()
        return private
    deadline = time.monotonic() + options.timeout
    while True:
        with _lock:
            engine = _engines.get(key)
            if engine is not None and _usable(engine):
                _check_options(target, engine, given)
                if engine.attach():
                    return engine
            wait = _opening.get(key)
            closing = _closing.get(key)
            if wait is None and closing is not None and closing.thread != threading.get_ident():
                wait = closing.done
            if wait is None or time.monotonic() >= deadline:
                if wait is not None and key in _opening:
                    raise BusyError(
                        f"another thread kept opening {target!s} for more than {options.timeout} s"
                    )
                started = _opening[key] = threading.Event()
                break
        wait.wait(max(0.0, deadline - time.monotonic()))
    engine = None
    try:
        engine = _start(key, location, options)
    finally:
        with _lock:
            del _opening[key]
            if engine is not None:  # (None: it failed)
                _engines[key] = engine
                engine.attach()
        started.set()
    return engine


def release_engine(engine: Engine) -> None:
    """Forget one handle of ``engine``; the last one closes it.

    The count and the registry change together, under the registry's lock: an
    ``open()`` either joins this engine before its last handle goes, or finds it gone
    from the registry and starts another once this one has closed
    (``acquire_engine``); never one that is closing.
    """
    with _lock:
        if not engine.detach():
            return
        if _engines.get(engine.key) is engine:
            del _engines[engine.key]
        closing = _Closing(engine, threading.get_ident())
        _closing[engine.key] = closing
    try:
        engine.close()
    finally:
        with _lock:
            if _closing.get(engine.key) is closing:
                del _closing[engine.key]
        closing.done.set()


def _check_options(target: object, engine: Engine, given: dict[str, Any]) -> None:
    for item in fields(Options):
        if item.name in given and getattr(engine.options, item.name) != given[item.name]:
            raise InvalidArgumentError(
                f"{target!s} is already open in this process with "
                f"{item.name}={getattr(engine.options, item.name)!r}"
            )


def _usable(engine: Engine) -> bool:
    """Whether a registered engine can take another handle: not closed, and (SQLite)
    its file still at its path. An engine whose file was removed or replaced fails
    every write; a new ``open()`` gets a new engine on what is there now, and the old
    engine's WAL is taken off the path first, or the new one would read it."""
    if engine.closed:
        return False
    return not leave_if_moved(engine.store)


def _start(key: str, location: Path | sa.URL | None, options: Options) -> Engine:
    """A new engine (the default folder made private first), closed at exit unless
    closed before.

    Raises:
        StorageError: the folder cannot be made, or the database opened.
    """
    if isinstance(location, Path) and location.parent == default_folder():
        try:
            location.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the folder of {location}: {exc}") from exc
    engine = Engine(key, location, options, on_close=_forget)
    if not options.readonly:  # it expires keys and compacts the log: writes
        sweeper = Sweeper(engine)
        engine.sweeper = sweeper
        sweeper.start()
    _live_engines.add(engine)
    return engine


def _forget(engine: Engine) -> None:
    """Take a closing engine out of the registry (its ``on_close``)."""
    with _lock:
        if _engines.get(engine.key) is engine:
            del _engines[engine.key]
        _live_engines.discard(engine)


@atexit.register
def _close_all() -> None:
    for engine in list(_live_engines):
        try:
            engine.close()
        except Exception:
            logger.exception("closing %s at exit failed", engine.key)
