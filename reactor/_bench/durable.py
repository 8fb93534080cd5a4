"""Durable workflows against DBOS (SPEC §14, issue 26): 3-step workflows per second in
one process and in four worker processes, and what a recorded step costs.

Every measurement runs in fresh spawned processes, reactor's as DBOS's (DBOS is one
instance per process, configured globally), on a fresh database of the same kind: a
SQLite file, or a PostgreSQL schema. The peers' side of each measurement is in
``durable_reactor`` and ``durable_dbos``, with the same functions:

- ``one_process(target, count, threads)``: serve (``threads`` worker threads), start
  ``count`` runs of the 3-step workflow from the main thread, wait for every result;
- ``steps(target, steps, count)``: ``count`` workflows of one step, then of ``steps``
  steps, one at a time: the time (and, for reactor, the commits) a step adds;
- ``starter`` and ``worker``: four worker processes serve; once all are ready the
  starter starts ``count`` runs; from the first start to the last run's recorded end.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import multiprocessing
import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .backends import Backend

__all__ = [
    "CELLS",
    "DURABLE_PEERS",
    "Plan",
    "durable_peers",
    "measure_durable",
    "median_durable",
    "run_durable",
]

DURABLE_PEERS = ("reactor", "dbos")
CELLS = ("1p", "4p", "steps")
_TIMEOUT = 600.0  # seconds any wait gives up after


@dataclass(frozen=True)
class Plan:
    """What each round measures: ``count`` 3-step workflows per cell, ``threads`` at a
    time in each process, and workflows of 1 and ``steps`` steps (``step_count`` of
    each) for a step's cost."""

    rounds: int
    count: int
    steps: int
    step_count: int
    threads: int = 4
    processes: int = 4


_MODULES = {"reactor": "reactor._bench.durable_reactor", "dbos": "reactor._bench.durable_dbos"}


def durable_peers() -> tuple[list[str], dict[str, str]]:
    """The workflow engines that can run here, and why the others cannot."""
    try:
        import dbos  # type: ignore[import-untyped, import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        return ["reactor"], {"dbos": "not installed (pip install 'reactor-state[bench]')"}
    return list(DURABLE_PEERS), {}


