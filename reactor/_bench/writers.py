"""How reactor's writes/s grow with writers, and the server's ``pgbench -N`` beside them.

A cell is a number of processes, each with a number of threads, every thread setting a
~100-byte value for a fixed time on a fresh database: each writer on a scope of its own
(``own_scope``), or all on one scope (``one_scope``), each writer cycling through keys
of its own. The processes are spawned once for the whole section and handed one cell
after another, so their start-up is never timed; every writer starts at the same
instant (``perf_counter_ns`` is the system-wide monotonic clock) and stops after the
cell's seconds. A process opens one engine for its threads, as a program would.

On PostgreSQL the server's own ``pgbench -N`` (the TPC-B-like script without the
contended branch and teller updates: three statements and an insert per transaction)
runs with 1, 2, 4, 8 clients in a scratch schema, dropped afterwards.
"""

from __future__ import annotations

import glob
import itertools
import multiprocessing
import os
import queue
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .backends import Backend, libpq_environment
from .peer import make_value, reactor_target
from .workloads import Phase, figure

__all__ = [
    "LAYOUTS",
    "Plan",
    "WriterPool",
    "beside_pgbench",
    "cell_key",
    "cell_label",
    "find_pgbench",
    "plan_for",
    "run_pgbench",
    "run_writers",
    "summarize",
    "writer_targets",
]

LAYOUTS: Final = ("own_scope", "one_scope")
_KEYS: Final = 1000  # keys each writer cycles through: the table stays small
_START_DELAY_NS: Final = 200_000_000  # from "go" to the first write: every worker has it
_TIMEOUT: Final = 180.0  # seconds to wait for a worker's answer
_PGBENCH_SCALE: Final = 1  # 100,000 accounts: -N touches no shared row


@dataclass(frozen=True)
class Plan:
    """Which cells to measure, for how long, how often."""

    threads: tuple[int, ...]  # writers in one process
    processes: tuple[int, ...]  # processes of one writer each
    grid: tuple[tuple[int, int], ...]  # more (processes, threads) cells
    seconds: float
    rounds: int
    pgbench_seconds: int

    def cells(self) -> list[tuple[int, int]]:
        """Every (processes, threads) cell, each once."""
        found = [(1, n) for n in self.threads] + [(n, 1) for n in self.processes]
        return list(dict.fromkeys([*found, *self.grid]))

    def clients(self) -> list[int]:
        """pgbench's client counts: as many as writers, one process of each."""
        return sorted({*self.threads, *self.processes})


def plan_for(*, quick: bool, rounds: int) -> Plan:
    """The full plan (1, 2, 4, 8 writers, and 4 processes x 4 threads), or a tiny one."""
    if quick:
        return Plan((1, 2), (1, 2), (), seconds=0.3, rounds=rounds, pgbench_seconds=1)
    return Plan(
        (1, 2, 4, 8), (1, 2, 4, 8), ((4, 4),), seconds=2.0, rounds=rounds, pgbench_seconds=5
    )


def cell_key(processes: int, threads: int) -> tuple[str, str]:
    """Where a cell goes in the JSON: ``threads``/``N``, ``processes``/``N``, or
    ``processes_x_threads``/``PxT``."""
    if processes == 1:
        return "threads", str(threads)
    if threads == 1:
        return "processes", str(processes)
    return "processes_x_threads", f"{processes}x{threads}"


def cell_label(processes: int, threads: int) -> str:
    """How a cell is named in the table: ``4p x 4t``."""
    return f"{processes}p x {threads}t"


# -- the worker processes --------------------------------------------------------------
def _write(
    scope: Any, prefix: str, start_ns: int, end_ns: int, into: list[Phase], errors: list[str]
) -> None:
    """One writer: set values from ``start_ns`` until ``end_ns``."""
    try:
        clock = time.perf_counter_ns
        wait = (start_ns - clock()) / 1e9
        if wait > 0:
            time.sleep(wait)
        samples: list[int] = []
        append = samples.append
        n = 0
        start = previous = clock()
        while previous < end_ns:
            scope.set(f"{prefix}{n % _KEYS}", make_value(n))
            now = clock()
            append(now - previous)
            previous = now
            n += 1
        into.append(Phase(start, previous, samples))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        errors.append(f"{type(exc).__name__}: {exc}")


