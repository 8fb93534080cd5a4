"""Counters and latency samples behind ``state.stats()``."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any, Final

__all__ = ["Stats"]

_SAMPLES: Final = 2048  # latencies kept per verb: the most recent ones
EVENT_COUNTERS: Final = ("published", "delivered", "failed", "dropped")


class Stats:
    """Thread-safe counters: operations and latency by verb, events, expired keys."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._operations: Counter[str] = Counter()
        self._latency: dict[str, deque[float]] = {}
        self._counters: Counter[str] = Counter()

    def record(self, verb: str, seconds: float) -> None:
        """Count one call of ``verb`` that took ``seconds``."""
        with self._lock:
            self._operations[verb] += 1
            samples = self._latency.get(verb)
            if samples is None:
                samples = self._latency[verb] = deque(maxlen=_SAMPLES)
            samples.append(seconds)

    def count(self, name: str, amount: int = 1) -> None:
        """Add to a named counter (``keys_expired``, ``events_published``, ...)."""
        with self._lock:
            self._counters[name] += amount

    def snapshot(self) -> dict[str, Any]:
        """Operations by verb, named counters, and latency percentiles in milliseconds."""
        with self._lock:
            operations = dict(self._operations)
            counters = dict(self._counters)
            samples = {verb: sorted(values) for verb, values in self._latency.items()}
        latency = {
            verb: {
                "p50": _percentile(values, 0.50) * 1000,
                "p90": _percentile(values, 0.90) * 1000,
                "p99": _percentile(values, 0.99) * 1000,
                "samples": len(values),
            }
            for verb, values in sorted(samples.items())
        }
        return {"operations": operations, "counters": counters, "latency_ms": latency}


def _percentile(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))
    return ordered[index]
