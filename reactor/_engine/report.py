"""``state.stats()``: the report assembled from an engine's ``Stats`` and its store."""

from __future__ import annotations

import time
from typing import Any

from .port import EnginePort
from .stats import EVENT_COUNTERS

__all__ = ["engine_stats", "upkeep_progress", "upkeep_report"]


def engine_stats(engine: EnginePort) -> dict[str, Any]:
    """What ``state.stats()`` returns: keys per scope, operations and latency by verb,
    events, expiry, locks, actors, durable subscribers' lag, size and revision."""
    store = engine.store
    counts = store.counts(engine.now())
    revision = store.revision()
    recorded = engine.stats.snapshot()
    counters = recorded["counters"]
    return {
        "database": store.location,
        "database_bytes": store.size_bytes(),
        "scopes": counts,
        "keys": sum(counts.values()),
        "operations": recorded["operations"],
        "transactions": store.commits,
        "events": {name: counters.get(f"events_{name}", 0) for name in EVENT_COUNTERS},
        "keys_expired": counters.get("keys_expired", 0),
        "locks_held": store.locks_held(engine.now()),
        "timers": {
            "pending": store.timers_pending(),
            "fired": counters.get("timers_fired", 0),
            "failed": counters.get("timers_failed", 0),
        },
        "actors": engine.actors(),
        "latency_ms": recorded["latency_ms"],
        "durable_subscribers": {
            name: {
                "position": position,
                "lag": max(0, revision - position),
                "delivered": delivered,
                "failed": failed,
            }
            for name, (position, delivered, failed) in store.subscribers().items()
        },
        "upkeep": upkeep_report(engine),
        "revision": revision,
    }


def upkeep_report(engine: EnginePort) -> dict[str, Any]:
    """How the upkeep is getting on: ``overdue``, the seconds the oldest work due and not
    done yet has waited (a key past its deadline, a due timer, a lease run out; 0.0 when
    none: the database's, whoever does it); then this engine's: its ``rounds`` of chores,
    the seconds since the last one ended (``last_round_age``, None before the first) and
    since the chore under way began (``busy_for``, None between chores), the rounds
    ``failing`` in a row, for how long (``failing_for``) and why the last one did
    (``last_error``), and whether its thread is ``running`` (False and the rest zero or
    None on a read-only engine, which has none)."""
    now = engine.now()
    oldest = engine.store.overdue(now)
    overdue = 0.0 if oldest is None else round(max(0.0, now - oldest), 3)
    return {"overdue": overdue, **upkeep_progress(engine)}


def upkeep_progress(engine: EnginePort) -> dict[str, Any]:
    """``upkeep_report`` but ``overdue``: this engine's upkeep, read from memory."""
    progress = engine.upkeep_progress()
    if progress is None:
        return {
            "rounds": 0,
            "last_round_age": None,
            "busy_for": None,
            "failing": 0,
            "failing_for": None,
            "last_error": None,
            "running": False,
        }
    return {
        "rounds": progress.rounds,
        "last_round_age": _age(progress.last_round),
        "busy_for": _age(progress.busy_since),
        "failing": progress.failing,
        "failing_for": _age(progress.failing_since),
        "last_error": progress.last_error,
        "running": progress.running,
    }


def _age(since: float | None) -> float | None:
    """Seconds since ``since`` (``time.monotonic``), or None."""
    return None if since is None else round(max(0.0, time.monotonic() - since), 3)
