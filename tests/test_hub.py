"""The listener hub (``reactor/_engine/hub.py``) under churn: listeners of every kind
join and leave while writes go on; the ones that stay miss nothing, and none is left
behind once they are gone. Lock waiters, threads and tasks of several loops, stand in
one quiet line of the hub per lock name."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import reactor
import reactor.aio
from tests.conftest import engine_of, wait_for


def test_listeners_joining_and_leaving_during_writes_lose_no_event_and_leave_none(
    state: reactor.State,
) -> None:
    engine = engine_of(state)
    seen: list[int] = []
    exact: list[int] = []
    everything = state.subscribe(lambda event: seen.append(event.new_value), scope="s")
    one_key = state.subscribe(lambda event: exact.append(event.new_value), scope="s", key="k")
    stop = threading.Event()
    errors: list[BaseException] = []
    held = state.lock("busy", ttl=60)
    assert held.acquire(blocking=False)

    def churn() -> None:
        try:
            while not stop.is_set():
                assert not state.lock("busy", ttl=60).acquire(timeout=0.003)
                sub = state.subscribe(lambda _event: None, scope="s", key="k")
                watch = state.watch(scope="s")
                with contextlib.suppress(reactor.OperationTimeout):
                    state.scope("s").wait_for("never", timeout=0.001)
                state.queue("q").take(timeout=0.001)
                watch.close()
                sub.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for n in range(300):
            state.scope("s").set("k", n)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert errors == []
    wait_for(lambda: len(seen) == 300 and len(exact) == 300)
    assert seen == exact == list(range(300))  # each once, in order
    everything.close()
    one_key.close()
    held.release()
    leftover: list[Any] = engine.hub.listeners()
    assert leftover == []


def _lock_lines(state: reactor.State) -> list[Any]:
    """The hub's lines of lock waiters (``LockLine``)."""
    hub = engine_of(state).hub
    return [line for line in hub.listeners() if type(line).__name__ == "LockLine"]


def test_lock_waiters_of_threads_and_loops_share_one_line_that_a_release_wakes(
    state: reactor.State, db_path: Any
) -> None:
    """A thread and the tasks of two loops wait for one lock: one line; each release,
    sync or async, wakes the waiters (no waiting out a pause); the line is gone once
    nobody waits."""
    holder = state.lock("deploy", ttl=60)
    assert holder.acquire(blocking=False)
    order: list[str] = []

    def thread_waiter() -> None:
        lock = state.lock("deploy", ttl=60)
        assert lock.acquire(timeout=30)
        order.append("thread")
        lock.release()

    async def task_waiters(name: str) -> None:
        async with reactor.aio.open(db_path) as astate:

            async def one(n: int) -> None:
                lock = astate.lock("deploy", ttl=60)
                assert await lock.acquire(timeout=30)
                order.append(f"{name}{n}")
                await lock.release()

            await asyncio.gather(one(0), one(1))

    threads = [threading.Thread(target=thread_waiter)] + [
        threading.Thread(target=asyncio.run, args=(task_waiters(name),)) for name in "ab"
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(_lock_lines(state)) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    (line,) = _lock_lines(state)
    time.sleep(0.3)  # everyone waits, backed off to the longest pause
    assert order == []
    woken = line.wakes
    started = time.monotonic()
    holder.release()
    for thread in threads:
        thread.join(30)
    waited = time.monotonic() - started
    assert sorted(order) == ["a0", "a1", "b0", "b1", "thread"]
    assert waited < 10  # five turns, each woken by the release before it
    assert line.wakes >= woken + 5  # the holder's release, then each waiter's
    assert _lock_lines(state) == []
    assert engine_of(state).hub.listeners() == []


async def test_closing_an_async_handle_ends_its_waiting_tasks(
    state: reactor.State, db_path: Any
) -> None:
    holder = state.lock("deploy", ttl=60)
    assert holder.acquire(blocking=False)
    astate = reactor.aio.open(db_path)
    waiting = asyncio.ensure_future(astate.lock("deploy", ttl=60).acquire())
    for _ in range(500):
        if _lock_lines(state):
            break
        await asyncio.sleep(0.01)
    assert len(_lock_lines(state)) == 1
    await astate.close()
    try:
        await asyncio.wait_for(waiting, 5)
    except reactor.ClosedError:
        pass
    else:
        raise AssertionError("a task waiting for a lock outlived its handle's close")
    assert _lock_lines(state) == []
    holder.release()
