"""Hygiene: opening and closing leaves nothing behind, and the suite treats warnings
(ResourceWarning, exceptions in threads) as errors. At the end, what SPEC §6 says of
fencing tokens and stale holders, across processes.

A cycle opens the test's database, writes in a few scopes (a transaction makes sure a
scope actor starts), subscribes (plain and durable), watches, takes locks (one left
held), and closes. After 100 cycles the process has the threads, file descriptors and
database connections it had before, and no pykka actor.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pykka

import reactor
from reactor.testing import ManualClock

ROOT = Path(__file__).resolve().parent.parent
CYCLES = 100


def _resources() -> dict[str, Any]:
    """What a leak would show in: threads, descriptors, connections to a server."""
    process = psutil.Process()
    return {
        "threads": {(thread.name, thread.ident) for thread in threading.enumerate()},
        "fds": process.num_fds(),
        "tcp": sorted((c.laddr, c.raddr) for c in process.net_connections(kind="tcp") if c.raddr),
        "actors": len(pykka.ActorRegistry.get_all()),
    }


def _ignore(event: reactor.ChangeEvent) -> None:
    pass


def _cycle(target: Any, i: int) -> dict[str, Any]:
    """One open/use/close cycle; returns what was running just before the close."""
    state = reactor.open(target)
    seen: list[int] = []
    state.subscribe(lambda event: seen.append(event.revision), scope="a")
    state.subscribe(_ignore, durable="hygiene")
    a, b, c = state.scope("a"), state.scope("b"), state.scope(f"c-{i}")
    a.set("k", i)
    b.increment("n")
    c.update("doc", [reactor.ops.set("i", i)])
    with a.transaction() as tx:  # a transaction's begin goes through the actor
        tx.increment("n")
    with state.watch(since=0, scope="a") as watch:
        assert next(watch).scope == "a"
    with state.lock("hygiene", ttl=5, timeout=5):
        pass
    assert state.lock(f"left-held-{i}", ttl=60).acquire(blocking=False)
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.002)
    running = _resources()
    state.close()
    return running


def test_100_open_close_cycles_leave_no_thread_descriptor_connection_or_actor(
    db_path: Any,
) -> None:
    _cycle(db_path, -1)  # imports, caches and the schema: what a first open leaves is fine
    gc.collect()
    before = _resources()
    during = [_cycle(db_path, i) for i in range(CYCLES)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()  # what was left unclosed says so now
    after = _resources()

    # Each cycle did start threads, actors (and, on PostgreSQL, connections) ...
    started = {name for name, _ in during[0]["threads"] - before["threads"]}
    assert any(name.startswith("reactor-dispatch") for name in started), started
    assert any(name.startswith("reactor-subscriber") for name in started), started
    assert all(cycle["actors"] > 0 for cycle in during)
    assert all(cycle["fds"] > before["fds"] for cycle in during)
    if isinstance(db_path, str):
        assert all(len(cycle["tcp"]) > len(before["tcp"]) for cycle in during)
    # ... and the close took all of them down.
    leftover = sorted(name for name, _ in after["threads"] - before["threads"])
    assert leftover == [], f"threads left running after {CYCLES} cycles: {leftover}"
    assert after["fds"] == before["fds"], psutil.Process().open_files()
    assert after["tcp"] == before["tcp"]
    assert after["actors"] == 0
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], caught


async def _async_cycle(target: Any, i: int) -> None:
    async with reactor.aio.open(target) as state:
        arrived = asyncio.Event()

        async def on_change(event: reactor.ChangeEvent) -> None:
            arrived.set()

        await state.subscribe(on_change, scope="a")
        await state.scope("a").set("k", i)
        async with state.scope("b").transaction() as tx:
            await tx.increment("n")
        async with state.lock("hygiene", ttl=5, timeout=5):
            pass
        await asyncio.wait_for(arrived.wait(), 5)


def test_asyncio_open_close_cycles_leave_nothing_behind(db_path: Any) -> None:
    asyncio.run(_async_cycle(db_path, -1))
    gc.collect()
    before = _resources()
    for i in range(CYCLES // 5):
        asyncio.run(_async_cycle(db_path, i))  # a loop, and its executor, per cycle
    gc.collect()
    after = _resources()
    leftover = sorted(name for name, _ in after["threads"] - before["threads"])
    assert leftover == []
    assert after["fds"] == before["fds"]
    assert after["tcp"] == before["tcp"]
    assert after["actors"] == 0


# -- warnings are errors -----------------------------------------------------------------
PROBE = """
import gc
import threading


