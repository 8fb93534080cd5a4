"""reactor's side of the durable-workflow bench (``durable``): the workflows, and each
measurement, run in a process of its own. ``target`` is a folder (a SQLite file in it)
or a PostgreSQL URL naming a fresh schema (``peer.reactor_target``)."""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["one_process", "starter", "steps", "worker"]

_TIMEOUT = 600.0


def add_one(x: int) -> int:
    """Every step's work: nothing to speak of, so the record is what is measured."""
    return x + 1


def _open(target: str) -> Any:
    """The database at ``target`` with the bench's workflows registered."""
    import reactor

    from .peer import reactor_target

    state = reactor.open(reactor_target(target))

    @state.workflow("three")
    def three(run: reactor.Run, x: int) -> int:
        a = run.step("a", add_one, x)
        b = run.step("b", add_one, a)
        return int(run.step("c", add_one, b))

    @state.workflow("many")
    def many(run: reactor.Run, given: list[int]) -> int:
        x, count = given
        for _ in range(count):
            x = run.step("s", add_one, x)
        return x

    return state


def _commits(state: Any) -> int:
    return int(state.stats()["transactions"])


def one_process(target: str, count: int, threads: int) -> dict[str, Any]:
    """``threads`` worker threads serve; this thread starts ``count`` runs of the 3-step
    workflow and waits for every result."""
    state = _open(target)
    try:
        with state.serve(workflows=["three"], concurrency=threads):
            commits = _commits(state)
            start = time.perf_counter()
            handles = [state.start("three", n) for n in range(count)]
            results = [handle.result(timeout=_TIMEOUT) for handle in handles]
            seconds = time.perf_counter() - start
            commits = _commits(state) - commits
    finally:
        state.close()
    return {
        "count": count,
        "seconds": seconds,
        "per_s": count / seconds,
        "commits_per_workflow": commits / count,
        "correct": results == [n + 3 for n in range(count)],
    }


def steps(target: str, many: int, count: int) -> dict[str, Any]:
    """``count`` workflows of one step, then of ``many`` steps, one at a time (one worker
    thread): the time and commits each step past the first adds."""
    state = _open(target)
    spent: dict[int, list[float]] = {}
    commits: dict[int, int] = {}
    correct = True
    try:
        with state.serve(workflows=["many"], concurrency=1):
            state.start("many", [0, 1]).result(timeout=_TIMEOUT)  # warm: first run's costs
            for size in (1, many):
                before = _commits(state)
                for n in range(count):
                    start = time.perf_counter()
                    correct &= state.start("many", [n, size]).result(timeout=_TIMEOUT) == n + size
                    spent.setdefault(size, []).append(time.perf_counter() - start)
                commits[size] = _commits(state) - before
    finally:
        state.close()
    return {
        "count": count,
        "steps": many,
        "workflow_us": {str(size): statistics.median(spent[size]) * 1e6 for size in spent},
        "step_us": (statistics.median(spent[many]) - statistics.median(spent[1]))
        / (many - 1)
        * 1e6,
        "commits_per_step": (commits[many] - commits[1]) / count / (many - 1),
        "commits_per_workflow": commits[1] / count,
        "correct": correct,
    }


def starter(
    target: str,
    count: int,
    threads: int,  # noqa: ARG001 - same call as DBOS's: the workers say theirs
    ready: Any,
    barrier: Any,
    stop: Any,
    results: Any,
) -> None:
    """Once the workers are ready, start ``count`` runs (this process serves none) and
    wait for them; from the first start to the last run's recorded end."""
    try:
        state = _open(target)
        try:
            ready.set()
            barrier.wait(_TIMEOUT)
            commits, began = _commits(state), time.time()
            handles = [state.start("three", n) for n in range(count)]
            started = time.time() - began
            found = [handle.result(timeout=_TIMEOUT) for handle in handles]
            ended = max(state.run_info(handle.id).updated for handle in handles)
            commits = _commits(state) - commits
        finally:
            state.close()
        results.put(
            {
                "count": count,
                "seconds": ended - began,
                "per_s": count / (ended - began),
                "commits": commits,
                "started_s": started,
                "correct": found == [n + 3 for n in range(count)],
            }
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        stop.set()
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def worker(target: str, threads: int, barrier: Any, stop: Any, served: Any) -> None:
    """A worker process: ``threads`` worker threads serve until ``stop``."""
    try:
        state = _open(target)
        try:
            with state.serve(workflows=["three"], concurrency=threads):
                commits = _commits(state)
                barrier.wait(_TIMEOUT)
                stop.wait(_TIMEOUT)
                commits = _commits(state) - commits
        finally:
            state.close()
        served.put({"commits": commits, "ran": None})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        served.put({"error": f"{type(exc).__name__}: {exc}"})
