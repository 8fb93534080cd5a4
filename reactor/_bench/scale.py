"""``reactor bench --scale``: how reactor behaves as the database grows.

One spawned process fills a database to each size in turn (keys spread evenly over
100 scopes, written with ``set_many``), and at each size times ``set`` (overwriting
random existing keys in random scopes) and ``get`` (random keys). Then a fresh
process times ``reactor.open`` on the full database and a first ``get``, and reports
its peak RSS after a thousand random reads.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

from .peer import make_value
from .workloads import Phase, figure

__all__ = ["SCOPES", "run_scale"]

SCOPES: Final = 100
_CHUNK: Final = 1000
_TIMEOUT: Final = 3600.0


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _key(i: int) -> tuple[str, str]:
    return f"s{i % SCOPES:03d}", f"k{i:07d}"


def _fill(state: Any, start: int, end: int) -> None:
    for scope_index in range(SCOPES):
        first = start + (scope_index - start) % SCOPES
        keys = range(first, end, SCOPES)
        scope = state.scope(f"s{scope_index:03d}")
        for offset in range(0, len(keys), _CHUNK):
            chunk = keys[offset : offset + _CHUNK]
            scope.set_many({_key(i)[1]: make_value(i) for i in chunk})


def _time_ops(state: Any, verb: str, size: int, count: int, seed: int) -> dict[str, Any]:
    pick = random.Random(seed)
    targets = [_key(pick.randrange(size)) for _ in range(count)]
    scopes = {name: state.scope(name) for name, _ in targets}
    value = make_value(0)
    clock = time.perf_counter_ns
    samples = [0] * count
    start = previous = clock()
    if verb == "set":
        for n, (name, key) in enumerate(targets):
            scopes[name].set(key, value)
            now = clock()
            samples[n] = now - previous
            previous = now
    else:
        for n, (name, key) in enumerate(targets):
            scopes[name].get(key)
            now = clock()
            samples[n] = now - previous
            previous = now
    return figure([Phase(start, clock(), samples)])


def _grow(path: str, sizes: Sequence[int], writes: int, reads: int, results: Any) -> None:
    """The filling process: each size in turn, its timings, then the peak RSS."""
    try:
        import reactor

        steps = []
        with reactor.open(path) as state:
            have = 0
            for size in sizes:
                began = time.perf_counter()
                _fill(state, have, size)
                fill_seconds = time.perf_counter() - began
                added, have = size - have, size
                steps.append(
                    {
                        "keys": size,
                        "fill_seconds": fill_seconds,
                        "fill_keys_per_s": added / fill_seconds,
                        "set": _time_ops(state, "set", size, writes, size),
                        "get": _time_ops(state, "get", size, reads, size + 1),
                    }
                )
        results.put({"steps": steps, "fill_peak_rss_mb": _peak_rss_mb()})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _reopen(path: str, size: int, results: Any) -> None:
    """A fresh process: time ``open`` and a first read, then a thousand reads."""
    try:
        import reactor

        rss_before = _peak_rss_mb()
        began = time.perf_counter()
        state = reactor.open(path)
        opened = time.perf_counter() - began
        scope_name, key = _key(size // 2)
        state.scope(scope_name).get(key)
        first_get = time.perf_counter() - began - opened
        pick = random.Random(3)
        for _ in range(1000):
            scope_name, key = _key(pick.randrange(size))
            state.scope(scope_name).get(key)
        began = time.perf_counter()
        state.close()
        closed = time.perf_counter() - began
        results.put(
            {
                "open_seconds": opened,
                "first_get_seconds": first_get,
                "close_seconds": closed,
                "rss_after_import_mb": rss_before,
                "peak_rss_mb": _peak_rss_mb(),
            }
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _in_child(target: Any, *args: Any) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=target, args=(*args, results), daemon=True)
    process.start()
    try:
        found: dict[str, Any] = results.get(timeout=_TIMEOUT)
    finally:
        process.join(60)
        if process.is_alive():
            process.terminate()
            process.join()
    if "error" in found:
        raise RuntimeError(found["error"])
    return found


def run_scale(location: str, sizes: Sequence[int], writes: int, reads: int) -> dict[str, Any]:
    """Grow a reactor database through ``sizes`` keys; figures at each, and reopening."""
    path = os.path.join(location, "scale.db")
    grown = _in_child(_grow, path, list(sizes), writes, reads)
    files = [name for name in os.listdir(location) if name.startswith("scale.db")]
    size_bytes = sum(os.path.getsize(os.path.join(location, name)) for name in files)
    reopened = _in_child(_reopen, path, sizes[-1])
    return {
        "scopes": SCOPES,
        "sizes": list(sizes),
        "steps": grown["steps"],
        "fill_peak_rss_mb": grown["fill_peak_rss_mb"],
        "database_bytes": size_bytes,
        "reopen": reopened,
    }
