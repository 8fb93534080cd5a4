"""The figures both exporters report: this process's, from memory, and the database's,
read from it; None once the handle is closed."""

from __future__ import annotations

from typing import Any

from reactor._engine.port import EnginePort
from reactor._engine.stats import EVENT_COUNTERS
from reactor._handles.binding import engine_of
from reactor._handles.figures import database_figures
from reactor.errors import ClosedError

__all__ = ["QUANTILES", "open_engine", "process_figures", "read"]

QUANTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"))


def open_engine(state: object) -> EnginePort | None:
    """The engine of the handle ``state`` (None: closed)."""
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
