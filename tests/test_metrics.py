"""``reactor.metrics``: the figures for Prometheus (scraped and parsed with
``prometheus_client``'s parser) and OpenTelemetry (read with the SDK's in-memory
reader), ``reactor serve --metrics`` over HTTP, and ``reactor stats``: the database's
figures as any process sees them, writes of other processes included."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import reactor
import reactor.metrics
from tests.conftest import CLI_ENV, run_reactor, wait_for
from tests.test_cli_serve import served

QUIET = 1e6  # the test's sweep interval: its upkeep never fires a timer nor turns a lease back


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition ``text``: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return _samples(generate_latest(registry).decode())


def _fill(state: reactor.State) -> int:
    """Keys in two scopes, jobs in every state, a due timer, a durable subscriber
    behind the log (its position returned)."""
    orders = state.scope("orders")
    orders.set_many({"o-1": 1, "o-2": 2, "o-3": 3})
    state.scope("users").set("u-1", {"name": "ada"})
    seen: list[reactor.ChangeEvent] = []
    audit = state.subscribe(seen.append, scope="orders", durable="audit")
    orders.set("o-4", 4)
    wait_for(lambda: reactor.metrics.figures(state)["durable_subscribers"]["audit"]["lag"] == 0)
    audit.close()
    position: int = reactor.metrics.figures(state)["durable_subscribers"]["audit"]["position"]
    jobs = state.queue("emails", max_attempts=1)
    for item in ("a", "b", "c"):
        jobs.put(item)
    jobs.put("later", delay=3600)
    taken = jobs.take(timeout=0)
    assert taken is not None
    dead = jobs.take(timeout=0)
    assert dead is not None
    dead.nack(error="no")
    orders.schedule("o-9", 9, after=0.01)  # due at once: nobody fires it (QUIET)
    wait_for(lambda: reactor.metrics.figures(state)["timers"]["lag"] > 0)
    return position


def test_the_collector_reports_the_process_and_the_database(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        position = _fill(state)
        registry = CollectorRegistry()
        collector = reactor.metrics.register(state, registry)
        found = _scrape(registry)
        revision = reactor.metrics.figures(state)["revision"]
        assert found["reactor_db_keys", ()] == 5
        assert found["reactor_db_scope_keys", (("scope", "orders"),)] == 4
        assert found["reactor_db_scope_keys", (("scope", "users"),)] == 1
        assert found["reactor_db_revision", ()] == revision
        assert found["reactor_db_log_records", ()] == revision  # nothing compacted yet
        jobs = {
            state_: found["reactor_db_queue_jobs", (("queue", "emails"), ("state", state_))]
            for state_ in ("ready", "delayed", "taken", "dead")
        }
        assert jobs == {"ready": 1, "delayed": 1, "taken": 1, "dead": 1}
        assert found["reactor_db_timers", ()] == 1
        assert found["reactor_db_timer_lag_seconds", ()] > 0
        assert found["reactor_db_overdue_seconds", ()] > 0
        assert found["reactor_db_subscriber_position", (("subscriber", "audit"),)] == position
        assert found["reactor_db_subscriber_lag", (("subscriber", "audit"),)] == revision - position
        assert found["reactor_db_subscriber_delivered_total", (("subscriber", "audit"),)] == 1
        assert found["reactor_db_size_bytes", ()] > 0
        assert found["reactor_operations_total", (("verb", "set"),)] == 2
        assert found["reactor_transactions_total", ()] >= 7
        assert (
            "reactor_operation_latency_seconds",
            (("quantile", "0.99"), ("verb", "set")),
        ) in found
        assert found["reactor_upkeep_running", ()] == 1
        # Another process writes: the database's figures show it, this process's do not.
        done = run_reactor("--db", str(db_path), "set", "users", "u-2", "2", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        again = _scrape(registry)
        assert again["reactor_db_keys", ()] == 6
        assert again["reactor_db_scope_keys", (("scope", "users"),)] == 2
        assert again["reactor_db_revision", ()] == revision + 1
        assert (
            again["reactor_db_subscriber_lag", (("subscriber", "audit"),)]
            == revision + 1 - position
        )
        assert again["reactor_operations_total", (("verb", "set"),)] == 2
        with pytest.raises(ValueError, match="Duplicated"):
            reactor.metrics.register(state, registry)
    assert _scrape(registry) == {}  # closed: nothing to report
    registry.unregister(collector)


def test_the_log_figures_follow_its_compaction(db_path: Any) -> None:
    with reactor.open(db_path, log_retention=3, sweep_interval=0.05) as state:
        state.scope("s").set_many({f"k{i}": i for i in range(10)})
        for i in range(10):
            state.scope("s").set(f"k{i}", -i)
        log = wait_for(
            lambda: (found := reactor.metrics.figures(state)["log"])["first"] > 1 and found,
            timeout=20,
        )
        assert log["last"] == reactor.metrics.figures(state)["revision"]
        assert log["records"] == log["last"] - log["first"] + 1
        assert log["records"] < log["last"]


def test_a_read_only_handle_reports_the_database_alone_if_asked(db_path: Any) -> None:
    with reactor.open(db_path) as state:
        state.scope("s").set("k", 1)
    with reactor.open(db_path, readonly=True) as state:
        registry = CollectorRegistry()
        reactor.metrics.register(state, registry, process=False)
        found = _scrape(registry)
    assert found["reactor_db_keys", ()] == 1
    assert not any(name.startswith("reactor_operations") for name, _ in found)


async def test_an_asyncio_handle_reports_once_open(db_path: Any) -> None:
    import reactor.aio

    state = reactor.aio.open(db_path)
    registry = CollectorRegistry()
    reactor.metrics.register(state, registry)
    assert _scrape(registry) == {}  # not open until its first use
    await state.scope("s").set("k", 1)
    found = await asyncio.to_thread(_scrape, registry)
    assert found["reactor_db_keys", ()] == 1
    assert found["reactor_operations_total", (("verb", "set"),)] == 1
    await state.close()
    assert _scrape(registry) == {}
    with pytest.raises(reactor.ClosedError):
        reactor.metrics.register(state, CollectorRegistry())


def test_what_is_not_a_handle_is_refused() -> None:
    with pytest.raises(TypeError, match=r"expected a reactor\.State"):
        reactor.metrics.register("state.db", CollectorRegistry())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expected a reactor\.State"):
        reactor.metrics.instrument(object())  # type: ignore[arg-type]


def test_opentelemetry_instruments_report_the_figures(db_path: Any, tmp_path: Path) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        with reactor.open(db_path, sweep_interval=QUIET) as state:
            position = _fill(state)
            lag = reactor.metrics.figures(state)["revision"] - position
            made = reactor.metrics.instrument(state, provider.get_meter("test"))
            assert len(made) == 25
            found = _points(reader)
            assert found["reactor.db.keys", ()] == 5
            assert found["reactor.db.scope.keys", (("scope", "orders"),)] == 4
            assert found["reactor.db.queue.jobs", (("queue", "emails"), ("state", "dead"))] == 1
            assert found["reactor.db.subscriber.lag", (("subscriber", "audit"),)] == lag
            assert found["reactor.db.timers", ()] == 1
            assert found["reactor.db.timer.lag", ()] > 0
            assert found["reactor.operations", (("verb", "set"),)] == 2
            done = run_reactor("--db", str(db_path), "set", "users", "u-2", "2", cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            again = _points(reader)  # read afresh, at once
            assert again["reactor.db.keys", ()] == 6
            assert again["reactor.db.subscriber.lag", (("subscriber", "audit"),)] == lag + 1
        assert _points(reader) == {}  # closed: nothing to report
    finally:
        provider.shutdown()


def _points(reader: Any) -> dict[tuple[str, tuple[tuple[str, Any], ...]], float]:
    """Every data point the reader collects now: (name, sorted attributes) -> value."""
    data = reader.get_metrics_data()
    if data is None:  # no point at all
        return {}
    return {
        (metric.name, tuple(sorted(point.attributes.items()))): point.value
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
    }


def test_serve_serves_metrics_over_http(db_path: Any) -> None:
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        state.scope("orders").set_many({"o-1": 1, "o-2": 2})
        state.queue("emails").put("a")
        with served(db_path, "--metrics", "0") as server:
            url = server.url("metrics")
            assert url.endswith("/metrics")
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
                assert response.headers["Content-Type"].startswith("text/plain")
                found = _samples(response.read().decode())
            assert found["reactor_db_keys", ()] == 2
            assert found["reactor_db_queue_jobs", (("queue", "emails"), ("state", "ready"))] == 1
            assert found["reactor_upkeep_running", ()] == 1
            assert ("process_cpu_seconds_total", ()) in found  # the process's own too
            state.scope("orders").set("o-3", 3)  # written here, reported there
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
                assert _samples(response.read().decode())["reactor_db_keys", ()] == 3
            assert server.stop() == 0


def test_stats_shows_the_database_figures(db_path: Any, tmp_path: Path) -> None:
    with reactor.open(db_path, sweep_interval=QUIET) as state:
        position = _fill(state)
    done = run_reactor("--db", str(db_path), "stats", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["keys"] == 5
    assert stats["scopes"] == {"orders": 4, "users": 1}
    assert stats["queues"] == {"emails": {"ready": 1, "delayed": 1, "taken": 1, "dead": 1}}
    assert stats["timers"]["pending"] == 1
    assert stats["timers"]["lag"] > 0
    assert stats["durable_subscribers"]["audit"]["lag"] == stats["revision"] - position
    assert stats["log"] == {"records": stats["revision"], "first": 1, "last": stats["revision"]}
    table = run_reactor("--db", str(db_path), "stats", "--table", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    for word in ("emails", "audit", "orders", "lag", "records"):
        assert word in table.stdout


def test_import_reactor_metrics_imports_no_exporter(tmp_path: Path) -> None:
    code = (
        "import sys, reactor, reactor.metrics\n"
        "print(sorted({m.partition('.')[0] for m in sys.modules} "
        "& {'prometheus_client', 'opentelemetry'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=CLI_ENV,
        timeout=60,
        check=True,
    )
    assert done.stdout == "[]\n"
