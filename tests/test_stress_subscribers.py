"""Subscribers under stress (SPEC §7): eight writer threads, and subscribers that raise,
are slow, write back, are async, are durable. Every healthy subscriber sees every event
it asked for exactly once, in revision order, and the change log is the reference.

The subscribers, all but the last two filtered to the writers' scope ``w``:

- ``raising`` raises on every event: it must still be called once per event, in order,
  and ``stats()["events"]["failed"]`` counts exactly its calls.
- ``slow`` sleeps on every event. Like every plain subscription here, its buffer holds
  every event of the run, so it may drop none: it is held to the same standard as the
  others (``dropped == 0``).
- ``echo`` writes, for each event, a key of its own to scope ``echo``: those writes are
  events too, which the subscribers filtered to ``w`` must not see.
- ``on_loop`` is an ``async def`` callback, subscribed from the test's event loop, and
  must run on that loop's thread.
- ``durable`` is a durable subscription (``durable="stress"``): at-least-once by
  contract, exactly once in a run without crash or failure.
- ``everything`` has no filter: it sees the writers' events and the echo's, exactly the
  whole change log.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable

import pytest

import reactor
from reactor import ops

Opener = Callable[..., reactor.State]

WRITERS = 8


class Recorder:
    """Records the revision of every event it gets (and on which thread)."""

    def __init__(self, sleep: float = 0.0, fail: bool = False) -> None:
        self.revisions: list[int] = []
        self.threads: set[int] = set()
        self._sleep = sleep
        self._fail = fail
        self._lock = threading.Lock()

    def __call__(self, event: reactor.ChangeEvent) -> None:
        with self._lock:
            self.revisions.append(event.revision)
            self.threads.add(threading.get_ident())
        if self._sleep:
            time.sleep(self._sleep)
        if self._fail:
            raise RuntimeError(f"a subscriber bug, on revision {event.revision}")


def _writer(scope: reactor.Scope, thread: int, rounds: int) -> None:
    """``rounds`` writes, each of which changes something: one event each."""
    for i in range(rounds):
        step = i % 4
        if step == 0:
            scope.set(f"t{thread}-k{i}", {"thread": thread, "i": i})
        elif step == 1:
            scope.increment(f"t{thread}-n")
        elif step == 2:
            scope.update(f"t{thread}-doc", [ops.set("i", i), ops.append(i, path="seen")])
        else:
            assert scope.delete(f"t{thread}-k{i - 3}") is not None  # the step-0 key


def _assert_exactly(name: str, revisions: list[int], expected: list[int]) -> None:
    duplicates = len(revisions) - len(set(revisions))
    assert duplicates == 0, f"{name}: {duplicates} events delivered twice"
    assert all(a < b for a, b in itertools.pairwise(revisions)), f"{name}: out of order"
    missing = sorted(set(expected) - set(revisions))
    extra = sorted(set(revisions) - set(expected))
    assert not missing, f"{name}: {len(missing)} events never arrived: {missing[:10]}"
    assert not extra, f"{name}: {len(extra)} events it should not get: {extra[:10]}"
    assert revisions == expected


async def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout} s")
        await asyncio.sleep(0.05)


async def _stress(open_state: Opener, rounds: int, caplog: pytest.LogCaptureFixture) -> None:
    state = open_state()
    writes = state.scope("w")
    echo_scope = state.scope("echo")
    total = WRITERS * rounds

    raising = Recorder(fail=True)
    slow = Recorder(sleep=0.0005)
    echoed = Recorder()
    durable = Recorder()
    everything = Recorder()
    on_loop: list[int] = []
    loop_threads: set[int] = set()

    echo_writes: list[int] = []

    def echo(event: reactor.ChangeEvent) -> None:
        echoed(event)
        echo_scope.set(f"r{event.revision}", event.key)  # a write from the callback
        echo_writes.append(event.revision)

    async def async_callback(event: reactor.ChangeEvent) -> None:
        loop_threads.add(threading.get_ident())
        await asyncio.sleep(0)
        on_loop.append(event.revision)

    # Room for every event of the run: a subscriber may fall behind by all of them (on
    # PostgreSQL the echo does, by more than the default 10,000), and drops none.
    room = 2 * total + 100
    subscriptions = [
        state.subscribe(raising, scope="w", buffer_size=room),
        state.subscribe(slow, scope="w", buffer_size=room),
        state.subscribe(echo, scope="w", buffer_size=room),
        state.subscribe(async_callback, scope="w", buffer_size=room),
        state.subscribe(durable, scope="w", durable="stress"),
        state.subscribe(everything, buffer_size=room),
    ]

    threads = [
        threading.Thread(target=_writer, args=(writes, t, rounds), name=f"writer-{t}")
        for t in range(WRITERS)
    ]
    started = time.monotonic()
    with caplog.at_level(logging.CRITICAL, logger="reactor"):  # 1 traceback per event
        for thread in threads:
            thread.start()
        for thread in threads:
            await asyncio.to_thread(thread.join, 600)
        assert not any(thread.is_alive() for thread in threads)
        written = time.monotonic() - started

        budget = 30.0 + 0.02 * total  # PostgreSQL: ms per echo write and durable position
        await _wait(lambda: len(echo_writes) >= total, budget, "the echo's writes")
        log = state.changes()
        in_w = [e.revision for e in log if e.scope == "w"]
        every = [e.revision for e in log]
        assert len(in_w) == total  # each write changed something: one event each
        assert len(every) == 2 * total  # and each of them one echo write
        healthy = {
            "raising": raising.revisions,
            "slow": slow.revisions,
            "echo": echoed.revisions,
            "async": on_loop,
            "durable": durable.revisions,
        }
        for name, seen in healthy.items():
            await _wait(lambda seen=seen: len(seen) >= total, budget, f"{name} got all")
        await _wait(lambda: len(everything.revisions) >= 2 * total, budget, "everything")
        delivered = time.monotonic() - started
        for subscription in subscriptions:
            await asyncio.to_thread(subscription.close)

    for name, seen in healthy.items():
        _assert_exactly(name, seen, in_w)
    _assert_exactly("everything", everything.revisions, every)
    assert loop_threads == {threading.get_ident()}  # the async callback ran on its loop
    assert threading.get_ident() not in slow.threads  # the others ran off it

    assert sorted(echo_scope.list().values()) == sorted(e.key for e in log if e.scope == "w")
    stats = state.stats()
    assert stats["events"]["failed"] == len(raising.revisions) == total
    assert stats["events"]["dropped"] == 0
    assert stats["events"]["published"] == 2 * total
    assert stats["durable_subscribers"]["stress"]["delivered"] == total
    assert stats["durable_subscribers"]["stress"]["failed"] == 0
    print(
        f"\n{WRITERS} writers x {rounds} writes: {total} writer events, {total} echo "
        f"events; written in {written:.1f} s, all delivered after {delivered:.1f} s; "
        f"{5 * total + 2 * total} deliveries checked"
    )


async def test_every_healthy_subscriber_sees_every_event_once_in_order(
    open_state: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    await _stress(open_state, rounds=200, caplog=caplog)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_every_healthy_subscriber_sees_every_event_once_in_order_longer(
    open_state: Opener, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    if "slow" not in request.config.getoption("markexpr"):
        pytest.skip("a long campaign: run it with -m slow")
    await _stress(open_state, rounds=2_000, caplog=caplog)
