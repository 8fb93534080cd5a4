"""``reactor.metrics.register``: a Prometheus collector of a handle's figures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reactor._handles.figures import QUEUE_STATES

from ._figures import QUANTILES, read

__all__ = ["ReactorCollector"]


class ReactorCollector(Collector):
    """The figures of one handle, read afresh at each scrape (nothing once it is
    closed): this process's if ``process``, the database's if ``database``."""

    def __init__(self, state: object, *, database: bool, process: bool) -> None:
        self._state = state
        self._database = database
        self._process = process

    def collect(self) -> Iterator[Metric]:
        found = read(self._state, database=self._database, process=self._process)
        if found is None:
            return
        mine, shared = found
        if mine is not None:
            yield from _process_metrics(mine)
        if shared is not None:
            yield from _database_metrics(shared)

    def describe(self) -> Iterator[Metric]:
        """The families' names, without reading anything (for the registry's check of
        duplicate names at ``register``)."""
        if self._process:
            yield from _process_metrics(_NO_PROCESS)
        if self._database:
            yield from _database_metrics(_NO_DATABASE)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=value)


def _gauge(name: str, text: str, value: float, unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value, unit=unit)


def _process_metrics(figures: dict[str, Any]) -> Iterator[Metric]:
    operations = CounterMetricFamily(
        "reactor_operations", "Calls of each verb in this process.", labels=["verb"]
    )
    for verb, count in sorted(figures["operations"].items()):
        operations.add_metric([verb], count)
    yield operations
    latency = GaugeMetricFamily(
        "reactor_operation_latency_seconds",
        "Latency of each verb in this process: a quantile of its recent timed calls.",
        labels=["verb", "quantile"],
    )
    for verb, quantiles in sorted(figures["latency"].items()):
        for _, quantile in QUANTILES:
            latency.add_metric([verb, quantile], quantiles[quantile])
    yield latency
    events = CounterMetricFamily(
        "reactor_events", "Change events of this process, by outcome.", labels=["outcome"]
    )
    for outcome, count in figures["events"].items():
        events.add_metric([outcome], count)
    yield events
    yield _counter(
        "reactor_transactions",
        "Write transactions this process committed.",
        figures["transactions"],
    )
    yield _counter("reactor_keys_expired", "Keys this process expired.", figures["keys_expired"])
    yield _counter("reactor_timers_fired", "Timers this process fired.", figures["timers_fired"])
    yield _counter(
        "reactor_timers_failed", "Timers that failed in this process.", figures["timers_failed"]
    )
    yield _gauge("reactor_actors", "Scope actors started in this process.", figures["actors"])
    yield _counter(
        "reactor_upkeep_rounds", "Rounds of upkeep this process did.", figures["upkeep_rounds"]
    )
    yield _gauge(
        "reactor_upkeep_failing",
        "Rounds of this process's upkeep that failed in a row, up to now.",
        figures["upkeep_failing"],
    )
    yield _gauge(
        "reactor_upkeep_running",
        "1 if this process's upkeep thread runs (0: read-only, or stopped).",
        int(figures["upkeep_running"]),
    )


def _database_metrics(figures: dict[str, Any]) -> Iterator[Metric]:
    yield _gauge("reactor_db_keys", "Live keys in the database.", figures["keys"])
    scopes = GaugeMetricFamily(
        "reactor_db_scope_keys", "Live keys of each scope.", labels=["scope"]
    )
    for scope, count in figures["scopes"].items():
        scopes.add_metric([scope], count)
    yield scopes
    yield _gauge("reactor_db_revision", "The database's last revision.", figures["revision"])
    yield _gauge(
        "reactor_db_log_records", "Records the change log holds.", figures["log"]["records"]
    )
    yield _gauge("reactor_db_size", "The database's size.", figures["database_bytes"], "bytes")
    jobs = GaugeMetricFamily(
        "reactor_db_queue_jobs", "Jobs of each queue, by state.", labels=["queue", "state"]
    )
    for queue, states in figures["queues"].items():
        for state in QUEUE_STATES:
            jobs.add_metric([queue, state], states[state])
    yield jobs
    timers = figures["timers"]
    yield _gauge("reactor_db_timers", "Pending timers.", timers["pending"])
    yield _gauge(
        "reactor_db_timer_lag",
        "How long the oldest due timer has waited.",
        timers["lag"],
        "seconds",
    )
    yield _gauge("reactor_db_locks_held", "Locks held.", figures["locks_held"])
    yield _gauge(
        "reactor_db_overdue",
        "How long the oldest due upkeep work (an expired key, a due timer, a lease run out) "
        "has waited.",
        figures["overdue"],
        "seconds",
    )
    yield from _subscriber_metrics(figures["durable_subscribers"])


def _subscriber_metrics(subscribers: dict[str, dict[str, int]]) -> Iterator[Metric]:
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "position": GaugeMetricFamily(
            "reactor_db_subscriber_position",
            "The last revision each durable subscriber acknowledged.",
            labels=["subscriber"],
        ),
        "lag": GaugeMetricFamily(
            "reactor_db_subscriber_lag",
            "Revisions each durable subscriber is behind the change log.",
            labels=["subscriber"],
        ),
        "delivered": CounterMetricFamily(
            "reactor_db_subscriber_delivered",
            "Events each durable subscriber handled.",
            labels=["subscriber"],
        ),
        "failed": CounterMetricFamily(
            "reactor_db_subscriber_failed",
            "Events each durable subscriber failed to handle.",
            labels=["subscriber"],
        ),
    }
    for name, figures in subscribers.items():
        for figure, family in families.items():
            family.add_metric([name], figures[figure])
    yield from families.values()


_NO_PROCESS: dict[str, Any] = {
    "operations": {},
    "latency": {},
    "events": {},
    **dict.fromkeys(
        (
            "transactions",
            "keys_expired",
            "timers_fired",
            "timers_failed",
            "actors",
            "upkeep_rounds",
            "upkeep_failing",
            "upkeep_running",
        ),
        0,
    ),
}
_NO_DATABASE: dict[str, Any] = {
    "keys": 0,
    "scopes": {},
    "revision": 0,
    "log": {"records": 0},
    "database_bytes": 0,
    "queues": {},
    "timers": {"pending": 0, "lag": 0.0},
    "locks_held": 0,
    "overdue": 0.0,
    "durable_subscribers": {},
}
