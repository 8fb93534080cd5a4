"""A work queue's put, take and ack against what a user would pick instead (SPEC §13):
a Redis list, huey's SQLite storage, a SQLite table. Throughput with worker threads and
worker processes, every job checked done exactly once; and the latency from a put to
the take of a worker process blocked waiting for it.

Each peer is built on ``where``: a reactor database (a file path or a PostgreSQL URL),
or a folder for the others; a worker process builds its own on the same ``where``.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "LATENCY_PEERS",
    "QUEUE_PEERS",
    "procrastinate_throughput",
    "put_take_latency",
    "queue_peers",
    "queue_processes",
    "queue_throughput",
    "rq_throughput",
]

_TIMEOUT = 600.0  # seconds any wait of the measurements gives up after


class QueuePeer(Protocol):
    """A work queue as the bench drives it: put an item; take one (None when empty),
    ack what was taken. Each worker thread gets its own handle (``worker()``)."""

    def put(self, item: Any) -> None: ...

    def take(self) -> tuple[Any, Any] | None: ...  # (handle for ack, item)

    def ack(self, taken: Any) -> None: ...

    def worker(self) -> QueuePeer: ...

    def close(self) -> None: ...


class Waiting(Protocol):
    """A queue whose take can block until a job comes (for ``put_take_latency``)."""

    def wait(self, timeout: float) -> tuple[Any, Any] | None: ...

    def put(self, item: Any) -> None: ...

    def ack(self, taken: Any) -> None: ...

    def close(self) -> None: ...


class ReactorQueue:
    """reactor's queue: put, take with a 30 s lease, ack."""

    def __init__(self, target: str, state: Any = None) -> None:
        import reactor

        self._own = state is None
        self._state = reactor.open(target) if state is None else state
        self._queue = self._state.queue("bench")

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def take(self) -> tuple[Any, Any] | None:
        job = self._queue.take(timeout=0, lease=30)
        return None if job is None else (job, job.item)

    def wait(self, timeout: float) -> tuple[Any, Any] | None:
        job = self._queue.take(timeout=timeout, lease=30)  # woken by the put's event
        return None if job is None else (job, job.item)

    def ack(self, taken: Any) -> None:
        taken.ack()

    def worker(self) -> ReactorQueue:
        return ReactorQueue("", self._state)  # threads share the engine, as an app would

    def close(self) -> None:
        if self._own:
            self._state.close()


class RedisListQueue:
    """A Redis list: RPUSH to put; BLMOVE to a processing list to take (the reliable
    queue pattern; waiting 10 ms at most when the list is empty), LREM from it to ack."""

    def __init__(self, name: str, *, fresh: bool = True) -> None:
        import redis

        from .peers import REDIS_HOST, REDIS_PORT

        self._name = name
        self._client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        self._owner = fresh  # a worker process's handle leaves the lists to the owner's
        if fresh:
            self._client.delete(name, f"{name}:taken")

    def put(self, item: Any) -> None:
        self._client.rpush(self._name, json.dumps(item))

    def take(self) -> tuple[Any, Any] | None:
        wait: Any = 0.01  # seconds; Redis takes a float (redis-py's hints say int)
        raw = self._client.blmove(self._name, f"{self._name}:taken", wait, "LEFT", "RIGHT")
        return None if raw is None else (raw, json.loads(raw))

    def ack(self, taken: Any) -> None:
        self._client.lrem(f"{self._name}:taken", 1, taken)

    def wait(self, timeout: float) -> tuple[Any, Any] | None:
        seconds: Any = timeout  # Redis takes a float (redis-py's hints say int)
        raw = self._client.blmove(self._name, f"{self._name}:taken", seconds, "LEFT", "RIGHT")
        return None if raw is None else (raw, json.loads(raw))

    def worker(self) -> RedisListQueue:
        return RedisListQueue(self._name, fresh=False)  # a client of its own

    def close(self) -> None:
        if self._owner:
            self._client.delete(self._name, f"{self._name}:taken")
        self._client.close()


