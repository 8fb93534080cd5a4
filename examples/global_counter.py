"""A global counter: concurrent threads, then other processes, on one key, no lost update.

    python examples/global_counter.py

Threads of one process share one engine: the scope's actor serializes their increments
(and commits those that queue up together in one transaction). Other processes open the
same file with engines of their own; SQLite's write lock, taken with BEGIN IMMEDIATE
before a write reads the current value, serializes them with this one.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import threading
import time
from pathlib import Path

import reactor

THREADS = 8
PROCESSES = 2
INCREMENTS = 250  # per thread, and per process


def increment_many(jobs: reactor.Scope, times: int) -> None:
    for _ in range(times):
        jobs.increment("done")


def child(path: Path) -> None:
    """The work of one extra process: its own engine on the same file."""
    with reactor.open(path) as state:
        increment_many(state.scope("jobs"), INCREMENTS)


def with_threads(jobs: reactor.Scope) -> None:
    # A handle, and the scopes taken from it, may be shared by any number of threads.
    threads = [
        threading.Thread(target=increment_many, args=(jobs, INCREMENTS)) for _ in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def with_processes(path: Path) -> None:
    # spawn: a fresh interpreter per child, with no engine inherited from this one.
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=child, args=(path,)) for _ in range(PROCESSES)]
    for process in children:
        process.start()
    for process in children:
        process.join()
        assert process.exitcode == 0, f"a child process failed with exit code {process.exitcode}"


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "counter.db"
        with reactor.open(path) as state:
            jobs = state.scope("jobs")

            start = time.perf_counter()
            with_threads(jobs)
            total = jobs.get("done")
            elapsed = time.perf_counter() - start
            print(f"{THREADS} threads x {INCREMENTS}: done = {total} ({elapsed:.2f} s)")
            assert total == THREADS * INCREMENTS

            start = time.perf_counter()
            with_processes(path)
            total = jobs.get("done")  # reads see what other processes committed
            elapsed = time.perf_counter() - start
            print(f"+ {PROCESSES} processes x {INCREMENTS}: done = {total} ({elapsed:.2f} s)")
            assert total == (THREADS + PROCESSES) * INCREMENTS


if __name__ == "__main__":
    main()
