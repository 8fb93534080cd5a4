"""The workflow primitives under load (SPEC §13): how late timers fire when many are
pending, and a work queue's put, take and ack against what a user would pick instead.

Each measurement opens its own database at ``target`` (a file path or a PostgreSQL URL)
and returns plain figures; ``reactor bench`` runs them on a fresh database each.
"""

from __future__ import annotations

import copy
import json
import os
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["QUEUE_PEERS", "queue_peers", "queue_throughput", "timer_lag"]

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


class QueuePeer(Protocol):
    """A work queue as the bench drives it: put an item; take one (None when empty),
    ack what was taken. Each worker thread gets its own handle (``worker()``)."""

    def put(self, item: Any) -> None: ...

    def take(self) -> tuple[Any, Any] | None: ...  # (handle for ack, item)

    def ack(self, taken: Any) -> None: ...

    def worker(self) -> QueuePeer: ...

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

    def __init__(self, name: str) -> None:
        import redis

        from .peers import REDIS_HOST, REDIS_PORT

        self._name = name
        self._client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        self._client.delete(name, f"{name}:taken")

    def put(self, item: Any) -> None:
        self._client.rpush(self._name, json.dumps(item))

    def take(self) -> tuple[Any, Any] | None:
        wait: Any = 0.01  # seconds; Redis takes a float (redis-py's hints say int)
        raw = self._client.blmove(self._name, f"{self._name}:taken", wait, "LEFT", "RIGHT")
        return None if raw is None else (raw, json.loads(raw))

    def ack(self, taken: Any) -> None:
        self._client.lrem(f"{self._name}:taken", 1, taken)

    def worker(self) -> RedisListQueue:
        return copy.copy(self)  # the same client: redis-py's pool is thread-safe

    def close(self) -> None:
        self._client.delete(self._name, f"{self._name}:taken")


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


QUEUE_PEERS: dict[str, Callable[[str], QueuePeer]] = {
    "reactor": ReactorQueue,
    "redis": lambda _where: RedisListQueue(f"reactor-bench-{uuid.uuid4().hex[:8]}"),
    "huey": lambda where: HueyQueue(os.path.join(where, "huey.db")),
    "sqlite3": lambda where: SQLiteTableQueue(os.path.join(where, "queue.db")),
}


def queue_peers(redis_missing: str | None) -> tuple[list[str], dict[str, str]]:
    """The queue peers that can run here, and why the others cannot."""
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