def test_a_thread_that_raises():
    thread = threading.Thread(target=lambda: 1 / 0)
    thread.start()
    thread.join()


def test_an_unclosed_file(tmp_path):
    handle = open(tmp_path / "leak", "w")
    del handle
    gc.collect()


def test_a_clean_test():
    pass
"""


def test_the_suite_runs_with_warnings_as_errors() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    assert config["ini_options"]["filterwarnings"][0] == "error"


def test_a_thread_exception_or_a_resource_warning_fails_a_test(tmp_path: Path) -> None:
    """Under the project's pytest configuration, a test whose thread raises, or that
    leaves a file to the garbage collector, fails."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_probe.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    summary = run.stdout.strip().splitlines()[-1]
    assert "2 failed, 1 passed" in summary, run.stdout[-3000:]
    assert "FAILED test_probe.py::test_a_thread_that_raises" in run.stdout
    assert "FAILED test_probe.py::test_an_unclosed_file" in run.stdout
    assert "PytestUnhandledThreadExceptionWarning" in run.stdout
    assert "PytestUnraisableExceptionWarning" in run.stdout


# -- locks -----------------------------------------------------------------------------------
FENCED = """
    import json, sys, time, reactor
    target, rounds = sys.argv[1], int(sys.argv[2])
    leases = []
    with reactor.open(target) as state:
        lock = state.lock("fence", ttl=30)
        for _ in range(rounds):
            if not lock.acquire(timeout=30):
                sys.exit("could not acquire within 30 s")
            taken = time.time()
            token = lock.token
            time.sleep(0.001)
            given_back = time.time()
            lock.release()
            leases.append([token, taken, given_back])
    print(json.dumps(leases))
"""


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(child: subprocess.Popen[str], text: str | None = None) -> str:
    try:
        out, err = child.communicate(text, timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    assert child.returncode == 0, err
    return out


def test_fencing_tokens_go_up_by_one_per_lease_across_processes_and_reopening(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    state = open_state()
    first = state.lock("fence", ttl=30)
    assert first.acquire(blocking=False)
    start = first.token
    first.release()
    state.close()

    rounds, workers = 15, 3
    children = [_python(FENCED, str(db_path), str(rounds)) for _ in range(workers)]
    leases = sorted(lease for child in children for lease in json.loads(_finish(child)))
    tokens = [token for token, _, _ in leases]
    assert start is not None
    assert tokens == list(range(start + 1, start + 1 + rounds * workers))  # no gap, no repeat
    for (_, _, given_back), (_, taken, _) in itertools.pairwise(leases):
        assert given_back <= taken  # token order is the order in which leases were held

    reopened = open_state()
    last = reopened.lock("fence", ttl=30)
    assert last.acquire(blocking=False)
    assert last.token == tokens[-1] + 1
    last.release()


STALE = """
    import sys, reactor
    with reactor.open(sys.argv[1]) as state:
        lock = state.lock("deploy", ttl=30)
        assert lock.acquire(blocking=False)
        print(lock.token, flush=True)
        sys.stdin.readline()  # the parent took the lease meanwhile
        print(lock.held(), flush=True)
        try:
            lock.release()
            print("released", flush=True)
        except reactor.LockNotOwnedError:
            print("LockNotOwnedError", flush=True)
"""


def test_a_stale_holder_in_another_process_cannot_release_the_lease_it_lost(
    open_state: Callable[..., reactor.State], db_path: Any
) -> None:
    with reactor.open(db_path) as first:
        first.scope("s").set("ready", True)  # the database exists before the child
    child = _python(STALE, str(db_path))
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip(), child.stderr.read() if child.stderr else ""
    stale_token = int(line)
    # This process's clock runs 31 s ahead: the child's 30 s lease has run out for it.
    state = open_state(clock=ManualClock(time.time() + 31))
    lock = state.lock("deploy", ttl=30)
    assert lock.acquire(blocking=False)
    assert lock.token == stale_token + 1
    out = _finish(child, "go\n")
    assert out.split() == ["False", "LockNotOwnedError"]
    assert lock.held()  # the stale holder's attempt changed nothing
    lock.release()
