"""Timing loops: one verb after another, in threads, processes or asyncio tasks.

Each worker runs the phases ``set``, ``get``, ``update``, ``increment``, ``delete`` on
keys of its own (``increment`` on one shared counter), waiting at a barrier before
each phase so that all workers start it together. A phase records every operation's
latency (``time.perf_counter_ns``, one clock read per operation) and its own start and
end; a figure is the operations of all workers over the span from the first start to
the last end. ``perf_counter_ns`` is the system-wide monotonic clock on Linux, macOS
and Windows, so spans from several processes compare.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .peer import Peer, make_value
from .peers import PEERS

__all__ = [
    "COUNTER",
    "VERBS",
    "Counts",
    "Phase",
    "calls_per_op",
    "event_latency_cross_process",
    "event_latency_in_process",
    "figure",
    "run_asyncio",
    "run_processes",
    "run_threads",
]

VERBS: Final = ("set", "get", "update", "increment", "delete")
COUNTER: Final = "counter"
_TIMEOUT: Final = 300.0  # seconds a worker waits at a barrier, or the parent for a worker
_CALLS_WORKER: Final = 99_999  # the keys calls_per_op writes: no timed worker's
_CALLS_COUNTER: Final = ("calls-counter",)  # what the loop's count increments


@dataclass(frozen=True)
class Counts:
    """Operations per worker: for each write verb, and for ``get``."""

    writes: int
    reads: int


@dataclass
class Phase:
    """One verb in one worker: when it started and ended, and each operation's ns."""

    start: int
    end: int
    samples: list[int]


def _percentile(ordered: Sequence[int], fraction: float) -> int:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def figure(phases: Sequence[Phase], transactions: int | None = None) -> dict[str, Any]:
    """Throughput and latency of the workers' phases of one verb, taken together; with
    the ``transactions`` the peer committed meanwhile, the writes in each."""
    samples = sorted(sample for phase in phases for sample in phase.samples)
    seconds = (max(p.end for p in phases) - min(p.start for p in phases)) / 1e9
    found: dict[str, Any] = {
        "ops": len(samples),
        "seconds": seconds,
        "ops_per_s": len(samples) / seconds if seconds > 0 else 0.0,
        "p50_us": _percentile(samples, 0.50) / 1000,
        "p99_us": _percentile(samples, 0.99) / 1000,
    }
    if transactions:
        found["writes_per_transaction"] = len(samples) / transactions
    return found


def _timed(
    call: Callable[..., Any], args: Sequence[tuple[Any, ...]], flush: Callable[[], None]
) -> Phase:
    clock = time.perf_counter_ns
    samples = [0] * len(args)
    start = previous = clock()
    for n, arguments in enumerate(args):
        call(*arguments)
        now = clock()
        samples[n] = now - previous
        previous = now
    flush()
    return Phase(start, clock(), samples)


def _plan(worker: int, counts: Counts) -> dict[str, list[tuple[Any, ...]]]:
    """Each verb's arguments, for one worker (made before any timing starts)."""
    keys = [f"w{worker}-{i}" for i in range(counts.writes)]
    return {
        "set": [(key, make_value(i)) for i, key in enumerate(keys)],
        "get": [(keys[i % len(keys)],) for i in range(counts.reads)],
        "update": [(key,) for key in keys],
        "increment": [(COUNTER,)] * counts.writes,
        "delete": [(key,) for key in keys],
    }


def worker_phases(
    peer: Peer, worker: int, counts: Counts, wait: Callable[[], object]
) -> dict[str, Phase]:
    """Every verb in turn on ``peer``, after ``wait()`` for the other workers."""
    plan = _plan(worker, counts)
    phases: dict[str, Phase] = {}
    for verb in VERBS:
        wait()
        phases[verb] = _timed(getattr(peer, verb), plan[verb], peer.flush)
    return phases


def _combine(
    per_worker: Sequence[dict[str, Phase]], marks: Sequence[int | None] = ()
) -> dict[str, dict[str, Any]]:
    """Each verb's figure; ``marks``: the peer's transactions before each phase and
    after the last (none for peers that cannot tell, and for processes)."""
    return {
        verb: figure([phases[verb] for phases in per_worker], _between(marks, n, verb))
        for n, verb in enumerate(VERBS)
    }


def _between(marks: Sequence[int | None], phase: int, verb: str) -> int | None:
    """The transactions committed during ``phase`` (None: not known, or a read)."""
    if verb == "get" or len(marks) <= phase + 1:
        return None
    start, end = marks[phase], marks[phase + 1]
    return None if start is None or end is None else end - start


