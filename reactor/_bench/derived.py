"""Derived values (SPEC §15, issue 27): how soon a commit reaches a derived value's
subscriber, in this process and from another one, and what live derived values cost
the writes that touch none of them.

- **latency, in process**: a value reads one key; ``count`` times, the key is set and
  the time from its commit (as ``reactor.signals.changed`` hears it) to the
  subscriber's call is taken (and from the ``set`` call, its commit included);
- **latency, across processes**: a child process sets the key ``count`` times (0.01 s
  apart), each value holding its ``time.time()``; this process's subscriber takes the
  time from it (the follower finds the commit, the value runs again, publishes);
- **10,000 values**: writes/s of sets to 100 keys of a scope that no value reads, while
  ``values`` live values each read a key of their own in that same scope (so every
  write is looked up in their index), against the same writes with none; medians.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .backends import Backend
from .peer import reactor_target

__all__ = ["DerivedPlan", "run_derived"]

_TIMEOUT = 60.0  # seconds any wait gives up after

_WRITER = textwrap.dedent(
    """
    import sys, time, reactor
    target, count = sys.argv[1], int(sys.argv[2])
    with reactor.open(target) as state:
        clock = state.scope("clock")
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        sys.stdin.readline()
        for n in range(count):
            clock.set("now", [n, time.time()])
            time.sleep(0.01)
    """
)


@dataclass(frozen=True)
class DerivedPlan:
    """``count`` commits for each latency, ``writes`` sets for each rate, ``values``
    live values, ``rounds`` rates of each."""

    rounds: int
    count: int
    writes: int
    values: int


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    }


def _in_process(state: Any, count: int) -> dict[str, Any]:
    """From the commit (as ``reactor.signals.changed`` hears it, on the dispatcher's
    thread right after it) to the subscriber's call; and from the ``set`` call."""
    from reactor import signals

    box = state.scope("box")
    box.set("n", -1)
    value = state.derive(lambda r: r.scope("box").get("n"), name="latency")
    arrived = threading.Event()
    began = [0.0, 0.0]  # the set's call, the commit heard
    seconds: list[float] = []
    from_call: list[float] = []

    def committed(_sender: str, **_event: Any) -> None:
        began[1] = time.perf_counter()

    def heard(_derived: Any) -> None:
        now = time.perf_counter()
        seconds.append(now - began[1])
        from_call.append(now - began[0])
        arrived.set()

    signals.changed.connect(committed, sender="box")
    stop = value.subscribe(heard)
    try:
        for n in range(count):
            arrived.clear()
            began[0] = time.perf_counter()
            box.set("n", n)
            if not arrived.wait(_TIMEOUT):
                raise TimeoutError("a derived value's subscriber was not called")
    finally:
        signals.changed.disconnect(committed, sender="box")
        stop()
        value.close()
    calls = _percentiles(from_call)
    return {
        "count": count,
        **_percentiles(seconds),
        "from_call_p50_ms": calls["p50_ms"],
        "from_call_p99_ms": calls["p99_ms"],
    }


def _across(state: Any, target: str, count: int) -> dict[str, Any]:
    seconds: list[float] = []
    done = threading.Event()

    def heard(derived: Any) -> None:
        if derived.value is not None:
            seconds.append(time.time() - derived.value[1])
            if derived.value[0] == count - 1:
                done.set()

    value = state.derive(lambda r: r.scope("clock").get("now"), name="across")
    stop = value.subscribe(heard)
    child = subprocess.Popen(  # noqa: S603 - this Python, our own program
        [sys.executable, "-c", _WRITER, target, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        if child.stdout.readline() != "ready\n":
            raise RuntimeError("the writing process did not start")
        child.stdin.write("go\n")
        child.stdin.flush()
        if not done.wait(_TIMEOUT):
            raise TimeoutError("the last write of the other process was not heard")
        child.wait(_TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        stop()
        value.close()
    return {"count": len(seconds), **_percentiles(seconds)}


def _rate(state: Any, writes: int) -> float:
    scope = state.scope("many")
    began = time.perf_counter()
    for n in range(writes):
        scope.set(f"w{n % 100}", n)
    return writes / (time.perf_counter() - began)


def _many(state: Any, plan: DerivedPlan) -> dict[str, Any]:
    none = [_rate(state, plan.writes) for _ in range(plan.rounds)]
    began = time.perf_counter()
    values = [
        state.derive(lambda r, n=n: r.scope("many").get(f"k{n}"), name=f"k{n}")
        for n in range(plan.values)
    ]
    made = time.perf_counter() - began
    runs = sum(value.recomputations for value in values)
    live = [_rate(state, plan.writes) for _ in range(plan.rounds)]
    ran = sum(value.recomputations for value in values) - runs
    for value in values:
        value.close()
    return {
        "values": plan.values,
        "writes_per_s_none": statistics.median(none),
        "writes_per_s_live": statistics.median(live),
        "ratio": statistics.median(live) / statistics.median(none),
        "made_s": made,
        "recomputations": ran,
        "rounds": {"none": none, "live": live},
    }


def _cell(name: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        return {"error": f"{name}: {type(exc).__name__}: {exc}"}


def run_derived(
    backend: Backend, root: str, plan: DerivedPlan, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every cell, on a fresh database; the figures and the issue's targets."""
    import reactor

    location = os.path.join(root, "derived")
    os.makedirs(location)
    section: dict[str, Any] = {"settings": plan.__dict__}
    try:
        with backend.location(location, "derived") as where:
            target = reactor_target(where)
            with reactor.open(target) as state:
                say("derived: latency in process")
                section["in_process"] = _cell("in process", lambda: _in_process(state, plan.count))
                say("derived: latency across processes")
                section["across"] = _cell("across", lambda: _across(state, target, plan.count))
                say(f"derived: writes with {plan.values:,} live values")
                section["many"] = _cell("many", lambda: _many(state, plan))
    except Exception as exc:  # noqa: BLE001 - one failure must not end the run
        section["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(location, ignore_errors=True)
    section["targets"] = _targets(section)
    return section


def _targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    here = section.get("in_process", {})
    there = section.get("across", {})
    many = section.get("many", {})

    def within(found: dict[str, Any], key: str, most: float) -> bool | None:
        value = found.get(key)
        return None if value is None else bool(value <= most)

    ratio = many.get("ratio")
    return [
        {"text": "in process: p50 ≤ 1 ms", "ok": within(here, "p50_ms", 1.0)},
        {"text": "in process: p99 ≤ 5 ms", "ok": within(here, "p99_ms", 5.0)},
        {"text": "across processes: p99 ≤ 50 ms", "ok": within(there, "p99_ms", 50.0)},
        {
            "text": f"writes with {many.get('values', 0):,} values ≥ 0.9 x none",
            "ok": None if ratio is None else bool(ratio >= 0.9),
        },
    ]
