"""``reactor.metrics.instrument``: OpenTelemetry observable instruments of a handle's
figures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from reactor._handles.figures import QUEUE_STATES
from reactor._version import __version__

from ._figures import QUANTILES, read

__all__ = ["create_instruments"]

FRESH: Final = 1.0  # seconds the figures read for a collection may serve its other callbacks

Points = Callable[[dict[str, Any]], Iterable[tuple[float, dict[str, str]]]]
# (counter?, name, unit, description, the figures' points): this process's, then the database's
_PROCESS: Final[tuple[tuple[bool, str, str, str, Points], ...]] = (
    (True, "reactor.operations", "{call}", "Calls of each verb in this process.",
     lambda f: ((n, {"verb": verb}) for verb, n in f["operations"].items())),
    (False, "reactor.operation.latency", "s",
     "Latency of each verb in this process: a quantile of its recent timed calls.",
     lambda f: ((q[quantile], {"verb": verb, "quantile": quantile})
                for verb, q in f["latency"].items() for _, quantile in QUANTILES)),
    (True, "reactor.events", "{event}", "Change events of this process, by outcome.",
     lambda f: ((n, {"outcome": outcome}) for outcome, n in f["events"].items())),
    (True, "reactor.transactions", "{transaction}", "Write transactions this process committed.",
     lambda f: [(f["transactions"], {})]),
    (True, "reactor.keys.expired", "{key}", "Keys this process expired.",
     lambda f: [(f["keys_expired"], {})]),
    (True, "reactor.timers.fired", "{timer}", "Timers this process fired.",
     lambda f: [(f["timers_fired"], {})]),
    (True, "reactor.timers.failed", "{timer}", "Timers that failed in this process.",
     lambda f: [(f["timers_failed"], {})]),
    (False, "reactor.actors", "{actor}", "Scope actors started in this process.",
     lambda f: [(f["actors"], {})]),
    (True, "reactor.upkeep.rounds", "{round}", "Rounds of upkeep this process did.",
     lambda f: [(f["upkeep_rounds"], {})]),
    (False, "reactor.upkeep.failing", "{round}",
     "Rounds of this process's upkeep that failed in a row, up to now.",
     lambda f: [(f["upkeep_failing"], {})]),
    (False, "reactor.upkeep.running", "1", "1 if this process's upkeep thread runs.",
     lambda f: [(int(f["upkeep_running"]), {})]),
)  # fmt: skip
_DATABASE: Final[tuple[tuple[bool, str, str, str, Points], ...]] = (
    (False, "reactor.db.keys", "{key}", "Live keys in the database.",
     lambda f: [(f["keys"], {})]),
    (False, "reactor.db.scope.keys", "{key}", "Live keys of each scope.",
     lambda f: ((n, {"scope": scope}) for scope, n in f["scopes"].items())),
    (False, "reactor.db.revision", "1", "The database's last revision.",
     lambda f: [(f["revision"], {})]),
    (False, "reactor.db.log.records", "{record}", "Records the change log holds.",
     lambda f: [(f["log"]["records"], {})]),
    (False, "reactor.db.size", "By", "The database's size.",
     lambda f: [(f["database_bytes"], {})]),
    (False, "reactor.db.queue.jobs", "{job}", "Jobs of each queue, by state.",
     lambda f: ((jobs[state], {"queue": queue, "state": state})
                for queue, jobs in f["queues"].items() for state in QUEUE_STATES)),
    (False, "reactor.db.timers", "{timer}", "Pending timers.",
     lambda f: [(f["timers"]["pending"], {})]),
    (False, "reactor.db.timer.lag", "s", "How long the oldest due timer has waited.",
     lambda f: [(f["timers"]["lag"], {})]),
    (False, "reactor.db.locks.held", "{lock}", "Locks held.",
     lambda f: [(f["locks_held"], {})]),
    (False, "reactor.db.overdue", "s", "How long the oldest due upkeep work has waited.",
     lambda f: [(f["overdue"], {})]),
    (False, "reactor.db.subscriber.position", "1",
     "The last revision each durable subscriber acknowledged.",
     lambda f: _each_subscriber(f, "position")),
    (False, "reactor.db.subscriber.lag", "1",
     "Revisions each durable subscriber is behind the change log.",
     lambda f: _each_subscriber(f, "lag")),
    (True, "reactor.db.subscriber.delivered", "{event}",
     "Events each durable subscriber handled.",
     lambda f: _each_subscriber(f, "delivered")),
    (True, "reactor.db.subscriber.failed", "{event}",
     "Events each durable subscriber failed to handle.",
     lambda f: _each_subscriber(f, "failed")),
)  # fmt: skip


def _each_subscriber(
    figures: dict[str, Any], figure: str
) -> Iterable[tuple[float, dict[str, str]]]:
    return (
        (found[figure], {"subscriber": name})
        for name, found in figures["durable_subscribers"].items()
    )


class _Reading:
    """The figures of one collection: read afresh by the first instrument's callback
    (an SDK calls them in the order they were created), then kept for the others, for
    ``FRESH`` seconds at most: one read of the database per collection."""

    def __init__(self, state: object, *, database: bool, process: bool) -> None:
        self._state = state
        self._database = database
        self._process = process
        self._lock = threading.Lock()
        self._read_at = -FRESH
        self._found: tuple[dict[str, Any] | None, dict[str, Any] | None] | None = None

    def figures(self, *, fresh: bool) -> tuple[dict[str, Any] | None, dict[str, Any] | None] | None:
        with self._lock:
            if fresh or time.monotonic() - self._read_at >= FRESH:
                self._found = read(self._state, database=self._database, process=self._process)
                self._read_at = time.monotonic()
            return self._found

    def callback(
        self, which: int, points: Points, *, first: bool
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            found = self.figures(fresh=first)
            figures = None if found is None else found[which]
            if figures is None:
                return []
            return [Observation(value, attrs) for value, attrs in points(figures)]

        return observe


def create_instruments(
    state: object, meter: Meter | None, *, database: bool, process: bool
) -> list[Any]:
    """The observable instruments of ``state``'s figures, created on ``meter`` (None: the
    global meter provider's ``"reactor"``)."""
    if meter is None:
        meter = metrics.get_meter("reactor", __version__)
    reading = _Reading(state, database=database, process=process)
    made: list[Any] = []
    for which, table in ((0, _PROCESS if process else ()), (1, _DATABASE if database else ())):
        for counter, name, unit, description, points in table:
            create = meter.create_observable_counter if counter else meter.create_observable_gauge
            made.append(
                create(
                    name,
                    callbacks=[reading.callback(which, points, first=not made)],
                    unit=unit,
                    description=description,
                )
            )
    return made
