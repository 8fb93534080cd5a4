"""Several processes on one SQLite file; kill -9; interpreter exit (SPEC §8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import reactor


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


INCREMENTER = """
    import sys, reactor
    path, count = sys.argv[1], int(sys.argv[2])
    with reactor.open(path) as state:
        scope = state.scope("counters")
        for _ in range(count):
            scope.increment("hits")
            scope.push("log", 1)
    print("done")
"""


def test_4_processes_incrementing_one_key_are_exact(db_path: Path) -> None:
    with reactor.open(db_path) as state:
        state.scope("counters").set("hits", 0)
    workers = [_python(INCREMENTER, str(db_path), "150") for _ in range(4)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert out.strip() == "done"
    with reactor.open(db_path) as state:
        assert state.scope("counters").get("hits") == 600
        assert state.scope("counters").length("log") == 600


def test_a_read_sees_what_another_process_acknowledged(db_path: Path) -> None:
    with reactor.open(db_path) as state:
        scope = state.scope("s")
        scope.set("k", "mine")
        writer = _python(
            """
            import sys, reactor
            with reactor.open(sys.argv[1]) as state:
                state.scope("s").set("k", "theirs")
            print("acknowledged", flush=True)
            """,
            str(db_path),
        )
        out, err = writer.communicate(timeout=60)
        assert out.strip() == "acknowledged", err
        assert scope.get("k") == "theirs"
        assert scope.increment("n") == 1


WRITER = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        scope = state.scope("acked")
        i = 0
        while True:
            scope.set(f"k{i}", {"i": i, "pad": "x" * 50})
            if i % 3 == 0:
                scope.increment("count")
            print(i, flush=True)
            i += 1
"""


def test_kill_9_loses_no_acknowledged_write(db_path: Path) -> None:
    writer = _python(WRITER, str(db_path))
    assert writer.stdout is not None
    acknowledged: list[int] = []
    deadline = time.monotonic() + 30
    while len(acknowledged) < 300 and time.monotonic() < deadline:
        line = writer.stdout.readline()
        if not line:
            break
        acknowledged.append(int(line))
    os.kill(writer.pid, signal.SIGKILL)
    rest, _ = writer.communicate(timeout=30)
    acknowledged += [int(line) for line in rest.split()]  # printed before the kill
    assert writer.returncode == -signal.SIGKILL
    assert len(acknowledged) >= 300

    with reactor.open(db_path) as state:
        scope = state.scope("acked")
        stored = scope.get_many([f"k{i}" for i in acknowledged])
        assert len(stored) == len(acknowledged)
        assert all(stored[f"k{i}"]["i"] == i for i in acknowledged)
        assert scope.get("count") >= len([i for i in acknowledged if i % 3 == 0])


def test_interpreter_exit_with_an_open_engine_neither_hangs_nor_loses(db_path: Path) -> None:
    started = time.monotonic()
    leaver = _python(
        """
        import sys, threading, reactor
        state = reactor.open(sys.argv[1])
        scope = state.scope("s")
        for i in range(100):
            scope.set(f"k{i}", i)
        scope.set("k", "last", ttl=3600)
        # no close(): exit with actors, the sweeper and connections alive
        """,
        str(db_path),
    )
    _, err = leaver.communicate(timeout=30)
    assert leaver.returncode == 0, err
    assert err == ""
    assert time.monotonic() - started < 15
    with reactor.open(db_path) as state:
        assert state.scope("s").get("k") == "last"
        assert len(state.scope("s").keys("k?*")) == 100
