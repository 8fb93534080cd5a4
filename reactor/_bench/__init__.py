"""``reactor bench``: reactor against what a user would pick instead (SPEC §11).

``run(options)`` measures and returns every figure as a dict: reactor against its
peers (``figures``, ``targets``, ``events``), then how its writes scale with writers
(``scaling``, see ``writers``); ``report`` turns that into tables or JSON. The peers
are optional dependencies (``pip install reactor-state[bench]``): one that is missing is
skipped with a note.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from . import report
from .backends import Backend, BackendUnavailable, connect_backend
from .derived import DerivedPlan, run_derived
from .durable import Plan, run_durable
from .peer import reactor_target
from .peers import PEERS, available, redis_server_version
from .queues import (
    LATENCY_PEERS,
    QUEUE_PEERS,
    procrastinate_throughput,
    put_take_latency,
    queue_peers,
    queue_processes,
    queue_throughput,
    rq_throughput,
)
from .scale import run_scale
from .startup import measure_startup
from .workflow import timer_lag
from .workloads import (
    COUNTER,
    Counts,
    calls_per_op,
    event_latency_cross_process,
    event_latency_in_process,
    run_asyncio,
    run_processes,
    run_threads,
)
from .writers import plan_for, run_writers

__all__ = ["BackendUnavailable", "Options", "run"]

# The queue peers whose workers are processes: measured with processes only.
_PROCESSES_ONLY = frozenset({"rq", "procrastinate"})


@dataclass(frozen=True)
class Options:
    """What ``reactor bench`` was asked for."""

    quick: bool = False
    rounds: int | None = None  # None: 3, or 1 with quick
    scale: bool = False
    only: str | None = None  # "peers", "writers", ..., "derived", "startup"; None: all
    db_dir: str | None = None  # None: a temporary directory, removed afterwards
    threads: int = 4
    processes: int = 4
    tasks: int = 100
    backend: str = "sqlite"  # or "postgresql": reactor only; the peers stay as they are
    peers: tuple[str, ...] | None = None  # the peers to measure beside reactor; None: all
    url: str | None = None  # the PostgreSQL server; None: backends.default_postgres_url()
    progress: Callable[[str], None] | None = None


@contextmanager
def _workspace(db_dir: str | None) -> Iterator[str]:
    """A fresh directory for this run (inside ``db_dir`` if given), removed afterwards."""
    if db_dir is not None:
        os.makedirs(db_dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="reactor-bench-", dir=db_dir)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _modes(options: Options) -> dict[str, str]:
    return {
        "threads_1": "1t",
        "threads_n": f"{options.threads}t",
        "processes_1": "1p",
        "processes_n": f"{options.processes}p",
        "asyncio": f"aio{options.tasks}",
    }


def _measure(
    name: str, kind: str, workers: int, location: str, counts: Counts, tasks: int
) -> dict[str, dict[str, Any]]:
    """One peer in one mode on a fresh ``location``; the counter checked after."""
    peer = PEERS[name](location)
    try:
        if kind == "threads":
            figures = run_threads(peer, workers, counts)
        elif kind == "processes":
            figures = run_processes(name, location, workers, counts)
        else:
            figures = run_asyncio(peer, tasks, counts)
        expected = (
            max(1, counts.writes // tasks) * tasks if kind == "asyncio" else counts.writes * workers
        )
        got = peer.count(COUNTER)
        figures["increment"].update(count=got, expected=expected, count_exact=got == expected)
        if kind == "threads" and workers == 1:  # after the count: it increments too
            for verb, calls in calls_per_op(peer, max(20, counts.writes // 4)).items():
                figures[verb]["calls_per_op"] = calls
        return figures
    finally:
        try:
            peer.cleanup()
        finally:
            peer.close()


def _say(options: Options, message: str) -> None:
    if options.progress is not None:
        options.progress(message)


def run(options: Options) -> dict[str, Any]:
    """Measure, and return every figure with the settings and the machine they come from.

    Raises:
        BackendUnavailable: the backend asked for cannot run here (the message says why).
    """
    began = time.perf_counter()
    if options.scale and options.backend != "sqlite":
        raise BackendUnavailable("--scale runs on SQLite only: leave out --backend postgresql")
    backend = connect_backend(options.backend, options.url)
    try:
        result = _run(options, backend)
    finally:
        backend.close()
    result["notes"].extend(f"could not drop schema {what}" for what in backend.leftovers)
    result["seconds"] = time.perf_counter() - began
    return result


def _run(options: Options, backend: Backend) -> dict[str, Any]:
    names, skipped = available(options.peers) if options.only in (None, "peers") else ([], {})
    fresh = "files" if backend.name == "sqlite" else "files (reactor: a PostgreSQL schema)"
    notes = [
        (
            "ratios are reactor's ops/s divided by the peer's, in the same mode and round; "
            "latency is per operation as the caller sees it"
        ),
        (
            f"each mode starts on fresh {fresh}; workers use keys of their own, increment "
            "one shared counter; phases run set, get, update, increment, delete in that order"
        ),
    ]
    if options.only in ("writers", "workflow", "durable", "derived", "startup"):
        notes.clear()
        if backend.name != "sqlite":
            notes.append(f"reactor runs on {backend.describe()}")
    elif backend.name != "sqlite":
        notes.append(
            f"reactor runs on {backend.describe()}; the peers as always; "
            "targets are set for the SQLite backend"
        )
    machine = report.machine_info()
    if "redis" in names:
        machine["redis_server"] = redis_server_version()
    result: dict[str, Any] = {
        "machine": machine,
        "backend": backend.about(),
        "peers": {
            name: {"notes": list(PEERS[name].notes), "asyncio": PEERS[name].aio} for name in names
        },
        "skipped": skipped,
        "notes": notes,
    }
    with _workspace(options.db_dir) as root:
        if options.scale:
            result.update(_scale(options, root))
            return result
        if options.only in (None, "peers"):
            result.update(_compare(options, backend, names, root, notes))
        if options.only in (None, "writers"):
            result["scaling"] = {backend.name: _writers(options, backend, root)}
            error = result["scaling"][backend.name].get("error")
            if error is not None:
                result.setdefault("errors", {}).setdefault("reactor", {})["writers"] = error
        if options.only in (None, "workflow"):
            result["workflow"] = _workflow(options, backend, root)
        if options.only in (None, "durable"):
            result["durable"] = _durable(options, backend, root)
        if options.only in (None, "derived"):
            result["derived"] = _derived(options, backend, root)
        if options.only in (None, "startup"):
            result["startup"] = _startup(options, root)
    return result


def _writers(options: Options, backend: Backend, root: str) -> dict[str, Any]:
    """How reactor's writes/s grow with threads and processes (and pgbench's, on
    PostgreSQL)."""
    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    return run_writers(
        backend,
        root,
        plan_for(quick=options.quick, rounds=rounds),
        lambda message: _say(options, message),
    )


def _durable(options: Options, backend: Backend, root: str) -> dict[str, Any]:
    """Durable workflows against DBOS (issue 26), on the same kind of database."""
    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    plan = Plan(
        rounds=rounds,
        count=60 if options.quick else 300,
        steps=20,
        step_count=20 if options.quick else 50,
        threads=options.threads,
        processes=options.processes,
    )
    return run_durable(backend, root, plan, lambda message: _say(options, message))


def _derived(options: Options, backend: Backend, root: str) -> dict[str, Any]:
    """Derived values (issue 27): a commit's way to a subscriber, and what 10,000 live
    values cost the writes that touch none."""
    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    plan = DerivedPlan(
        rounds=rounds,
        count=50 if options.quick else 300,
        writes=500 if options.quick else 3000,
        values=1000 if options.quick else 10_000,
    )
    return run_derived(backend, root, plan, lambda message: _say(options, message))


def _startup(options: Options, root: str) -> dict[str, Any]:
    """A ``reactor get`` from the shell against a bare interpreter (issue 28), and
    ``redis-cli get`` where a local Redis answers."""
    from .peers import REDIS_PORT, _redis_answers

    _say(options, "start-up: reactor get, python -c pass, redis-cli get")
    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    port = None if _redis_answers() else REDIS_PORT  # why not, or None
    return measure_startup(root, rounds=rounds, runs=3 if options.quick else 15, redis_port=port)


def _workflow(options: Options, backend: Backend, root: str) -> dict[str, Any]:
    """Timers firing with many pending, and a work queue against its peers (a Redis
    list, huey, a SQLite table) with worker threads and worker processes, and its
    put-to-take latency (medians of the rounds); each on a fresh database."""
    from .peers import _redis_answers

    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    pending, probes = (10_000, 50) if options.quick else (100_000, 200)
    jobs = 500 if options.quick else 5000
    section: dict[str, Any] = {"errors": {}}
    _say(options, f"workflow: timers, {pending:,} pending")
    location = os.path.join(root, "timers")
    os.makedirs(location)
    try:
        with backend.location(location, "timers") as where:
            section["timers"] = timer_lag(reactor_target(where), pending, probes)
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        section["errors"]["timers"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(location, ignore_errors=True)
    names, skipped = queue_peers(_redis_answers(), postgresql=backend.name == "postgresql")
    section["queue_skipped"] = skipped
    found: dict[str, dict[str, list[dict[str, Any]]]] = {}
    latency: dict[str, list[dict[str, Any]]] = {}
    cells = [str(n) for n in sorted({1, options.threads})] + [f"{options.processes}p"]
    for number in range(rounds):
        for cell in cells:
            for name in names:
                if name in _PROCESSES_ONLY and not cell.endswith("p"):
                    continue  # their workers are processes
                _say(options, f"workflow round {number + 1}/{rounds}: {name} queue, {cell}")
                figures = _queue_cell(backend, root, name, cell, jobs, number)
                found.setdefault(name, {}).setdefault(cell, []).append(figures)
        for name in [name for name in names if name in LATENCY_PEERS]:
            _say(options, f"workflow round {number + 1}/{rounds}: {name} put to take")
            location = os.path.join(root, f"latency-r{number}-{name}")
            os.makedirs(location)
            try:
                with _where(backend, name, location, f"l{number}") as where:
                    target = reactor_target(where) if name == "reactor" else where
                    latency.setdefault(name, []).append(
                        put_take_latency(name, target, 20 if options.quick else 200)
                    )
            except Exception as exc:  # noqa: BLE001 - one failure must not end the run
                section["errors"][f"{name} latency"] = f"{type(exc).__name__}: {exc}"
            finally:
                shutil.rmtree(location, ignore_errors=True)
    section["queue"] = {
        name: {cell: _median_queue(runs) for cell, runs in by_cell.items() if runs}
        for name, by_cell in found.items()
    }
    section["latency"] = {name: _median_latency(runs) for name, runs in latency.items()}
    section["settings"] = {"rounds": rounds, "jobs": jobs, "pending_timers": pending}
    return section


def _queue_cell(
    backend: Backend, root: str, name: str, cell: str, jobs: int, number: int
) -> dict[str, Any]:
    """Peer ``name``'s queue figures with ``cell`` workers: threads ("4") or processes
    ("4p"), on a fresh database; a failure is in the figures' ``error``."""
    location = os.path.join(root, f"queue-r{number}-{name}-{cell}")
    os.makedirs(location)
    try:
        with _where(backend, name, location, f"q{number}-{cell}") as where:
            target = reactor_target(where) if name == "reactor" else where
            if name == "rq":
                return rq_throughput(target, jobs, int(cell[:-1]))
            if name == "procrastinate":
                return procrastinate_throughput(where, jobs, int(cell[:-1]))
            if cell.endswith("p"):
                return queue_processes(name, target, jobs, int(cell[:-1]))
            peer = QUEUE_PEERS[name](target)
            try:
                return queue_throughput(peer, jobs, int(cell))
            finally:
                peer.close()
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        return {
            "jobs": jobs,
            "workers": cell,
            "put_per_s": None,
            "take_ack_per_s": None,
            "exactly_once": False,
            "error": f"{type(exc).__name__}: {exc}",
        }
    finally:
        shutil.rmtree(location, ignore_errors=True)


