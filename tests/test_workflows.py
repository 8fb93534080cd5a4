"""Durable workflows (SPEC §14) in one process: start, serve, steps, replay,
suspension by sleep and receive, cancellation, errors. Crashes and other processes are
in ``test_workflow_processes``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import reactor
from tests.conftest import wait_for

Opener = Callable[..., reactor.State]


@pytest.fixture
def state(open_state: Opener) -> reactor.State:
    return open_state()


def test_a_run_calls_its_steps_records_them_and_succeeds(state: reactor.State) -> None:
    calls: list[str] = []

    @state.workflow("greet")
    def greet(run: reactor.Run, name: str) -> dict[str, Any]:
        first = run.step("hello", lambda: calls.append("hello") or f"hello {name}")
        second = run.step("shout", str.upper, first)
        return {"said": second, "attempts": run.attempts}

    handle = state.start("greet", "ann", id="g-1")
    assert handle.id == "g-1"
    assert handle.status() == "pending"
    with state.serve(concurrency=2):
        assert handle.result(timeout=10) == {"said": "HELLO ANN", "attempts": 1}
    info = state.run_info("g-1")
    assert (info.status, info.input, info.attempts, info.error) == ("succeeded", "ann", 1, None)
    assert [(s.name, s.status, s.result) for s in info.steps] == [
        ("hello", "succeeded", "hello ann"),
        ("shout", "succeeded", "HELLO ANN"),
    ]
    assert all(s.started <= s.ended for s in info.steps if s.ended is not None)
    assert info.created <= info.updated
    assert calls == ["hello"]
    assert [run.id for run in state.runs()] == ["g-1"]
    assert state.runs(workflow="gr*", status="succeeded")[0].id == "g-1"
    assert state.runs(status="failed") == []
    assert state.runs(workflow="other") == []


def test_every_change_of_a_run_is_an_event_in_its_scope(state: reactor.State) -> None:
    @state.workflow("w")
    def work(run: reactor.Run, _input: Any) -> int:
        return int(run.step("one", lambda: 1))

    seen: list[tuple[str, str]] = []
    state.subscribe(lambda event: seen.append((event.key, event.new_value["status"])), "run:w")
    handle = state.start("w", None, id="r")
    with state.serve():
        assert handle.result(timeout=10) == 1
    wait_for(lambda: seen and seen[-1] == ("r", "succeeded"))
    assert seen[0] == ("r", "pending")
    assert ("r", "running") in seen
    assert state.scope("run:w").get("r")["status"] == "succeeded"
    with pytest.raises(reactor.InvalidKeyError):
        state.scope("run:w").set("r", {})  # runs are written by the engine only


def test_start_with_an_existing_id_returns_that_run_and_changes_nothing(
    state: reactor.State,
) -> None:
    first = state.start("later", {"n": 1}, id="same")
    revision = state.stats()["revision"]
    again = state.start("later", {"n": 2}, id="same")
    other = state.start("elsewhere", None, id="same")
    assert (again.id, again.workflow, other.workflow) == ("same", "later", "later")
    assert state.stats()["revision"] == revision
    assert state.run_info("same").input == {"n": 1}
    assert first.status() == "pending"  # nobody serves "later" here: it waits
    generated = state.start("later")
    assert len(generated.id) == 32
    assert generated.id != state.start("later").id


def test_a_step_that_raises_is_retried_then_recorded_and_raised(state: reactor.State) -> None:
    tries: list[float] = []

    def flaky() -> str:
        tries.append(time.monotonic())
        if len(tries) < 3:
            raise ConnectionError("try again")
        return "ok"

    def broken() -> None:
        raise ValueError("bad card")

    @state.workflow("pay")
    def pay(run: reactor.Run, _input: Any) -> dict[str, Any]:
        got = run.step("flaky", flaky, retries=2, backoff=0.05)
        try:
            run.step("charge", broken, retries=1, backoff=0.01)
        except reactor.StepFailedError as exc:
            return {"got": got, "error": exc.error}
        return {}

    handle = state.start("pay", None)
    with state.serve():
        result = handle.result(timeout=10)
    assert result == {"got": "ok", "error": {"type": "ValueError", "message": "bad card"}}
    assert len(tries) == 3
    assert tries[2] - tries[1] >= 0.09  # doubled: 0.05, then 0.1
    steps = state.run_info(handle.id).steps
    assert [(s.name, s.status) for s in steps] == [("flaky", "succeeded"), ("charge", "failed")]
    assert steps[1].error == {"type": "ValueError", "message": "bad card"}


def test_a_workflow_that_raises_fails_with_its_error(state: reactor.State) -> None:
    @state.workflow("boom")
    def boom(run: reactor.Run, _input: Any) -> None:
        run.step("fails", lambda: 1 / 0)

    @state.workflow("not-a-value")
    def not_a_value(_run: reactor.Run, _input: Any) -> object:
        return object()

    failing, odd = state.start("boom", None), state.start("not-a-value", None)
    with state.serve():
        with pytest.raises(reactor.WorkflowFailedError) as failed:
            failing.result(timeout=10)
        with pytest.raises(reactor.WorkflowFailedError) as invalid:
            odd.result(timeout=10)
    assert failed.value.error["type"] == "StepFailedError"
    assert "ZeroDivisionError" in failed.value.error["message"]
    assert invalid.value.error["type"] == "InvalidValueError"
    assert state.run_info(failing.id).status == "failed"


def test_sleep_suspends_the_run_without_holding_a_worker(state: reactor.State) -> None:
    @state.workflow("nap")
    def nap(run: reactor.Run, seconds: float) -> str:
        run.step("before", lambda: "x")
        run.sleep(seconds)
        return str(run.step("after", lambda: "woke"))

    @state.workflow("quick")
    def quick(_run: reactor.Run, _input: Any) -> str:
        return "done"

    sleeper = state.start("nap", 0.6)
    with state.serve(concurrency=1):
        wait_for(lambda: sleeper.status() == "suspended", timeout=10)
        # The one worker is free meanwhile.
        assert state.start("quick", None).result(timeout=5) == "done"
        started = time.monotonic()
        assert sleeper.result(timeout=10) == "woke"
        assert time.monotonic() - started < 1.5
    steps = state.run_info(sleeper.id).steps
    assert [(s.name, s.status) for s in steps] == [
        ("before", "succeeded"),
        ("sleep", "succeeded"),
        ("after", "succeeded"),
    ]
    assert steps[1].ended - steps[1].started >= 0.6


def test_receive_waits_for_messages_sent_to_the_run_in_order(state: reactor.State) -> None:
    @state.workflow("inbox")
    def inbox(run: reactor.Run, _input: Any) -> list[Any]:
        first = run.receive("note")
        second = run.receive("note")
        try:
            run.receive("never", timeout=0.2)
        except reactor.OperationTimeout:
            late = "timed out"
        return [first, second, late]

    handle = state.start("inbox", None, id="box")
    state.send("box", "note", {"n": 1})  # before it runs: kept
    with state.serve():
        wait_for(lambda: handle.status() == "suspended", timeout=10)
        assert state.run_info("box").steps[-1].name == "receive:note"
        state.send("box", "other", "ignored")
        state.send("box", "note", {"n": 2})
        assert handle.result(timeout=10) == [{"n": 1}, {"n": 2}, "timed out"]
    steps = state.run_info("box").steps
    assert [s.status for s in steps] == ["succeeded", "succeeded", "failed"]
    assert steps[2].error is not None
    assert steps[2].error["type"] == "OperationTimeout"
    with pytest.raises(KeyError):
        state.send("nobody", "note", 1)


def test_a_changed_order_of_steps_fails_the_run_on_resume(state: reactor.State) -> None:
    state.scope("config").set("path", "a")

    @state.workflow("fickle")
    def fickle(run: reactor.Run, _input: Any) -> str:
        run.step(state.scope("config").get("path"), lambda: 1)
        run.receive("go")
        return "end"

    handle = state.start("fickle", None)
    with state.serve():
        wait_for(lambda: handle.status() == "suspended", timeout=10)
        state.scope("config").set("path", "b")
        state.send(handle.id, "go", True)
        with pytest.raises(reactor.WorkflowFailedError) as failed:
            handle.result(timeout=10)
    assert failed.value.error["type"] == "NonDeterminismError"


def test_cancel_ends_a_waiting_run_at_once_and_a_running_one_at_its_step_s_end(
    state: reactor.State,
) -> None:
    release = threading.Event()

    @state.workflow("long")
    def long(run: reactor.Run, _input: Any) -> str:
        run.step("block", release.wait, 10)
        run.step("never", lambda: pytest.fail("a cancelled run ran on"))
        return "end"

    waiting = state.start("long", None, id="waiting")
    assert state.cancel("waiting") is True
    assert waiting.status() == "cancelled"
    with pytest.raises(reactor.RunCancelledError):
        waiting.result(timeout=1)
    assert state.cancel("waiting") is False
    running = state.start("long", None, id="running")
    with state.serve():
        wait_for(lambda: running.status() == "running", timeout=10)
        assert state.cancel("running") is True
        assert running.status() == "running"  # until its step ends
        release.set()
        with pytest.raises(reactor.RunCancelledError):
            running.result(timeout=10)
    assert [s.name for s in state.run_info("running").steps] == ["block"]
    with pytest.raises(KeyError):
        state.cancel("nobody")
    with pytest.raises(KeyError):
        state.run_info("nobody")


def test_stopping_the_workers_gives_a_run_back_for_others(open_state: Opener) -> None:
    state = open_state()
    entered, release = threading.Event(), threading.Event()

    @state.workflow("two")
    def two(run: reactor.Run, _input: Any) -> str:
        run.step("first", lambda: entered.set() or release.wait(10))
        return str(run.step("second", lambda: "second"))

    handle = state.start("two", None)
    workers = state.serve(concurrency=1)
    assert entered.wait(10)
    stopping = threading.Thread(target=workers.stop)
    stopping.start()
    release.set()
    stopping.join(15)
    assert handle.status() == "pending"
    with state.serve():
        assert handle.result(timeout=10) == "second"
    info = state.run_info(handle.id)
    assert info.attempts == 1
    assert [s.name for s in info.steps] == ["first", "second"]


def test_a_run_taken_while_every_worker_thread_stays_busy_goes_back_for_others(
    open_state: Opener,
) -> None:
    """Its take claimed it; after half its lease with no free thread it is given back
    (no attempt counted), and another process's workers run it before the lease ends."""
    busy, other = open_state(), open_state()
    release = threading.Event()
    calls: list[str] = []

    def blocking(run: reactor.Run, name: str) -> str:
        run.step("work", lambda: calls.append(name) or (name != "a" or release.wait(20)))
        return name

    for handle in (busy, other):
        handle.workflow("blocking", lease=6)(blocking)
    a = busy.start("blocking", "a", id="a")
    with busy.serve(concurrency=1):
        wait_for(lambda: calls == ["a"], timeout=10)
        b = busy.start("blocking", "b", id="b")
        wait_for(lambda: busy.run_info("b").status == "running", timeout=10)  # claimed
        wait_for(lambda: busy.run_info("b").status == "pending", timeout=10)  # given back
        assert calls == ["a"]
        with other.serve(concurrency=1):
            assert other.run("b").result(timeout=2.5) == "b"  # well before its lease's end
        release.set()
        assert a.result(timeout=10) == "a"
    assert sorted(calls) == ["a", "b"]
    assert (busy.run_info("b").attempts, busy.run_info("a").attempts) == (1, 1)
    assert b.status() == "succeeded"


