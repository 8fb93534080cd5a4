"""The listener hub (``reactor/_engine/hub.py``) under churn: listeners of every kind
join and leave while writes go on; the ones that stay miss nothing, and none is left
behind once they are gone."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import reactor
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

    def churn() -> None:
        try:
            while not stop.is_set():
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
    leftover: list[Any] = engine.hub.listeners()
    assert leftover == []