def run_threads(peer: Peer, threads: int, counts: Counts) -> dict[str, dict[str, Any]]:
    """The phases in ``threads`` threads sharing ``peer``."""
    marks: list[int | None] = []  # read once all workers wait before a phase
    barrier = threading.Barrier(threads, action=lambda: marks.append(peer.transactions()))
    results: list[dict[str, Phase] | None] = [None] * threads
    errors: list[BaseException] = []

    def body(worker: int) -> None:
        try:
            results[worker] = worker_phases(peer, worker, counts, lambda: barrier.wait(_TIMEOUT))
        except BaseException as exc:  # noqa: BLE001 - raised again by the caller
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=body, args=(n,), name=f"bench-{n}") for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    real = [error for error in errors if not isinstance(error, threading.BrokenBarrierError)]
    if errors:
        raise (real or errors)[0]
    marks.append(peer.transactions())
    return _combine([result for result in results if result is not None], marks)


def calls_per_op(peer: Peer, ops: int) -> dict[str, float]:
    """Function calls (Python and C, as ``sys.setprofile`` sees them) per operation of
    each verb, in this thread, the adapter's own call included: counts, not times, so
    they do not move with the machine's load."""
    plan = _plan(_CALLS_WORKER, Counts(ops, ops))
    found: dict[str, float] = {}
    for verb in VERBS:
        call = getattr(peer, verb)
        with _Counted() as counted:
            for arguments in plan[verb]:
                call(*arguments)
        peer.flush()
        found[verb] = counted.calls / len(plan[verb])
    return found


class _Counted:
    """Counts the function calls (Python and C, as ``sys.setprofile`` sees them) this
    thread makes inside the ``with`` block, less the block's own."""

    _OWN = 2  # __exit__, and its sys.setprofile(None)

    def __init__(self) -> None:
        self.calls = 0

    def _count(self, _frame: Any, event: str, _arg: Any) -> None:
        if event in ("call", "c_call"):
            self.calls += 1

    def __enter__(self) -> _Counted:
        sys.setprofile(self._count)
        return self

    def __exit__(self, *_: object) -> None:
        sys.setprofile(None)
        self.calls -= self._OWN