def _new_threads(before: set[threading.Thread]) -> list[str]:
    new = set(threading.enumerate()) - before
    return sorted(thread.name for thread in new if thread.name.startswith("reactor"))


def _gate_and_busy(
    state: reactor.State, entered: threading.Event, release: threading.Event
) -> None:
    @state.workflow("gate")
    def gate(run: reactor.Run, key: str) -> Any:
        return run.wait_for("flags", key)

    @state.workflow("busy")
    def busy(run: reactor.Run, _input: Any) -> Any:
        return run.step("block", lambda: entered.set() or release.wait(10))


def test_closing_the_state_under_serving_workers_stops_every_thread_of_theirs(
    open_state: Opener,
) -> None:
    """No ``workers.stop()`` first: the close stops the takers, the lease keeper, the
    wait watcher and the pool, after the step under way ends; nothing is lost."""
    before = set(threading.enumerate())
    state = open_state()
    entered, release = threading.Event(), threading.Event()
    _gate_and_busy(state, entered, release)
    workers = state.serve(concurrency=2)
    gates = [state.start("gate", f"k{i}", id=f"g{i}") for i in range(3)]
    wait_for(lambda: all(gate.status() == "suspended" for gate in gates), timeout=10)
    busy = state.start("busy", None, id="busy")
    assert entered.wait(10)
    assert any(name.startswith("reactor-run") for name in _new_threads(before))
    threading.Timer(0.2, release.set).start()
    state.close()
    assert _new_threads(before) == []
    workers.stop()  # after the close: nothing left to stop, and no error
    again = open_state()
    _gate_and_busy(again, threading.Event(), threading.Event())
    for i in range(3):
        again.scope("flags").set(f"k{i}", i)
    with again.serve(concurrency=2):
        assert [again.run(gate.id).result(timeout=10) for gate in gates] == [0, 1, 2]
        assert again.run(busy.id).result(timeout=10) is True
    assert again.run_info(busy.id).attempts == 1