def _cell(reactor: Any, index: int, job: tuple[Any, ...], jobs: Any, results: Any) -> Any:
    """One cell in one worker: open, say ready, wait for the start, write, close."""
    target, threads, layout, seconds = job
    with reactor.open(target) as state:
        scopes = [
            state.scope(f"w{index}-{n}" if layout == "own_scope" else "shared")
            for n in range(threads)
        ]
        results.put(("ready", index, None))
        signal = jobs.get(timeout=_TIMEOUT)
        if signal[0] != "go":
            return []
        start_ns = signal[1]
        end_ns = start_ns + int(seconds * 1e9)
        phases: list[Phase] = []
        errors: list[str] = []
        writers = [
            threading.Thread(
                target=_write,
                args=(scope, f"{index}.{n}.", start_ns, end_ns, phases, errors),
                name=f"bench-writer-{index}-{n}",
            )
            for n, scope in enumerate(scopes)
        ]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
    if errors:
        raise RuntimeError(errors[0])
    return phases


def _worker_main(index: int, jobs: Any, results: Any) -> None:
    """A worker process: cells, one after another, until told to stop (None)."""
    import reactor

    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            results.put(("done", index, _cell(reactor, index, job, jobs, results)))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
            results.put(("error", index, f"{type(exc).__name__}: {exc}"))


class WriterPool:
    """Spawned worker processes, each running the cells it is handed."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._results = context.Queue()
        self._jobs = [context.Queue() for _ in range(size)]
        self._workers = [
            context.Process(
                target=_worker_main,
                args=(n, self._jobs[n], self._results),
                name=f"bench-writers-{n}",
                daemon=True,
            )
            for n in range(size)
        ]
        for process in self._workers:
            process.start()

    def _answer(self) -> tuple[str, int, Any]:
        """The next worker's answer; a worker that died is an error, not a long wait."""
        deadline = time.monotonic() + _TIMEOUT
        while True:
            try:
                found: tuple[str, int, Any] = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self._workers if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"writer process {dead[0]} ended") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer from the writers in {_TIMEOUT:.0f} s") from None
                continue
            return found

    def run(
        self, target: str, processes: int, threads: int, layout: str, seconds: float
    ) -> dict[str, Any]:
        """One cell: every worker opens ``target``; all start together; the figure.

        Raises:
            RuntimeError: a worker failed (its error is the message).
        """
        for n in range(processes):
            self._jobs[n].put((target, threads, layout, seconds))
        ready: list[int] = []
        errors: list[str] = []
        for _ in range(processes):
            kind, index, payload = self._answer()
            if kind == "ready":
                ready.append(index)
            else:
                errors.append(payload)
        start_ns = time.perf_counter_ns() + _START_DELAY_NS
        for n in ready:
            self._jobs[n].put(("abort",) if errors else ("go", start_ns))
        phases: list[Phase] = []
        for _ in ready:
            kind, _index, payload = self._answer()
            if kind == "error":
                errors.append(payload)
            else:
                phases.extend(payload)
        if errors:
            raise RuntimeError(errors[0])
        return figure(phases)

    def close(self) -> None:
        for jobs in self._jobs:
            jobs.put(None)
        for process in self._workers:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join()


# -- pgbench -----------------------------------------------------------------------------
def find_pgbench() -> str | None:
    """pgbench on the PATH, else in the newest ``/usr/lib/postgresql/*/bin``."""
    found = shutil.which("pgbench")
    if found:
        return found

    def version(path: str) -> tuple[int, ...]:
        number = path.split("/")[-3]
        return tuple(int(part) for part in number.split(".") if part.isdigit())

    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), key=version)
    return installed[-1] if installed else None


def _pgbench(command: list[str], environment: dict[str, str], timeout: float) -> str:
    done = subprocess.run(  # noqa: S603 - pgbench, with arguments made here
        command,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"{' '.join(command[:2])}... exit {done.returncode}: {lines[-1:]}")
    return done.stdout