def _child(module: str, function: str, args: tuple[Any, ...], results: Any) -> None:
    """A spawned process: ``module.function(*args)``, its figures (or its error) sent
    back."""
    try:
        results.put(getattr(importlib.import_module(module), function)(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _in_process(peer: str, function: str, *args: Any) -> dict[str, Any]:
    """``function`` of ``peer``'s side, in a fresh spawned process."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(
        target=_child, args=(_MODULES[peer], function, args, results), daemon=True
    )
    process.start()
    try:
        found: dict[str, Any] = results.get(timeout=_TIMEOUT)
    finally:
        process.join(30)
        if process.is_alive():
            process.terminate()
    return found


def _processes(peer: str, target: str, count: int, processes: int, threads: int) -> dict[str, Any]:
    """``processes`` worker processes serve ``peer``'s workflow; a starter process starts
    ``count`` runs once every worker is ready. The figures are the starter's, with the
    workers' commits added."""
    context = multiprocessing.get_context("spawn")
    module = importlib.import_module(_MODULES[peer])
    barrier, stop = context.Barrier(processes + 1), context.Event()
    ready, results, served = context.Event(), context.Queue(), context.Queue()
    starter = context.Process(
        target=module.starter,
        args=(target, count, threads, ready, barrier, stop, results),
        daemon=True,
    )
    starter.start()
    workers: list[Any] = []
    try:
        if not ready.wait(_TIMEOUT):
            raise TimeoutError("the starter process did not get ready")
        workers = [
            context.Process(
                target=module.worker, args=(target, threads, barrier, stop, served), daemon=True
            )
            for _ in range(processes)
        ]
        for process in workers:
            process.start()
        found: dict[str, Any] = results.get(timeout=_TIMEOUT)
        stop.set()
        by_worker = [served.get(timeout=60) for _ in workers]
    finally:
        stop.set()
        for process in [starter, *workers]:
            process.join(30)
            if process.is_alive():
                process.terminate()
    errors = [one["error"] for one in by_worker if one.get("error")]
    if errors and not found.get("error"):
        found["error"] = errors[0]
    if found.get("commits") is not None:
        found["commits"] += sum(one.get("commits") or 0 for one in by_worker)
        found["commits_per_workflow"] = found["commits"] / count
    found["ran_by_worker"] = [one.get("ran") for one in by_worker]
    return found


def measure_durable(
    peer: str, cell: str, target: str, *, count: int, steps: int, threads: int
) -> dict[str, Any]:
    """One cell of one peer on a fresh ``target``: "1p" (one process), "4p" (four worker
    processes) or "steps" (a recorded step's cost). A failure is in ``error``."""
    try:
        if cell == "steps":
            return _in_process(peer, "steps", target, steps, count)  # count: step_count
        if cell == "1p":
            return _in_process(peer, "one_process", target, count, threads)
        return _processes(peer, target, count, int(cell[:-1]), threads)
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        return {"error": f"{type(exc).__name__}: {exc}"}


_FIGURES = ("per_s", "step_us", "commits_per_workflow", "commits_per_step", "seconds")


def median_durable(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the rounds (each round's kept in ``rounds``); a
    cell is correct only if every round was."""
    merged = dict(runs[0])
    for figure in _FIGURES:
        values = [run[figure] for run in runs if run.get(figure) is not None]
        merged[figure] = statistics.median(values) if values else None
    merged["rounds"] = [run.get("per_s", run.get("step_us")) for run in runs]
    merged["correct"] = all(run.get("correct") is True for run in runs)
    merged["error"] = next((run["error"] for run in runs if run.get("error")), None)
    return merged


def _cell_round(
    backend: Backend, root: str, peer: str, cell: str, number: int, plan: Plan
) -> dict[str, Any]:
    """``peer``'s ``cell`` on a fresh database (a folder, or a PostgreSQL schema)."""
    location = os.path.join(root, f"durable-r{number}-{peer}-{cell}")
    os.makedirs(location)
    try:
        with backend.location(location, f"d{number}-{peer}-{cell}") as where:
            count = plan.step_count if cell == "steps" else plan.count
            cell_name = f"{plan.processes}p" if cell == "4p" else cell
            return measure_durable(
                peer, cell_name, where, count=count, steps=plan.steps, threads=plan.threads
            )
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        shutil.rmtree(location, ignore_errors=True)


def run_durable(
    backend: Backend, root: str, plan: Plan, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every cell of every engine that can run here, ``plan.rounds`` times, the peers
    one after the other within a cell (so they see the machine alike); medians, the
    ratios reactor ÷ DBOS, and the issue's targets."""
    names, skipped = durable_peers()
    found: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for number in range(plan.rounds):
        for cell in CELLS:
            for peer in names:
                say(f"durable workflows round {number + 1}/{plan.rounds}: {peer} {cell}")
                figures = _cell_round(backend, root, peer, cell, number, plan)
                found.setdefault(peer, {}).setdefault(cell, []).append(figures)
    medians = {
        peer: {cell: median_durable(runs) for cell, runs in by_cell.items()}
        for peer, by_cell in found.items()
    }
    by_round = [  # each round's own ratios: how much the machine moved them
        _ratios(
            {
                peer: {cell: runs[number] for cell, runs in cells.items()}
                for peer, cells in found.items()
            }
        )
        for number in range(plan.rounds)
    ]
    return {
        "settings": dataclasses.asdict(plan),
        "dbos_version": _version("dbos"),
        "skipped": skipped,
        "figures": medians,
        "ratios": _ratios(medians),
        "ratios_by_round": by_round,
        "targets": _targets(backend.name, medians),
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ratios(medians: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float | None]:
    """reactor ÷ DBOS per cell: workflows/s, and for steps DBOS's µs ÷ reactor's."""
    mine, theirs = medians.get("reactor", {}), medians.get("dbos", {})
    found: dict[str, float | None] = {}
    for cell in CELLS:
        figure = "step_us" if cell == "steps" else "per_s"
        a = mine.get(cell, {}).get(figure)
        b = theirs.get(cell, {}).get(figure)
        if not a or not b:
            found[cell] = None
        else:
            found[cell] = b / a if cell == "steps" else a / b
    return found


def _targets(backend: str, medians: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Issue 26's targets: on SQLite reactor at least 4 times DBOS in one process and in
    four; on PostgreSQL 1.5 times with four; a step's record one commit."""
    ratios = _ratios(medians)
    wanted = {"1p": 4.0, "4p": 4.0} if backend == "sqlite" else {"4p": 1.5}
    targets: list[dict[str, Any]] = []
    for cell, times in wanted.items():
        found = ratios[cell]
        targets.append(
            {
                "text": f"{cell}: reactor ≥ {times:g} x DBOS",
                "value": found,
                "ok": None if found is None else found >= times,
            }
        )
    per_step = medians.get("reactor", {}).get("steps", {}).get("commits_per_step")
    targets.append(
        {
            "text": "a recorded step: one commit",
            "value": per_step,
            "ok": None if per_step is None else per_step <= 1.05,
        }
    )
    return targets