def test_closing_the_serving_handle_stops_its_workers_while_another_handle_works_on(
    open_state: Opener,
) -> None:
    before = set(threading.enumerate())
    serving, other = open_state(), open_state()
    _gate_and_busy(serving, threading.Event(), threading.Event())
    _gate_and_busy(other, threading.Event(), threading.Event())
    serving.serve(concurrency=2)
    gate = serving.start("gate", "k", id="g")
    wait_for(lambda: gate.status() == "suspended", timeout=10)
    serving.close()
    wait_for(lambda: not any("reactor-run" in name for name in _new_threads(before)), 10)
    with other.serve(concurrency=1):
        other.scope("flags").set("k", "open")
        assert other.run("g").result(timeout=10) == "open"


def test_bad_arguments_are_typed_errors_and_change_nothing(state: reactor.State) -> None:
    with pytest.raises(reactor.InvalidKeyError):
        state.workflow("")
    with pytest.raises(reactor.InvalidArgumentError):
        state.workflow("w", lease=-1)
    with pytest.raises(reactor.InvalidArgumentError):
        state.workflow("w", lease=float("nan"))
    with pytest.raises(reactor.InvalidArgumentError):
        state.workflow("w", max_attempts=0)
    with pytest.raises(reactor.InvalidKeyError):
        state.start("", None)
    with pytest.raises(reactor.InvalidKeyError):
        state.start("w", None, id="")
    with pytest.raises(reactor.InvalidValueError):
        state.start("w", {"bad": object()})
    with pytest.raises(reactor.InvalidArgumentError):
        state.serve(["unknown"])
    with pytest.raises(reactor.InvalidArgumentError):
        state.serve()  # nothing registered
    with pytest.raises(reactor.InvalidArgumentError):
        state.runs(status="lost")
    assert state.runs() == []
    assert state.stats()["revision"] == 0


