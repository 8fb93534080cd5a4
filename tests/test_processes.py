"""Several processes on one database; kill -9; interpreter exit (SPEC §8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import reactor

from .conftest import raw_query


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


MIXED = """
    import sys, reactor
    from reactor import ops
    path, count = sys.argv[1], int(sys.argv[2])
    with reactor.open(path) as state:
        scope = state.scope("shared")
        for _ in range(count):
            scope.increment("counter")
            scope.update("doc", [ops.increment("n"), ops.append(1, "seen")])
    print("done")
"""

WATCHER = """
    import json, sys, reactor
    path, total = sys.argv[1], int(sys.argv[2])
    with reactor.open(path) as state:
        watch = state.watch(scope="shared")
        print("watching", flush=True)
        revisions = []
        with watch:
            for event in watch:
                revisions.append(event.revision)
                if len(revisions) == total:
                    break
    print(json.dumps(revisions))
"""


def test_4_processes_mixing_increments_and_update_ops_on_one_key_with_a_watcher(
    db_path: Path,
) -> None:
    """Each write's read-modify-write sees every earlier commit, whichever process made
    it; a watcher in another process sees each event once, in revision order."""
    per_worker = 60
    total = 4 * per_worker * 2
    with reactor.open(db_path) as state:
        state.scope("shared").set("doc", {"n": 0, "seen": []})
        start = state.stats()["revision"]
    watcher = _python(WATCHER, str(db_path), str(total))
    assert watcher.stdout is not None
    assert watcher.stdout.readline().strip() == "watching"
    workers = [_python(MIXED, str(db_path), str(per_worker)) for _ in range(4)]
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert out.strip() == "done"
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert json.loads(out) == list(range(start + 1, start + total + 1))
    with reactor.open(db_path) as state:
        scope = state.scope("shared")
        assert scope.get("counter") == 4 * per_worker
        doc = scope.get("doc")
        assert doc["n"] == 4 * per_worker
        assert len(doc["seen"]) == 4 * per_worker


SWEEPER = """
    import sys, time, reactor
    path = sys.argv[1]
    with reactor.open(path) as state:
        print("open", flush=True)
        time.sleep(float(sys.argv[2]))
"""


def test_several_processes_sweeping_expire_each_key_once(db_path: Path) -> None:
    sweepers = [_python(SWEEPER, str(db_path), "2.5") for _ in range(3)]
    for sweeper in sweepers:
        assert sweeper.stdout is not None
        assert sweeper.stdout.readline().strip() == "open"
    with reactor.open(db_path) as state:
        expired: list[str] = []
        state.subscribe(lambda event: expired.append(event.key), events=["expired"])
        scope = state.scope("cache")
        for i in range(30):
            scope.set(f"k{i}", i, ttl=0.3)
        deadline = time.monotonic() + 10
        while len(expired) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # time for a duplicate, if any sweeper were to fire one
        for sweeper in sweepers:
            _, err = sweeper.communicate(timeout=30)
            assert sweeper.returncode == 0, err
        assert sorted(expired) == sorted(f"k{i}" for i in range(30))
        assert scope.keys() == []
    logged = raw_query(db_path, "SELECT COUNT(*) FROM reactor_changes WHERE type = 'expired'")
    assert logged == [(30,)]
