"""DBOS's side of the durable-workflow bench (``durable``), as its documentation has
users run it: ``@DBOS.workflow`` calling ``@DBOS.step`` functions, one DBOS instance per
process. ``target`` is reactor's (a folder on SQLite, a URL naming a fresh schema on
PostgreSQL); DBOS gets a file in that folder, or its system tables in that schema.

In one process, runs start with ``DBOS.start_workflow`` (DBOS runs each at once in its
thread pool). Across processes, four worker processes listen to a queue (each taking up
to ``threads`` runs at a time, polling every 10 ms) and a starter process, listening to
no queue, enqueues the runs: DBOS's way to spread workflows over worker processes.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["one_process", "starter", "steps", "worker"]

_TIMEOUT = 600.0
_QUEUE = "reactor_bench"
_POLL = 0.01  # seconds between a worker's looks at the queue (DBOS's default: 1)


def add_one(x: int) -> int:
    return x + 1


def _config(target: str) -> dict[str, Any]:
    """DBOS's configuration for reactor's ``target``: SQLite in its folder, or the
    PostgreSQL schema its URL's ``search_path`` names."""
    if "://" not in target:
        url = "sqlite:///" + os.path.join(target, "dbos.sqlite")
        return {"name": "reactor-bench", "system_database_url": url, "log_level": "WARNING"}
    parts = urlsplit(target)
    options = parse_qs(parts.query).get("options", [""])[0]
    schema = options.split("search_path=", 1)[1].split()[0]
    return {
        "name": "reactor-bench",
        "system_database_url": parts._replace(query="").geturl(),
        "dbos_system_schema": schema,
        "log_level": "WARNING",
    }


def _launch(target: str, *, queues: list[str] | None = None) -> tuple[Any, Any, Any]:
    """DBOS launched on ``target`` with the bench's workflows: (DBOS, three, many).
    ``queues``: the queues this process takes runs from (None: every one)."""
    os.dup2(2, 1)  # DBOS's messages go to stderr: the bench's stdout may be its JSON
    sys.stdout = sys.stderr
    from dbos import DBOS  # type: ignore[import-untyped, import-not-found, unused-ignore]

    DBOS(config=_config(target))  # type: ignore[arg-type, unused-ignore]
    step = DBOS.step(name="add_one")(add_one)

    @DBOS.workflow(name="three")
    def three(x: int) -> int:
        return int(step(step(step(x))))

    @DBOS.workflow(name="many")
    def many(x: int, count: int) -> int:
        for _ in range(count):
            x = step(x)
        return x

    if queues is not None:
        DBOS.listen_queues(queues)
    DBOS.launch()
    return DBOS, three, many


def one_process(target: str, count: int, threads: int) -> dict[str, Any]:  # noqa: ARG001 - same call as reactor's
    """Start ``count`` runs of the 3-step workflow (``DBOS.start_workflow``: each runs in
    DBOS's thread pool at once) and wait for every result."""
    dbos, three, _ = _launch(target)
    try:
        start = time.perf_counter()
        handles = [dbos.start_workflow(three, n) for n in range(count)]
        results = [handle.get_result() for handle in handles]
        seconds = time.perf_counter() - start
    finally:
        dbos.destroy()
    return {
        "count": count,
        "seconds": seconds,
        "per_s": count / seconds,
        "commits_per_workflow": None,
        "correct": results == [n + 3 for n in range(count)],
    }


def steps(target: str, many_steps: int, count: int) -> dict[str, Any]:
    """``count`` workflows of one step, then of ``many_steps`` steps, one at a time (each
    called in this thread): the time each step past the first adds."""
    dbos, _, many = _launch(target)
    spent: dict[int, list[float]] = {}
    correct = True
    try:
        many(0, 1)  # warm: the first run's costs
        for size in (1, many_steps):
            for n in range(count):
                start = time.perf_counter()
                correct &= many(n, size) == n + size
                spent.setdefault(size, []).append(time.perf_counter() - start)
    finally:
        dbos.destroy()
    return {
        "count": count,
        "steps": many_steps,
        "workflow_us": {str(size): statistics.median(spent[size]) * 1e6 for size in spent},
        "step_us": (statistics.median(spent[many_steps]) - statistics.median(spent[1]))
        / (many_steps - 1)
        * 1e6,
        "commits_per_step": None,
        "commits_per_workflow": None,
        "correct": correct,
    }


def starter(
    target: str, count: int, threads: int, ready: Any, barrier: Any, stop: Any, results: Any
) -> None:
    """Register the queue (``threads`` runs at a time per worker), then (listening to
    no queue: it runs nothing) enqueue ``count`` runs once the workers are ready; from
    the first enqueue to the last run's recorded end."""
    try:
        dbos, three, _ = _launch(target, queues=[])
        try:
            queue = dbos.register_queue(
                _QUEUE, worker_concurrency=threads, polling_interval_sec=_POLL
            )
            ready.set()
            barrier.wait(_TIMEOUT)
            began = time.time()
            handles = [queue.enqueue(three, n) for n in range(count)]
            started = time.time() - began
            found = [handle.get_result() for handle in handles]
            ids = [handle.get_workflow_id() for handle in handles]
            statuses = dbos.list_workflows(workflow_ids=ids)
            ended = max(status.updated_at for status in statuses) / 1000
            executors = {status.executor_id for status in statuses}
        finally:
            dbos.destroy()
        results.put(
            {
                "count": count,
                "seconds": ended - began,
                "per_s": count / (ended - began),
                "commits": None,
                "started_s": started,
                "executors": len(executors),
                "correct": found == [n + 3 for n in range(count)],
            }
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        stop.set()
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def worker(target: str, threads: int, barrier: Any, stop: Any, served: Any) -> None:  # noqa: ARG001 - same call as reactor's
    """A worker process: takes runs from the starter's queue (as many at a time as it
    says) until ``stop``."""
    try:
        dbos, _, _ = _launch(target, queues=[_QUEUE])
        try:
            deadline = time.monotonic() + 30
            while not any(t.name == f"queue-worker-{_QUEUE}" for t in threading.enumerate()):
                if time.monotonic() > deadline:
                    raise TimeoutError("DBOS's queue thread did not start")
                time.sleep(0.01)
            barrier.wait(_TIMEOUT)
            stop.wait(_TIMEOUT)
        finally:
            dbos.destroy()
        served.put({"commits": None, "ran": None})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        served.put({"error": f"{type(exc).__name__}: {exc}"})