def test_steps_check_their_arguments_inside_the_workflow(state: reactor.State) -> None:
    @state.workflow("checks")
    def checks(run: reactor.Run, _input: Any) -> list[str]:
        caught = []
        for bad in (
            lambda: run.step("", lambda: 1),
            lambda: run.step("s", lambda: 1, retries=-1),
            lambda: run.step("s", lambda: 1, backoff=float("inf")),
            lambda: run.sleep(-1),
            lambda: run.receive("t", timeout=float("nan")),
            lambda: run.step("odd", object),
        ):
            try:
                bad()
            except reactor.ReactorError as exc:
                caught.append(type(exc).__name__)
        return caught

    with state.serve():
        assert state.start("checks", None).result(timeout=10) == [
            "InvalidKeyError",
            "InvalidArgumentError",
            "InvalidArgumentError",
            "InvalidArgumentError",
            "InvalidArgumentError",
            "InvalidValueError",
        ]


def test_step_results_are_fresh_copies_as_a_replay_would_return(state: reactor.State) -> None:
    kept: dict[str, Any] = {"items": [1]}

    @state.workflow("copies")
    def copies(run: reactor.Run, _input: Any) -> Any:
        got = run.step("get", lambda: kept)
        got["items"].append(2)
        return got

    with state.serve():
        assert state.start("copies", None).result(timeout=10) == {"items": [1, 2]}
    assert kept == {"items": [1]}


def test_messages_sent_in_a_burst_are_each_received_once_in_order(state: reactor.State) -> None:
    calls: list[str] = []

    @state.workflow("burst")
    def burst(run: reactor.Run, _input: Any) -> list[Any]:
        run.step("once", lambda: calls.append(run.id))
        return [run.receive("t") for _ in range(3)]

    handles = [state.start("burst", None, id=f"b{n}") for n in range(6)]
    with state.serve(concurrency=3):
        for n, handle in enumerate(handles):
            if n % 2:  # some before the run looks, some while it waits
                wait_for(lambda h=handle: h.status() == "suspended", timeout=10)
            for message in range(3):
                state.send(handle.id, "t", message)
        assert [h.result(timeout=10) for h in handles] == [[0, 1, 2]] * 6
    assert sorted(calls) == sorted(h.id for h in handles)  # one worker each
    assert {state.run_info(h.id).attempts for h in handles} == {1}


def test_more_workflows_than_worker_threads_all_run(state: reactor.State) -> None:
    names = [f"w{n}" for n in range(14)]
    for name in names:
        state.workflow(name)(lambda run, _input: run.workflow)
    handles = [state.start(name, None) for name in names for _ in range(2)]
    with state.serve(concurrency=1):
        assert sorted(h.result(timeout=20) for h in handles) == sorted(names * 2)


def test_a_cancel_after_the_last_step_ends_the_run_cancelled(state: reactor.State) -> None:
    inside, release = threading.Event(), threading.Event()

    @state.workflow("tail")
    def tail(run: reactor.Run, _input: Any) -> str:
        run.step("only", lambda: 1)
        inside.set()
        release.wait(10)  # no step: the run ends with its return
        return "ended"

    handle = state.start("tail", None)
    with state.serve():
        assert inside.wait(10)
        assert state.cancel(handle.id) is True
        release.set()
        with pytest.raises(reactor.RunCancelledError):
            handle.result(timeout=10)
    assert state.run_info(handle.id).status == "cancelled"
