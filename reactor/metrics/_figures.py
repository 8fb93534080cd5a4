"""The figures both exporters report: this process's, from memory, and the database's,
read from it; None once the handle is closed."""

from __future__ import annotations

from typing import Any

from reactor._engine.port import EnginePort
from reactor._engine.stats import EVENT_COUNTERS
from reactor._handles.binding import engine_of
from reactor._handles.figures import database_figures
from reactor.errors import ClosedError

__all__ = ["QUANTILES", "check_handle", "open_engine", "process_figures", "read"]

QUANTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"))


def check_handle(handle: object) -> None:
    """
    Raises:
        ClosedError: ``handle`` is closed.
        TypeError: ``handle`` is neither a ``State`` nor a ``reactor.aio.AsyncState``.
    """
    try:
        engine_of(handle)
    except TypeError:
        from reactor.aio.state import AsyncState

        if not isinstance(handle, AsyncState):
            raise
        if handle.closed:  # not open yet is not closed: its first use opens it
            raise ClosedError("this reactor handle is closed") from None


def _sync_handle(handle: object) -> object | None:
    """``handle``, or the ``State`` of the ``AsyncState`` ``handle`` (None: not open
    yet, or closed).

    Raises:
        TypeError: ``handle`` is neither.
    """
    try:
        engine_of(handle)
    except ClosedError:
        return None
    except TypeError:
        # Imported here: only a program that made an AsyncState has imported it.
        from reactor.aio.state import AsyncState, link_of

        if not isinstance(handle, AsyncState):
            raise
        if handle.closed:
            return None
        return link_of(handle).state  # None until its first use opens it
    return handle


def open_engine(handle: object) -> EnginePort | None:
    """The engine of ``handle``, a ``State`` or an ``AsyncState`` (None: closed, or not
    open yet)."""
    state = _sync_handle(handle)
    if state is None:
        return None
    try:
        engine = engine_of(state)
    except ClosedError:
        return None
    return None if engine.closed else engine


def process_figures(engine: EnginePort) -> dict[str, Any]:
    """This process's counters, from memory: ``operations`` and ``latency`` (seconds, by
    quantile) by verb, ``transactions``, ``events`` by outcome, ``keys_expired``,
    ``timers_fired``, ``timers_failed``, ``actors``, and the upkeep's ``upkeep_rounds``,
    ``upkeep_failing`` (rounds failing in a row) and ``upkeep_running``."""
    recorded = engine.stats.snapshot()
    counters = recorded["counters"]
    progress = engine.upkeep_progress()
    return {
        "operations": recorded["operations"],
        "latency": {
            verb: {quantile: figures[key] / 1000 for key, quantile in QUANTILES}
            for verb, figures in recorded["latency_ms"].items()
        },
        "transactions": engine.store.commits,
        "events": {name: counters.get(f"events_{name}", 0) for name in EVENT_COUNTERS},
        "keys_expired": counters.get("keys_expired", 0),
        "timers_fired": counters.get("timers_fired", 0),
        "timers_failed": counters.get("timers_failed", 0),
        "actors": engine.actors(),
        "upkeep_rounds": 0 if progress is None else progress.rounds,
        "upkeep_failing": 0 if progress is None else progress.failing,
        "upkeep_running": progress is not None and progress.running,
    }


def read(
    state: object, *, database: bool, process: bool
) -> tuple[dict[str, Any] | None, dict[str, Any] | None] | None:
    """(this process's figures, the database's), each None unless asked; None: the
    handle is closed."""
    engine = open_engine(state)
    if engine is None:
        return None
    try:
        return (
            process_figures(engine) if process else None,
            database_figures(engine) if database else None,
        )
    except ClosedError:
        return None