def _pgbench_round(
    pgbench: str, environment: dict[str, str], clients: Sequence[int], seconds: int
) -> dict[str, dict[str, float]]:
    """``pgbench -N`` with each number of clients: its tps and mean latency."""
    cpus = os.cpu_count() or 1
    found: dict[str, dict[str, float]] = {}
    for count in clients:
        command = [pgbench, "-N", "-c", str(count), "-j", str(min(count, cpus))]
        output = _pgbench([*command, "-T", str(seconds)], environment, seconds + 120.0)
        tps = re.search(r"^tps = ([0-9.]+)", output, re.MULTILINE)
        latency = re.search(r"^latency average = ([0-9.]+) ms", output, re.MULTILINE)
        if tps is None:
            raise RuntimeError(f"no 'tps = ' in pgbench's output: {output[-200:]!r}")
        found[str(count)] = {
            "tps": float(tps.group(1)),
            "latency_ms": float(latency.group(1)) if latency else float("nan"),
        }
    return found


def run_pgbench(
    backend: Backend, directory: str, clients: Sequence[int], seconds: int, rounds: int
) -> dict[str, Any]:
    """``pgbench -N`` on ``backend``'s server in a scratch schema: medians over
    ``rounds``. Never raises: what went wrong is in ``note``."""
    pgbench = find_pgbench()
    about: dict[str, Any] = {
        "available": False,
        "command": f"pgbench -i -s {_PGBENCH_SCALE}; pgbench -N -c C -j min(C, CPUs) -T {seconds}",
        "clients": {},
    }
    if pgbench is None:
        about["note"] = "pgbench not found (it comes with PostgreSQL's server or client)"
        return about
    about["path"] = pgbench
    try:
        with backend.location(directory, "pgbench") as url:
            environment = libpq_environment(url)
            _pgbench([pgbench, "-i", "-q", "-s", str(_PGBENCH_SCALE)], environment, timeout=300.0)
            per_round = [
                _pgbench_round(pgbench, environment, clients, seconds) for _ in range(rounds)
            ]
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        about["note"] = f"pgbench failed: {exc}"
        return about
    about["available"] = True
    about["clients"] = {
        str(count): {
            "tps": statistics.median(one[str(count)]["tps"] for one in per_round),
            "latency_ms": statistics.median(one[str(count)]["latency_ms"] for one in per_round),
            "rounds": [one[str(count)]["tps"] for one in per_round],
        }
        for count in clients
    }
    return about


