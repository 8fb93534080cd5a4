"""``state.stats()``: the counters and latency samples an engine keeps (``Stats``), and
the report assembled from them and the store (``engine_stats``)."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Stats", "engine_stats"]

_SAMPLES: Final = 2048  # latencies kept per verb: the most recent ones
EVENT_COUNTERS: Final = ("published", "delivered", "failed", "dropped")


class Stats:
    """Thread-safe counters: operations and latency by verb, events, expired keys.

    ``record`` runs on every verb, so it takes no lock: each thread counts calls in a
    tally of its own (summed when asked), and ``deque.append`` is atomic.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._tallies: list[Counter[str]] = []
        self._latency: dict[str, deque[float]] = {}
        self._counters: Counter[str] = Counter()

    def record(self, verb: str, seconds: float) -> None:
        """Count one call of ``verb`` that took ``seconds``."""
        try:
            tally: Counter[str] = self._local.tally
        except AttributeError:
            tally = self._local.tally = Counter()
            with self._lock:
                self._tallies.append(tally)
        tally[verb] += 1
        samples = self._latency.get(verb)
        if samples is None:
            samples = self._latency.setdefault(verb, deque(maxlen=_SAMPLES))
        samples.append(seconds)

    def count(self, name: str, amount: int = 1) -> None:
        """Add to a named counter (``keys_expired``, ``events_published``, ...)."""
        with self._lock:
            self._counters[name] += amount

    def snapshot(self) -> dict[str, Any]:
        """Operations by verb, named counters, and latency percentiles in milliseconds."""
        with self._lock:
            counters = dict(self._counters)
            tallies = list(self._tallies)
        operations: Counter[str] = Counter()
        for tally in tallies:
            operations.update(dict(tally))
        samples = {verb: sorted(values.copy()) for verb, values in list(self._latency.items())}
        latency = {
            verb: {
                "p50": _percentile(values, 0.50) * 1000,
                "p90": _percentile(values, 0.90) * 1000,
                "p99": _percentile(values, 0.99) * 1000,
                "samples": len(values),
            }
            for verb, values in sorted(samples.items())
        }
        return {"operations": dict(operations), "counters": counters, "latency_ms": latency}


def engine_stats(engine: Engine) -> dict[str, Any]:
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


def _percentile(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))
    return ordered[index]