class SQLiteTableQueue:
    """A table used as a queue, in WAL mode, synchronous=NORMAL as reactor's default:
    INSERT to put; one UPDATE ... RETURNING of the oldest ready row to take (a write
    transaction of its own), DELETE to ack."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn = sqlite3.connect(
            path, isolation_level=None, timeout=30, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, item TEXT NOT NULL, "
            "taken INTEGER NOT NULL DEFAULT 0, lease REAL)"
        )
        self._conn.execute("CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (taken, id)")

    def put(self, item: Any) -> None:
        self._conn.execute("INSERT INTO jobs (item) VALUES (?)", (json.dumps(item),))

    def take(self) -> tuple[Any, Any] | None:
        row = self._conn.execute(
            "UPDATE jobs SET taken = 1, lease = ? WHERE id = (SELECT id FROM jobs "
            "WHERE taken = 0 ORDER BY id LIMIT 1) RETURNING id, item",
            (time.time() + 30,),
        ).fetchone()
        return None if row is None else (row[0], json.loads(row[1]))

    def ack(self, taken: Any) -> None:
        self._conn.execute("DELETE FROM jobs WHERE id = ?", (taken,))

    def worker(self) -> SQLiteTableQueue:
        return SQLiteTableQueue(self._path)

    def close(self) -> None:
        self._conn.close()


class HueyQueue:
    """huey's SQLite storage (``huey.storage.SqliteStorage``, its defaults: WAL), as
    its consumer uses it: ``enqueue`` to put; ``dequeue``, which deletes the job it
    returns in one write transaction, to take; nothing to ack. A job whose worker dies
    is lost (no lease): less work than reactor's take and ack, and a weaker promise."""

    def __init__(self, path: str, storage: Any = None) -> None:
        from huey.storage import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
            SqliteStorage,
        )

        # A connection a thread; the workers share the storage, and only this closes it.
        self._owner = storage is None
        self._storage = SqliteStorage(name="bench", filename=path) if storage is None else storage
        self._path = path

    def put(self, item: Any) -> None:
        self._storage.enqueue(json.dumps(item).encode())

    def take(self) -> tuple[Any, Any] | None:
        data = self._storage.dequeue()
        return None if data is None else (None, json.loads(data))

    def ack(self, taken: Any) -> None:
        pass  # dequeue deleted it

    def worker(self) -> HueyQueue:
        return HueyQueue(self._path, self._storage)

    def close(self) -> None:
        if self._owner:
            self._storage.close()


def _redis_name(where: str) -> str:
    """The list of the measurement at ``where``: the same in every worker process."""
    return "reactor-bench-" + hashlib.sha256(where.encode()).hexdigest()[:12]


QUEUE_PEERS: dict[str, Callable[[str], QueuePeer]] = {
    "reactor": ReactorQueue,
    "redis": lambda where: RedisListQueue(_redis_name(where)),
    "huey": lambda where: HueyQueue(os.path.join(where, "huey.db")),
    "sqlite3": lambda where: SQLiteTableQueue(os.path.join(where, "queue.db")),
}


# What a worker process builds on ``where``: the owner's queue, not a fresh one.
_ATTACH: dict[str, Callable[[str], QueuePeer]] = {
    **QUEUE_PEERS,
    "redis": lambda where: RedisListQueue(_redis_name(where), fresh=False),
}
# The peers whose take can wait for a job (the others poll).
LATENCY_PEERS: dict[str, Callable[[str], Waiting]] = {
    "reactor": ReactorQueue,
    "redis": lambda where: RedisListQueue(_redis_name(where), fresh=False),
}


