"""Metrics: reactor's figures for Prometheus and OpenTelemetry.

Two kinds of figures: this process's (operations and their latency by verb,
transactions, events, expiry, timers fired, the upkeep's rounds), counted in memory
since the handle's engine opened; and the database's (keys by scope, the change log,
jobs by queue and state, timers and their lag, locks held, durable subscribers' lag),
read from the database when asked, so that every process reports the same, even one
that opened it read-only.

```python
import reactor
import reactor.metrics
from prometheus_client import CollectorRegistry, generate_latest

with reactor.open(":memory:") as state:
    state.scope("orders").set("o-1", {"total": 120})
    registry = CollectorRegistry()
    reactor.metrics.register(state, registry)
    text = generate_latest(registry).decode()
    assert 'reactor_db_scope_keys{scope="orders"} 1.0' in text
```

``prometheus_client`` and ``opentelemetry-api`` are optional (``pip install
'reactor-state[metrics]'``): they are imported by ``register`` and ``instrument``, not
by ``import reactor.metrics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reactor._handles.binding import engine_of
from reactor._handles.figures import database_figures

from ._figures import check_handle

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, ObservableCounter, ObservableGauge
    from prometheus_client.registry import Collector, CollectorRegistry

    from reactor import State
    from reactor.aio import AsyncState

__all__ = ["figures", "instrument", "register"]


def figures(state: State) -> dict[str, Any]:
    """The database's figures, as any process reading it sees them: ``keys`` (in all)
    and ``scopes`` (keys by scope), ``log`` (the change log's ``records``, its
    ``first`` and ``last`` revisions), ``queues`` (jobs by queue and state: ``ready``,
    ``delayed``, ``taken``, ``dead``), ``timers`` (``pending``, and ``lag``: seconds the
    oldest due timer has waited, 0.0 when none is due), ``locks_held``,
    ``durable_subscribers`` (each one's ``position``, ``lag`` in revisions,
    ``delivered`` and ``failed``), ``overdue`` (seconds the oldest due upkeep work has
    waited: a key past its deadline, a due timer, a lease run out), ``revision``,
    ``database`` and ``database_bytes``.

    Each figure is read on its own (a few index seeks; a few per queue): they are not
    one snapshot of the database.

    Raises:
        ClosedError: ``state`` is closed.
        StorageError: the database cannot be read.
    """
    return database_figures(engine_of(state))


def register(
    state: State | AsyncState,
    registry: CollectorRegistry | None = None,
    *,
    database: bool = True,
    process: bool = True,
) -> Collector:
    """Register a Prometheus collector of ``state``'s figures on ``registry``
    (``prometheus_client.REGISTRY`` if None), and return it (for
    ``registry.unregister``).

    Each scrape reads them afresh: this process's counters (``process``) and the
    database's figures (``database``, read from the database: several processes may
    report them, and a scrape of each gives the same). A closed ``state`` reports
    nothing; so does a ``reactor.aio.AsyncState`` until its first use opens it. See
    the metrics guide for the names.

    Raises:
        ClosedError: ``state`` is closed.
        ModuleNotFoundError: ``prometheus_client`` is not installed.
        TypeError: ``state`` is not a handle.
        ValueError: ``registry`` already has a collector of these names.
    """
    check_handle(state)
    from prometheus_client import REGISTRY

    from ._prometheus import ReactorCollector

    collector = ReactorCollector(state, database=database, process=process)
    (REGISTRY if registry is None else registry).register(collector)
    return collector


def instrument(
    state: State | AsyncState,
    meter: Meter | None = None,
    *,
    database: bool = True,
    process: bool = True,
) -> list[ObservableCounter | ObservableGauge]:
    """Create OpenTelemetry observable instruments of ``state``'s figures on ``meter``
    (None: the global meter provider's meter ``"reactor"``), and return them.

    Their callbacks read the figures when the SDK collects, the database's once for
    all the instruments of one collection. A closed ``state`` reports nothing; so does
    a ``reactor.aio.AsyncState`` until its first use opens it. See the metrics guide
    for the names.

    Raises:
        ClosedError: ``state`` is closed.
        ModuleNotFoundError: ``opentelemetry-api`` is not installed.
        TypeError: ``state`` is not a handle.
    """
    check_handle(state)
    from ._otel import create_instruments

    return create_instruments(state, meter, database=database, process=process)