def _process_main(
    name: str,
    location: str,
    worker: int,
    counts: Counts,
    barrier: Any,
    results: Any,
) -> None:
    """A process worker: its own handle on ``location``, the phases, the figures back."""
    try:
        peer = PEERS[name](location)
        try:
            phases = worker_phases(peer, worker, counts, lambda: barrier.wait(_TIMEOUT))
        finally:
            peer.close()
        results.put((worker, phases, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        barrier.abort()
        results.put((worker, None, f"{type(exc).__name__}: {exc}"))


def run_processes(
    name: str, location: str, processes: int, counts: Counts
) -> dict[str, dict[str, Any]]:
    """The phases in ``processes`` spawned processes, each with its own handle."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(
            target=_process_main,
            args=(name, location, n, counts, barrier, results),
            name=f"bench-{name}-{n}",
            daemon=True,
        )
        for n in range(processes)
    ]
    for process in workers:
        process.start()
    collected: list[dict[str, Phase]] = []
    failures: list[str] = []
    try:
        for _ in workers:
            _worker, phases, error = results.get(timeout=_TIMEOUT)
            if error is not None:
                failures.append(error)
            else:
                collected.append(phases)
    finally:
        for process in workers:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join()
    if failures:
        real = [error for error in failures if not error.startswith("BrokenBarrierError")]
        raise RuntimeError((real or failures)[0])
    return _combine(collected)


def run_asyncio(peer: Peer, tasks: int, counts: Counts) -> dict[str, dict[str, Any]]:
    """The phases in ``tasks`` concurrent asyncio tasks, ``counts`` shared among them."""
    return asyncio.run(_run_asyncio(peer, tasks, counts))


async def _run_asyncio(peer: Peer, tasks: int, counts: Counts) -> dict[str, dict[str, Any]]:
    writes = max(1, counts.writes // tasks)
    reads = max(1, counts.reads // tasks)
    plans = [_plan(10_000 + n, Counts(writes, reads)) for n in range(tasks)]
    clock = time.perf_counter_ns

    async def task(verb: str, args: Sequence[tuple[Any, ...]]) -> list[int]:
        samples = []
        for arguments in args:
            begun = clock()
            await peer.acall(verb, *arguments)
            samples.append(clock() - begun)
        return samples

    await peer.astart()
    try:
        figures: dict[str, dict[str, Any]] = {}
        for verb in VERBS:
            before = peer.transactions()
            start = clock()
            done = await asyncio.gather(*(task(verb, plan[verb]) for plan in plans))
            peer.flush()
            phase = Phase(start, clock(), [s for part in done for s in part])
            figures[verb] = figure([phase], _between([before, peer.transactions()], 0, verb))
        for verb, calls in (await _loop_calls_per_op(peer, tasks)).items():
            figures[verb]["loop_calls_per_op"] = calls
        return figures
    finally:
        await peer.astop()


async def _loop_calls_per_op(peer: Peer, tasks: int, ops: int = 10) -> dict[str, float]:
    """Function calls (Python and C, as ``sys.setprofile`` sees them) per operation on
    the loop's thread, ``tasks`` tasks calling at once, ``ops`` calls each: the loop's
    time that every other task waits for. On keys of no timed worker, and a counter of
    their own (the phases' count stays exact)."""
    plans = [_plan(_CALLS_WORKER + 1 + n, Counts(ops, ops)) for n in range(tasks)]
    found: dict[str, float] = {}
    for verb in VERBS:

        async def task(args: Sequence[tuple[Any, ...]], verb: str = verb) -> None:
            for arguments in args:
                await peer.acall(verb, *(_CALLS_COUNTER if verb == "increment" else arguments))

        with _Counted() as counted:
            await asyncio.gather(*(task(plan[verb]) for plan in plans))
        peer.flush()
        found[verb] = counted.calls / (ops * tasks)
    return found


# -- event delivery (reactor only) ----------------------------------------------------
def _latency(samples_ns: Sequence[int], sent: int) -> dict[str, Any]:
    ordered = sorted(samples_ns)
    return {
        "events": sent,
        "delivered": len(ordered),
        "p50_us": _percentile(ordered, 0.50) / 1000 if ordered else None,
        "p99_us": _percentile(ordered, 0.99) / 1000 if ordered else None,
    }


def event_latency_in_process(path: str, count: int) -> dict[str, Any]:
    """Commit-to-callback latency in one process.

    Each ``set`` is acknowledged (it returned), then the next waits until the callback
    has seen it. Latency is callback time minus acknowledgement time (0 when the
    callback ran first); ``from_call`` is from just before the ``set``.
    """
    import reactor

    arrivals: dict[int, int] = {}
    arrived = threading.Event()

    def on_event(event: reactor.ChangeEvent) -> None:
        now = time.perf_counter_ns()
        arrivals[event.new_value["seq"]] = now
        arrived.set()

    with reactor.open(path) as state:
        scope = state.scope("events")
        subscription = state.subscribe(on_event, scope="events")
        calls: list[int] = []
        acks: list[int] = []
        try:
            for seq in range(count):
                arrived.clear()
                calls.append(time.perf_counter_ns())
                scope.set("k", {"seq": seq, "stamp": calls[-1]})
                acks.append(time.perf_counter_ns())
                arrived.wait(5.0)
        finally:
            subscription.close()
    seen = [seq for seq in range(count) if seq in arrivals]
    result = _latency([max(0, arrivals[seq] - acks[seq]) for seq in seen], count)
    result["before_ack"] = sum(1 for seq in seen if arrivals[seq] < acks[seq])
    result["from_call"] = _latency([arrivals[seq] - calls[seq] for seq in seen], count)
    return result


def _event_writer(path: str, count: int, stamps: Any, arrived: Any, ready: Any) -> None:
    """The writing side of the cross-process measurement (a spawned process)."""
    import reactor

    jitter = random.Random(7)
    with reactor.open(path) as state:
        scope = state.scope("events")
        ready.set()
        for seq in range(count):
            arrived.clear()
            scope.set("k", {"seq": seq})
            stamps.put((seq, time.time_ns()))
            arrived.wait(5.0)
            time.sleep(jitter.uniform(0.0, 0.005))  # do not keep step with the poller
    stamps.put(None)


def event_latency_cross_process(path: str, count: int) -> dict[str, Any]:
    """Commit-to-callback latency when another process writes.

    A spawned process sets a key, stamps ``time.time_ns()`` once the ``set``
    returned, and waits for this process's callback (stamped likewise) before the
    next. Latency is arrival minus stamp (0 when the callback ran first).
    """
    import reactor

    context = multiprocessing.get_context("spawn")
    stamps = context.Queue()
    arrived = context.Event()
    ready = context.Event()
    arrivals: dict[int, int] = {}

    def on_event(event: reactor.ChangeEvent) -> None:
        now = time.time_ns()
        arrivals[event.new_value["seq"]] = now
        arrived.set()

    acks: dict[int, int] = {}
    with reactor.open(path) as state:
        subscription = state.subscribe(on_event, scope="events")
        writer = context.Process(
            target=_event_writer, args=(path, count, stamps, arrived, ready), daemon=True
        )
        writer.start()
        try:
            while True:
                item = stamps.get(timeout=_TIMEOUT)
                if item is None:
                    break
                acks[item[0]] = item[1]
            deadline = time.monotonic() + 2.0
            while len(arrivals) < len(acks) and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            writer.join(10)
            if writer.is_alive():
                writer.terminate()
                writer.join()
            subscription.close()
    seen = [seq for seq in acks if seq in arrivals]
    result = _latency([max(0, arrivals[seq] - acks[seq]) for seq in seen], count)
    result["before_ack"] = sum(1 for seq in seen if arrivals[seq] < acks[seq])
    return result
