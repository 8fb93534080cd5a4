"""The counters and latency samples an engine keeps (``Stats``), for ``state.stats()``."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any, Final, NamedTuple

__all__ = ["EVENT_COUNTERS", "TIMED_EVERY", "TIMED_FIRST", "Stats", "UpkeepProgress"]

_SAMPLES: Final = 2048  # latencies kept per verb: the most recent ones
TIMED_FIRST: Final = 64  # calls of a verb each thread times, before it samples
TIMED_EVERY: Final = 8  # then one call in this many is timed
EVENT_COUNTERS: Final = ("published", "delivered", "failed", "dropped")


class UpkeepProgress(NamedTuple):
    """How the background upkeep is getting on (``stats()["upkeep"]``, health checks)."""

    rounds: int  # rounds of chores done, failed ones too
    last_round: float | None  # when the last one ended (time.monotonic)
    failing: int  # rounds that failed in a row, up to now
    running: bool  # whether its thread runs
    busy_since: float | None = None  # when the chore under way began (None: between)
    failing_since: float | None = None  # when the first round failing in a row failed
    last_error: str | None = None  # why the last round that failed did


class Stats:
    """Thread-safe counters: operations and latency by verb, events, expired keys.

    ``timing`` runs on every verb, so it takes no lock: each thread counts calls in a
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
        self._tally()[verb] += 1
        self.sample(verb, seconds)

    def timing(self, verb: str) -> bool:
        """Count one call of ``verb``; whether to time it (then ``sample`` its time).

        Each thread times its first ``TIMED_FIRST`` calls of a verb, then one in
        ``TIMED_EVERY``: two clock reads and a sample cost a fast read more than a
        tenth of its time, and percentiles need a sample, not every call.
        """
        try:
            tally: Counter[str] = self._local.tally
        except AttributeError:
            tally = self._tally()
        count = tally[verb] = tally[verb] + 1
        return count <= TIMED_FIRST or not count % TIMED_EVERY

    def sample(self, verb: str, seconds: float) -> None:
        """Keep ``seconds``, the time a call of ``verb`` took (``deque.append`` is
        atomic)."""
        try:
            samples = self._latency[verb]  # a subscript, not a call: no dict.get
        except KeyError:
            samples = self._latency.setdefault(verb, deque(maxlen=_SAMPLES))
        samples.append(seconds)

    def _tally(self) -> Counter[str]:
        """This thread's counts of calls by verb."""
        try:
            tally: Counter[str] = self._local.tally
        except AttributeError:
            tally = self._local.tally = Counter()
            with self._lock:
                self._tallies.append(tally)
        return tally

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


def _percentile(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))
    return ordered[index]