# -- the section -------------------------------------------------------------------------
def _with_pgbench(backend: Backend, root: str, plan: Plan, section: dict[str, Any]) -> None:
    """Add pgbench's figures for the same clients to ``section``, and ratios to them."""
    directory = os.path.join(root, "pgbench")
    os.makedirs(directory)
    try:
        section["pgbench"] = run_pgbench(
            backend, directory, plan.clients(), plan.pgbench_seconds, plan.rounds
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    beside_pgbench(section)


def run_writers(
    backend: Backend,
    root: str,
    plan: Plan,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Every cell of ``plan`` on ``backend``, ``plan.rounds`` times; medians and ratios.

    A failure ends the section; it is returned under ``error`` with what was measured.
    """
    import reactor

    cells = plan.cells()
    measured: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    error: str | None = None
    pool = WriterPool(max(p for p, _ in cells))
    try:
        for number in range(plan.rounds):
            for processes, threads in cells:
                for layout in LAYOUTS if processes * threads > 1 else LAYOUTS[:1]:
                    say(
                        f"writers round {number + 1}/{plan.rounds}: "
                        f"{cell_label(processes, threads)} {layout.replace('_', ' ')}"
                    )
                    tag = f"w{number}-{processes}x{threads}-{layout[:3]}"
                    directory = os.path.join(root, tag)
                    os.makedirs(directory)
                    try:
                        with backend.location(directory, tag) as where:
                            target = reactor_target(where)
                            reactor.open(target).close()  # the tables, before the writers
                            found = pool.run(target, processes, threads, layout, plan.seconds)
                    finally:
                        shutil.rmtree(directory, ignore_errors=True)
                    measured.setdefault((processes, threads, layout), []).append(found)
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        error = f"{type(exc).__name__}: {exc}"
    finally:
        pool.close()
    section = summarize(measured, cells)
    section["settings"] = {
        "seconds_per_cell": plan.seconds,
        "rounds": plan.rounds,
        "keys_per_writer": _KEYS,
        "cells": [list(cell) for cell in cells],
    }
    if backend.name == "postgresql" and error is None:
        say("writers: pgbench -N")
        _with_pgbench(backend, root, plan, section)
    section["targets"] = writer_targets(section, backend.name)
    if error is not None:
        section["error"] = error
    return section


def summarize(
    measured: dict[tuple[int, int, str], list[dict[str, Any]]], cells: list[tuple[int, int]]
) -> dict[str, Any]:
    """``section[kind][layout][count]``: medians over the rounds, and the ratio to one
    writer (one writer is one cell: it stands in both layouts)."""
    section: dict[str, Any] = {}
    for processes, threads in cells:
        places = [cell_key(processes, threads)]
        if processes * threads == 1:
            places.append(("processes", "1"))  # one writer: one thread, one process
        for (kind, count), layout in itertools.product(places, LAYOUTS):
            figures = measured.get((processes, threads, layout)) or (
                measured.get((processes, threads, LAYOUTS[0])) if processes * threads == 1 else None
            )
            if not figures:
                continue
            section.setdefault(kind, {}).setdefault(layout, {})[count] = {
                "processes": processes,
                "threads": threads,
                "writers": processes * threads,
                "writes_per_s": statistics.median(one["ops_per_s"] for one in figures),
                "p50_us": statistics.median(one["p50_us"] for one in figures),
                "p99_us": statistics.median(one["p99_us"] for one in figures),
                "rounds": [one["ops_per_s"] for one in figures],
            }
    one = section.get("threads", {}).get(LAYOUTS[0], {}).get("1")
    for layouts in section.values():
        for cells_of in layouts.values():
            for entry in cells_of.values():
                entry["vs_one_writer"] = (
                    entry["writes_per_s"] / one["writes_per_s"]
                    if one and one["writes_per_s"]
                    else None
                )
    return section


def _pgbench_for(entry: dict[str, Any]) -> str:
    """Which pgbench client count stands beside a cell: as many clients as writers;
    for several processes of several threads, one per process (issue 15's comparison)."""
    if entry["processes"] > 1 and entry["threads"] > 1:
        return str(entry["processes"])
    return str(entry["writers"])


def beside_pgbench(section: dict[str, Any]) -> None:
    """Put pgbench's tps beside each cell: ``pgbench_clients`` and ``vs_pgbench``."""
    clients = section.get("pgbench", {}).get("clients", {})
    for kind in ("threads", "processes", "processes_x_threads"):
        for cells_of in section.get(kind, {}).values():
            for entry in cells_of.values():
                beside = clients.get(_pgbench_for(entry))
                entry["pgbench_clients"] = int(_pgbench_for(entry))
                entry["vs_pgbench"] = (
                    entry["writes_per_s"] / beside["tps"] if beside and beside["tps"] else None
                )


def _writes(section: dict[str, Any], kind: str, count: str) -> float | None:
    entry = section.get(kind, {}).get(LAYOUTS[0], {}).get(count)
    return None if entry is None else float(entry["writes_per_s"])


def _target(name: str, mine: float | None, theirs: float | None, at_least: float) -> dict[str, Any]:
    measured = None if mine is None or not theirs else mine / theirs
    return {
        "target": name,
        "at_least": at_least,
        "measured": measured,
        "text": "n/a" if measured is None else f"{measured:.2f}x",
        "ok": None if measured is None else measured >= at_least,
    }


def writer_targets(section: dict[str, Any], backend: str) -> list[dict[str, Any]]:
    """Issue 15's scaling targets for ``backend``, each measured or not (``ok`` None);
    writers on scopes of their own."""
    one = _writes(section, "threads", "1")
    if backend != "postgresql":
        return [_target("4 threads >= 1.5x one thread", _writes(section, "threads", "4"), one, 1.5)]
    clients = section.get("pgbench", {}).get("clients", {})

    def pgbench(count: str) -> float | None:
        found = clients.get(count)
        return None if found is None else float(found["tps"])

    return [
        _target(
            "1 process >= 0.8x pgbench -N -c1",
            _writes(section, "processes", "1"),
            pgbench("1"),
            0.8,
        ),
        _target(
            "1 process x 4 threads >= 2.5x one thread", _writes(section, "threads", "4"), one, 2.5
        ),
        _target(
            "4 processes >= 1.0x one process",
            _writes(section, "processes", "4"),
            _writes(section, "processes", "1"),
            1.0,
        ),
        _target(
            "4 processes x 4 threads >= 1.0x pgbench -N -c4",
            _writes(section, "processes_x_threads", "4x4"),
            pgbench("4"),
            1.0,
        ),
    ]
