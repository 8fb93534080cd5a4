"""``state.stats()``: the report assembled from an engine's ``Stats`` and its store."""

from __future__ import annotations

import time
from typing import Any

from .port import EnginePort
from .stats import EVENT_COUNTERS

__all__ = ["engine_stats", "upkeep_report"]


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
    none: the database's, whoever does it); this engine's ``rounds`` of chores, the
    seconds since the last one ended (``last_round_age``, None before the first), the
    rounds ``failing`` in a row, and whether its thread is ``running`` (False and the
    rest zero or None on a read-only engine, which has none)."""
    now = engine.now()
    oldest = engine.store.overdue(now)
    progress = engine.upkeep_progress()
    last = None if progress is None else progress.last_round
    return {
        "overdue": 0.0 if oldest is None else round(max(0.0, now - oldest), 3),
        "rounds": 0 if progress is None else progress.rounds,
        "last_round_age": None if last is None else round(time.monotonic() - last, 3),
        "failing": 0 if progress is None else progress.failing,
        "running": progress is not None and progress.running,
    }