def _median_latency(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each percentile over the rounds."""
    merged = dict(runs[0])
    for figure in ("p50_ms", "p99_ms"):
        values = sorted(run[figure] for run in runs if run[figure] is not None)
        merged[figure] = values[len(values) // 2] if values else None
    merged["error"] = next((run["error"] for run in runs if run["error"]), None)
    return merged


def _median_queue(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each rate over the rounds; exactly once only if every round was."""
    merged = dict(runs[0])
    for rate in ("put_per_s", "take_ack_per_s"):
        values = sorted(run[rate] for run in runs if run[rate] is not None)
        merged[rate] = values[len(values) // 2] if values else None
    merged["exactly_once"] = all(run["exactly_once"] for run in runs)
    merged["error"] = next((run["error"] for run in runs if run["error"]), None)
    return merged


def _scale(options: Options, root: str) -> dict[str, Any]:
    sizes = [10_000, 100_000] if options.quick else [10_000, 100_000, 1_000_000]
    writes, reads = (200, 2000) if options.quick else (2000, 20_000)
    _say(options, f"scale: growing a database to {sizes[-1]:,} keys")
    return {
        "settings": {"quick": options.quick, "writes": writes, "reads": reads},
        "scale": run_scale(root, sizes, writes, reads),
        "skipped": {},
        "peers": {},
        "notes": [
            (
                f"keys spread evenly over 100 scopes, filled with set_many of up to "
                f"1,000 keys; at each size {writes:,} sets overwrite random existing "
                f"keys in random scopes and {reads:,} gets read random keys, one thread"
            ),
            "reopen runs in a fresh process, after reactor is imported",
        ],
    }


def _where(backend: Backend, name: str, directory: str, tag: str) -> AbstractContextManager[str]:
    """Where peer ``name`` keeps its data: the backend decides for reactor (and for
    procrastinate, which runs on PostgreSQL only)."""
    if name in ("reactor", "procrastinate"):
        return backend.location(directory, tag)
    return nullcontext(directory)


def _plan(options: Options, modes: dict[str, str]) -> list[tuple[str, int, str]]:
    """(kind, workers, mode) of every mode measured, each once."""
    plan = [
        ("threads", 1, modes["threads_1"]),
        ("threads", options.threads, modes["threads_n"]),
        ("processes", 1, modes["processes_1"]),
        ("processes", options.processes, modes["processes_n"]),
        ("asyncio", options.tasks, modes["asyncio"]),
    ]
    return list({mode: (kind, n, mode) for kind, n, mode in plan}.values())


def _round(
    options: Options,
    backend: Backend,
    names: list[str],
    root: str,
    number: int,
    plan: list[tuple[str, int, str]],
    counts: Counts,
    errors: dict[str, dict[str, str]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """One round: every peer in every mode (a failure is noted in ``errors``)."""
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        for kind, workers, mode in plan:
            if (kind == "processes" and PEERS[name].in_memory) or mode in errors.get(name, {}):
                continue
            _say(options, f"round {number + 1}/{options.rounds}: {name} {mode}")
            location = os.path.join(root, f"r{number}-{name}-{mode}")
            os.makedirs(location)
            try:
                with _where(backend, name, location, f"r{number}-{mode}") as where:
                    figures.setdefault(name, {})[mode] = _measure(
                        name, kind, workers, where, counts, options.tasks
                    )
            except Exception as exc:  # noqa: BLE001 - one failure must not end the run
                errors.setdefault(name, {})[mode] = f"{type(exc).__name__}: {exc}"
            finally:
                shutil.rmtree(location, ignore_errors=True)
    return figures


def _compare(
    options: Options, backend: Backend, names: list[str], root: str, notes: list[str]
) -> dict[str, Any]:
    rounds = options.rounds if options.rounds is not None else (1 if options.quick else 3)
    options = dataclasses.replace(options, rounds=rounds)
    counts = Counts(200, 200) if options.quick else Counts(2000, 20_000)
    modes = _modes(options)
    plan = _plan(options, modes)
    notes.append(
        f"{counts.writes:,} ops per worker for each write verb, {counts.reads:,} for get; "
        f"asyncio: {options.tasks} tasks share those counts"
    )
    per_round: list[dict[str, dict[str, dict[str, Any]]]] = []
    errors: dict[str, dict[str, str]] = {}
    events: dict[str, list[dict[str, Any]]] = {"in_process": [], "cross_process": []}
    for number in range(rounds):
        per_round.append(_round(options, backend, names, root, number, plan, counts, errors))
        _say(options, f"round {number + 1}/{rounds}: event delivery")
        location = os.path.join(root, f"r{number}-events")
        try:
            _events(options, backend, location, f"r{number}", events)
        except Exception as exc:  # noqa: BLE001 - one failure must not end the run
            errors.setdefault("reactor", {})["events"] = f"{type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(location, ignore_errors=True)
    summary = report.summarize(per_round)
    merged_events = {which: _median_events(found) for which, found in events.items()}
    if any(PEERS[name].in_memory for name in names):
        notes.append("in-memory peers (dict+lock) have no process rows")
    return {
        "settings": {
            "quick": options.quick,
            "rounds": rounds,
            "writes_per_worker": counts.writes,
            "reads_per_worker": counts.reads,
            "threads": options.threads,
            "processes": options.processes,
            "asyncio_tasks": options.tasks,
        },
        "modes": modes,
        "figures": summary,
        "ratios": report.ratios(summary),
        "events": merged_events,
        "targets": report.targets(summary, merged_events, modes),
        "errors": errors,
        "rounds": per_round,
        "events_rounds": events,
    }


def _events(
    options: Options,
    backend: Backend,
    location: str,
    tag: str,
    into: dict[str, list[dict[str, Any]]],
) -> None:
    """Event delivery in one process, then across processes, each on a fresh database;
    each result appended to ``into`` as soon as it is measured."""
    for which, measure, count in (
        ("in_process", event_latency_in_process, 50 if options.quick else 200),
        ("cross_process", event_latency_cross_process, 20 if options.quick else 100),
    ):
        directory = os.path.join(location, which)
        os.makedirs(directory)
        with backend.location(directory, f"{tag}-{which}") as where:
            into[which].append(measure(reactor_target(where), count))


def _median_events(found: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The round with the median p50 stands for all (its p99 goes with it)."""
    measured = sorted(
        (one for one in found if one["p50_us"] is not None), key=lambda one: one["p50_us"]
    )
    if not measured:
        return found[0] if found else None
    chosen = dict(measured[len(measured) // 2])
    chosen["p50_rounds_us"] = [one["p50_us"] for one in found]
    return chosen
