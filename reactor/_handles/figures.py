"""The database's figures, read from the database (``reactor.metrics.figures``, ``reactor
stats``): what every process sees alike, whoever wrote, unlike ``state.stats()``'s
counters of this process."""

from __future__ import annotations

from typing import Any

from reactor._engine.port import EnginePort

from .queues import counts as queue_counts

__all__ = ["QUEUE_STATES", "database_figures"]

QUEUE_STATES = ("ready", "delayed", "taken", "dead")


def database_figures(engine: EnginePort) -> dict[str, Any]:
    """Keys (in all, by scope), the change log's revisions, jobs by queue and state,
    timers and how late the oldest due one is, locks held, durable subscribers' lag, and
    how late the oldest due upkeep work is; each a read of a few index seeks (queues: a
    few per queue). A figure is as of its own read: they are not one snapshot."""
    store = engine.store
    now = engine.now()
    scopes = store.counts(now)
    revision = store.revision()
    span = store.log_span()
    first_timer = store.timers(1)
    timer_lag = max(0.0, now - first_timer[0].due) if first_timer else 0.0
    jobs = store.reader().jobs()
    queues = {}
    for name in sorted(jobs.queue_names()):
        found = queue_counts(jobs, name, now)[1]
        queues[name] = {state: found[state] for state in QUEUE_STATES}
    oldest = store.overdue(now)
    return {
        "database": store.location,
        "database_bytes": store.size_bytes(),
        "revision": revision,
        "keys": sum(scopes.values()),
        "scopes": dict(sorted(scopes.items())),
        "log": {
            "records": 0 if span is None else span[1] - span[0] + 1,
            "first": None if span is None else span[0],
            "last": None if span is None else span[1],
        },
        "queues": queues,
        "timers": {"pending": store.timers_pending(), "lag": round(timer_lag, 3)},
        "locks_held": store.locks_held(now),
        "durable_subscribers": {
            name: {
                "position": position,
                "lag": max(0, revision - position),
                "delivered": delivered,
                "failed": failed,
            }
            for name, (position, delivered, failed) in sorted(store.subscribers().items())
        },
        "overdue": 0.0 if oldest is None else round(max(0.0, now - oldest), 3),
    }
