"""``state.stats()``: the report assembled from an engine's ``Stats`` and its store."""

from __future__ import annotations

from typing import Any

from .port import EnginePort
from .stats import EVENT_COUNTERS

__all__ = ["engine_stats"]


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
        "revision": revision,
    }