def queue_peers(
    redis_missing: str | None, *, postgresql: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The queue peers that can run here, and why the others cannot (``postgresql``:
    reactor runs on PostgreSQL, and so may procrastinate)."""
    names = ["reactor"]
    skipped: dict[str, str] = {}
    if redis_missing is None:
        names.append("redis")
    else:
        skipped["redis"] = redis_missing
    try:
        import huey.storage  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        skipped["huey"] = "not installed (pip install 'reactor-state[bench]')"
    else:
        names.append("huey")
    names.append("sqlite3")
    if redis_missing is None:
        try:
            import rq  # noqa: F401 - only whether it is there
        except ImportError:
            skipped["rq"] = "not installed (pip install 'reactor-state[bench]')"
        else:
            names.append("rq")  # worker processes only: RQ's workers are processes
    if postgresql:
        try:
            import procrastinate  # noqa: F401 - only whether it is there
        except ImportError:
            skipped["procrastinate"] = "not installed (pip install procrastinate)"
        else:
            names.append("procrastinate")  # worker processes, on reactor's server
    return names, skipped


def queue_throughput(peer: QueuePeer, jobs: int, workers: int) -> dict[str, Any]:
    """Put ``jobs`` items from one thread; then ``workers`` threads take and ack until
    none is left. Every item must be done exactly once."""
    start = time.perf_counter()
    for n in range(jobs):
        peer.put({"n": n})
    put_seconds = time.perf_counter() - start
    done: list[int] = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    def work(handle: QueuePeer) -> None:
        try:
            while True:
                taken = handle.take()
                if taken is None:
                    return
                handle.ack(taken[0])
                with lock:
                    done.append(taken[1]["n"])
        except BaseException as exc:  # noqa: BLE001 - reported with the figures
            failures.append(exc)
        finally:
            if handle is not peer:
                handle.close()

    handles = [peer if n == 0 else peer.worker() for n in range(workers)]
    threads = [threading.Thread(target=work, args=(handle,)) for handle in handles]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    take_seconds = time.perf_counter() - start
    return {
        "jobs": jobs,
        "workers": workers,
        "put_per_s": jobs / put_seconds if put_seconds else None,
        "take_ack_per_s": len(done) / take_seconds if take_seconds else None,
        "exactly_once": sorted(done) == list(range(jobs)),
        "error": f"{type(failures[0]).__name__}: {failures[0]}" if failures else None,
    }


def _process_worker(name: str, where: str, barrier: Any, results: Any) -> None:
    """A worker process: its own handle on ``where``; takes and acks until none is left,
    from when every worker is ready; sends back what it did and when."""
    try:
        peer = _ATTACH[name](where)
        try:
            barrier.wait(_TIMEOUT)
            start, done = time.perf_counter(), []
            while (taken := peer.take()) is not None:
                peer.ack(taken[0])
                done.append(taken[1]["n"])
            results.put((start, time.perf_counter(), done, None))
        finally:
            peer.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        results.put((0.0, 0.0, [], f"{type(exc).__name__}: {exc}"))


def queue_processes(name: str, where: str, jobs: int, processes: int) -> dict[str, Any]:
    """Put ``jobs`` items from this process; then ``processes`` spawned processes, each
    with its own handle, take and ack until none is left (from when all are ready).
    Every item must be done exactly once."""
    peer = QUEUE_PEERS[name](where)
    try:
        start = time.perf_counter()
        for n in range(jobs):
            peer.put({"n": n})
        put_seconds = time.perf_counter() - start
        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(processes), context.Queue()
        workers = [
            context.Process(
                target=_process_worker, args=(name, where, barrier, results), daemon=True
            )
            for _ in range(processes)
        ]
        for process in workers:
            process.start()
        found = [results.get(timeout=_TIMEOUT) for _ in workers]
        for process in workers:
            process.join(10)
            if process.is_alive():
                process.terminate()
    finally:
        peer.close()
    errors = [error for *_, error in found if error is not None]
    done = sorted(n for _, _, items, _ in found for n in items)
    seconds = max(end for _, end, _, _ in found) - min(start for start, _, _, _ in found)
    return {
        "jobs": jobs,
        "workers": f"{processes}p",
        "put_per_s": jobs / put_seconds if put_seconds else None,
        "take_ack_per_s": len(done) / seconds if seconds > 0 and not errors else None,
        "exactly_once": done == list(range(jobs)),
        "error": errors[0] if errors else None,
    }


def _latency_worker(name: str, where: str, count: int, ready: Any, results: Any) -> None:
    """A worker process blocked in its take: when each job came, by this clock."""
    try:
        peer = LATENCY_PEERS[name](where)
        try:
            ready.set()
            for _ in range(count):
                taken = peer.wait(timeout=30)
                if taken is None:
                    raise TimeoutError("no job within 30 s")
                results.put((taken[1]["n"], time.time()))
                peer.ack(taken[0])
        finally:
            peer.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put((-1, f"{type(exc).__name__}: {exc}"))


def put_take_latency(name: str, where: str, count: int) -> dict[str, Any]:
    """A worker process waits in its take; this one puts ``count`` jobs, one at a time,
    each once the one before was taken: how long from the put's call to the take's
    return, in milliseconds (epoch clocks of one machine)."""
    owner = QUEUE_PEERS[name](where)  # a fresh queue
    context = multiprocessing.get_context("spawn")
    ready, results = context.Event(), context.Queue()
    worker = context.Process(
        target=_latency_worker, args=(name, where, count, ready, results), daemon=True
    )
    worker.start()
    lags: list[float] = []
    error = None
    try:
        if not ready.wait(_TIMEOUT):
            raise TimeoutError("the worker process did not start")
        time.sleep(0.2)  # in its take by now
        for n in range(count):
            sent = time.time()
            owner.put({"n": n})
            got, at = results.get(timeout=60)
            if got != n:
                error = str(at)
                break
            lags.append((at - sent) * 1000)
    finally:
        worker.join(10)
        if worker.is_alive():
            worker.terminate()
        owner.close()
    lags.sort()
    return {
        "samples": len(lags),
        "p50_ms": statistics.median(lags) if lags else None,
        "p99_ms": lags[min(len(lags) - 1, round(0.99 * (len(lags) - 1)))] if lags else None,
        "error": error,
    }


# -- RQ: its own workers (processes), not the take-and-ack loop above ---------------------
def rq_job(n: int) -> int:
    """The job RQ's workers run: counts its run of ``n`` (a duplicate shows as 2)."""
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    job.connection.hincrby(f"{job.origin}:done", str(n), 1)
    return n


def _rq_worker(name: str, barrier: Any, results: Any) -> None:
    """An RQ ``SimpleWorker`` (no fork per job) in burst mode: runs jobs until none is
    left, from when every worker is ready."""
    try:
        import redis
        from rq import Queue, SimpleWorker

        from .peers import REDIS_HOST, REDIS_PORT

        connection = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        worker = SimpleWorker([Queue(name, connection=connection)], connection=connection)
        barrier.wait(_TIMEOUT)
        start = time.perf_counter()
        worker.work(burst=True, logging_level="WARNING")
        results.put((start, time.perf_counter(), None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        results.put((0.0, 0.0, f"{type(exc).__name__}: {exc}"))


def rq_throughput(where: str, jobs: int, processes: int) -> dict[str, Any]:
    """RQ on the bench's Redis: ``jobs`` enqueued by one thread (``Queue.enqueue``), then
    run by ``processes`` worker processes, each an RQ ``SimpleWorker`` in burst mode.
    Every job must run exactly once."""
    import redis
    from rq import Queue

    from .peers import REDIS_HOST, REDIS_PORT

    name = _redis_name(where)
    connection = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
    queue = Queue(name, connection=connection)
    try:
        queue.empty()  # type: ignore[no-untyped-call]  # rq 3 has no hints here
        connection.delete(f"{name}:done")
        start = time.perf_counter()
        for n in range(jobs):
            queue.enqueue(rq_job, n, result_ttl=600)
        put_seconds = time.perf_counter() - start
        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(processes), context.Queue()
        workers = [
            context.Process(target=_rq_worker, args=(name, barrier, results), daemon=True)
            for _ in range(processes)
        ]
        for process in workers:
            process.start()
        found = [results.get(timeout=_TIMEOUT) for _ in workers]
        for process in workers:
            process.join(10)
            if process.is_alive():
                process.terminate()
        runs = {int(n): int(count) for n, count in connection.hgetall(f"{name}:done").items()}
    finally:
        queue.empty()  # type: ignore[no-untyped-call]
        for registry in (queue.finished_job_registry, queue.failed_job_registry):
            for job_id in registry.get_job_ids():
                registry.remove(job_id, delete_job=True)
        connection.delete(f"{name}:done")
        connection.close()
    errors = [error for *_, error in found if error is not None]
    seconds = max(end for _, end, _ in found) - min(start for start, _, _ in found)
    return {
        "jobs": jobs,
        "workers": f"{processes}p",
        "put_per_s": jobs / put_seconds if put_seconds else None,
        "take_ack_per_s": sum(runs.values()) / seconds if seconds > 0 and not errors else None,
        "exactly_once": runs == dict.fromkeys(range(jobs), 1),
        "error": errors[0] if errors else None,
    }


# -- procrastinate: PostgreSQL's job queue, its own workers (processes) ---------------------
def _procrastinate_app(conninfo: str) -> tuple[Any, Any]:
    """A procrastinate app on ``conninfo`` (a libpq URL) and its bench task."""
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=conninfo))

    @app.task(name="bench_job", queue="bench")
    def bench_job(n: int) -> int:
        return n

    return app, bench_job


def _procrastinate_worker(conninfo: str, barrier: Any, results: Any) -> None:
    """A procrastinate worker (one job at a time) until no job is left, from when every
    worker is ready."""
    try:
        app, _ = _procrastinate_app(conninfo)
        barrier.wait(_TIMEOUT)
        start = time.perf_counter()
        app.run_worker(queues=["bench"], wait=False, install_signal_handlers=False)
        results.put((start, time.perf_counter(), None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        results.put((0.0, 0.0, f"{type(exc).__name__}: {exc}"))


def procrastinate_throughput(url: str, jobs: int, processes: int) -> dict[str, Any]:
    """procrastinate in the PostgreSQL schema of ``url`` (reactor's kind of URL): its
    schema applied, ``jobs`` deferred by one thread, then run by ``processes`` worker
    processes (``run_worker(wait=False)``). Every job must run exactly once: one
    "started" event each."""
    import sqlalchemy as sa

    conninfo = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    app, task = _procrastinate_app(conninfo)
    with app.open():
        app.schema_manager.apply_schema()
        start = time.perf_counter()
        for n in range(jobs):
            task.defer(n=n)
        put_seconds = time.perf_counter() - start
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(
            target=_procrastinate_worker, args=(conninfo, barrier, results), daemon=True
        )
        for _ in range(processes)
    ]
    for process in workers:
        process.start()
    found = [results.get(timeout=_TIMEOUT) for _ in workers]
    for process in workers:
        process.join(10)
        if process.is_alive():
            process.terminate()
    import psycopg

    with psycopg.connect(conninfo) as conn:
        started = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM procrastinate_events "
            "WHERE type = 'started'"
        ).fetchone()
        succeeded = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()
    runs, distinct = started if started is not None else (0, 0)
    errors = [error for *_, error in found if error is not None]
    seconds = max(end for _, end, _ in found) - min(start for start, _, _ in found)
    return {
        "jobs": jobs,
        "workers": f"{processes}p",
        "put_per_s": jobs / put_seconds if put_seconds else None,
        "take_ack_per_s": runs / seconds if seconds > 0 and not errors else None,
        "exactly_once": runs == distinct == jobs and succeeded == (jobs,),
        "error": errors[0] if errors else None,
    }
