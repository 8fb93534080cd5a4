"""The bench's start-up section: how long a ``reactor get`` takes from the shell, beside
a bare interpreter and ``redis-cli get`` (where there is one), in one run.

A command is often one call in a shell loop, so what counts is the whole process: the
interpreter's start, the imports, opening the file, the read, the exit. Each command
runs ``runs`` times a round (after one run that is not counted, which also writes the
bytecode caches a real installation has); a round's figure is the median, and the
section's the median of the rounds. The ratio to ``python -c pass`` is what the target
is set on (4 times, issue 28): it moves much less with the machine's load than the times.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["STARTUP_TARGET", "measure_startup"]

STARTUP_TARGET = 4.0  # reactor get, as a multiple of a bare interpreter's start


def _commands(database: Path, redis_port: int | None) -> dict[str, list[str]]:
    script = Path(sys.executable).with_name("reactor")
    reactor = [str(script)] if script.exists() else [sys.executable, "-m", "reactor"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import reactor'": [sys.executable, "-c", "import reactor"],
        "reactor get": [*reactor, "--db", str(database), "get", "bench", "k"],
    }
    cli = shutil.which("redis-cli")
    if cli is not None and redis_port is not None:
        commands["redis-cli get"] = [cli, "-p", str(redis_port), "get", "k"]
    return commands


def _time(command: list[str], env: dict[str, str]) -> float:
    """Seconds ``command`` took, start to exit.

    Raises:
        RuntimeError: it failed.
    """
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, timeout=60, check=False)  # noqa: S603 - our own commands
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {done.stderr.decode(errors='replace')[:200]}")
    return took


def measure_startup(
    root: str, *, rounds: int, runs: int, redis_port: int | None = None
) -> dict[str, Any]:
    """Each command's median time (ms) and its ratio to ``python -c pass``."""
    import reactor

    database = Path(root) / "startup.db"
    with reactor.open(database) as state:
        state.scope("bench").set("k", {"total": 120})
    env = {**os.environ}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its caches
    commands = _commands(database, redis_port)
    medians: dict[str, list[float]] = {name: [] for name in commands}
    try:
        for command in commands.values():
            _time(command, env)  # not counted: warms the caches
        for _ in range(rounds):
            for name, command in commands.items():
                medians[name].append(statistics.median(_time(command, env) for _ in range(runs)))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    base = statistics.median(medians["python -c pass"])
    figures = {
        name: {
            "ms": round(statistics.median(found) * 1000, 2),
            "ratio": round(statistics.median(found) / base, 2),
        }
        for name, found in medians.items()
    }
    return {
        "settings": {"rounds": rounds, "runs": runs},
        "commands": figures,
        "target": STARTUP_TARGET,
        "met": figures["reactor get"]["ratio"] <= STARTUP_TARGET,
    }
