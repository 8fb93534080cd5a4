"""The workflow primitives under load (SPEC §13): how late timers fire when many are
pending (the work queue against its peers: ``queues``).

Each measurement opens its own database at ``target`` (a file path or a PostgreSQL URL)
and returns plain figures; ``reactor bench`` runs them on a fresh database each.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

__all__ = ["timer_lag"]

_SCHEDULE_BATCH = 5000  # far timers scheduled per transaction


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def timer_lag(target: str, pending: int, probes: int) -> dict[str, Any]:
    """Schedule ``pending`` timers far in the future (in transactions of 5,000), then
    ``probes`` timers due over the next seconds, 10 ms apart; how late each fires, from
    its due time to its event reaching a subscriber of this process."""
    import reactor

    with reactor.open(target, log_retention=max(100_000, 2 * probes)) as state:
        far = state.scope("bench-far")
        start = time.perf_counter()
        later = time.time() + 365 * 24 * 3600
        for first in range(0, pending, _SCHEDULE_BATCH):
            with far.transaction() as tx:
                for n in range(first, min(pending, first + _SCHEDULE_BATCH)):
                    tx.schedule(f"k{n}", n, at=later + n)
        scheduled = time.perf_counter() - start
        arrived: dict[str, float] = {}
        done = threading.Event()

        def on_fired(event: reactor.ChangeEvent) -> None:
            if event.timer is not None:
                arrived[event.timer] = time.time()
                if len(arrived) >= probes:
                    done.set()

        subscription = state.subscribe(on_fired, scope="bench-probe")
        probe = state.scope("bench-probe")
        begin = time.time() + 1.0
        due: dict[str, float] = {}
        for n in range(probes):
            at = begin + n * 0.01
            due[probe.schedule(f"p{n}", n, at=at).id] = at
        done.wait(timeout=begin - time.time() + probes * 0.01 + 30)
        subscription.close()
        lags = sorted((arrived[timer] - at) * 1000 for timer, at in due.items() if timer in arrived)
        pending_now = state.stats()["timers"]["pending"]
    return {
        "pending": pending,
        "pending_after": pending_now,
        "probes": probes,
        "fired": len(lags),
        "schedule_per_s": pending / scheduled if scheduled else None,
        "lag_p50_ms": statistics.median(lags) if lags else None,
        "lag_p99_ms": _percentile(lags, 0.99) if lags else None,
        "lag_max_ms": lags[-1] if lags else None,
    }


# -- work queues ------------------------------------------------------------------------
