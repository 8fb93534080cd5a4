"""Durable workflows (SPEC §14): child runs (``run.call``) and ``run.transaction``,
whose writes commit with the step's record, exactly once."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest

import reactor
from tests.conftest import engine_of, wait_for

Opener = Callable[..., reactor.State]


@pytest.fixture
def state(open_state: Opener) -> reactor.State:
    state = open_state()

    @state.workflow("child")
    def child(run: reactor.Run, order: dict[str, Any]) -> Any:
        if order.get("wait"):
            run.receive("go")
        if order.get("fail"):
            raise ValueError(f"no stock for {order['id']}")
        return {"shipped": order["id"]}

    @state.workflow("parent")
    def parent(run: reactor.Run, order: dict[str, Any]) -> Any:
        try:
            return {"child": run.call("child", order)}
        except reactor.WorkflowFailedError as exc:
            return {"failed": exc.error}
        except reactor.RunCancelledError:
            return {"cancelled": True}

    return state


def test_a_child_run_s_result_comes_back_to_its_parent(state: reactor.State) -> None:
    handle = state.start("parent", {"id": "o-1", "wait": True}, id="p")
    with state.serve(concurrency=2):
        wait_for(lambda: handle.status() == "suspended", timeout=10)
        child = state.run_info("p/0")
        assert (child.workflow, child.input["id"]) == ("child", "o-1")
        wait_for(lambda: state.run("p/0").status() == "suspended", timeout=10)
        state.send("p/0", "go", None)
        assert handle.result(timeout=10) == {"child": {"shipped": "o-1"}}
    steps = state.run_info("p").steps
    assert [(s.name, s.status, s.result) for s in steps] == [
        ("call:child", "succeeded", {"shipped": "o-1"})
    ]


def test_a_child_s_failure_or_cancellation_is_raised_in_its_parent(
    state: reactor.State,
) -> None:
    failing = state.start("parent", {"id": "o-2", "fail": True}, id="f")
    waiting = state.start("parent", {"id": "o-3", "wait": True}, id="c")
    with state.serve(concurrency=2):
        result = failing.result(timeout=10)
        wait_for(lambda: state.run("c/0").status() == "suspended", timeout=10)
        assert state.cancel("c/0") is True
        assert waiting.result(timeout=10) == {"cancelled": True}
    assert result == {"failed": {"type": "ValueError", "message": "no stock for o-2"}}
    assert state.run_info("f").steps[0].error == result["failed"]


def test_cancelling_a_parent_cancels_its_children(state: reactor.State) -> None:
    handle = state.start("parent", {"id": "o-4", "wait": True}, id="p4")
    with state.serve(concurrency=2):
        wait_for(lambda: state.run_info("p4").status == "suspended", timeout=10)
        wait_for(lambda: state.run("p4/0").status() == "suspended", timeout=10)
        assert state.cancel("p4") is True
        with pytest.raises(reactor.RunCancelledError):
            handle.result(timeout=5)
        assert state.run("p4/0").status() == "cancelled"


def test_run_transaction_writes_commit_once_with_the_step_s_record(
    open_state: Opener,
) -> None:
    state = open_state()
    bodies: list[str] = []

    @state.workflow("book")
    def book(run: reactor.Run, amount: int) -> int:
        with run.transaction("orders", "ledger") as tx:
            bodies.append("body")
            tx["orders"].increment("count")
            tx["ledger"].push("entries", {"run": run.id, "amount": amount})
        run.receive("go")  # suspended: the function is called again from the top
        return int(run.step("read", lambda: state.scope("orders").get("count")))

    handle = state.start("book", 30, id="b")
    with state.serve():
        wait_for(lambda: handle.status() == "suspended", timeout=10)
        state.send("b", "go", None)
        assert handle.result(timeout=10) == 1
    assert bodies == ["body", "body"]  # replayed, its writes discarded
    assert state.scope("ledger").get("entries") == [{"run": "b", "amount": 30}]
    assert [s.name for s in state.run_info("b").steps] == ["transaction", "receive:go", "read"]


def test_a_run_transaction_that_raises_commits_nothing_and_fails_the_run(
    open_state: Opener,
) -> None:
    state = open_state()

    @state.workflow("broken")
    def broken(run: reactor.Run, _input: Any) -> None:
        with run.transaction("orders") as tx:
            tx["orders"].set("k", 1)
            raise RuntimeError("boom")

    with state.serve(), pytest.raises(reactor.WorkflowFailedError) as failed:
        state.start("broken", None).result(timeout=10)
    assert failed.value.error == {"type": "RuntimeError", "message": "boom"}
    assert state.scope("orders").get("k") is None


def test_wait_for_suspends_until_the_key_holds_what_it_waits_for(open_state: Opener) -> None:
    state = open_state()
    approvals = state.scope("approvals")

    @state.workflow("approve")
    def approve(run: reactor.Run, order: str) -> Any:
        decision = run.wait_for("approvals", order, lambda v: v["ok"] is not None)
        with contextlib.suppress(reactor.OperationTimeout):
            run.wait_for("approvals", "never", timeout=0.3)
        return decision

    handle = state.start("approve", "o-1", id="a")
    with state.serve(concurrency=1):
        wait_for(lambda: handle.status() == "suspended", timeout=10)
        approvals.set("o-1", {"ok": None})  # not yet: it looks, and waits again
        wait_for(lambda: handle.status() == "suspended" and state.run_info("a").attempts, 10)
        approvals.set("o-1", {"ok": True})
        assert handle.result(timeout=10) == {"ok": True}
    steps = state.run_info("a").steps
    assert [(s.name, s.status) for s in steps] == [
        ("wait_for", "succeeded"),
        ("wait_for", "failed"),
    ]
    assert steps[1].error is not None
    assert steps[1].error["type"] == "OperationTimeout"


def test_a_serving_process_listens_to_the_keys_runs_wait_for_only_while_they_wait(
    open_state: Opener,
) -> None:
    """The workers follow their runs' scope, and a key only while a run waits for it:
    the follower reads other processes' changes of those scopes alone, not of every
    scope (every worker process read every change of the database before)."""
    state = open_state()

    @state.workflow("gate")
    def gate(run: reactor.Run, _input: Any) -> Any:
        return run.wait_for("flags", "open")

    hub = engine_of(state).hub
    with state.serve(workflows=["gate"], concurrency=1):
        idle = hub.listened()
        assert idle is not None
        assert "run:gate" in idle
        assert "flags" not in idle
        handle = state.start("gate", None)
        wait_for(lambda: handle.status() == "suspended", timeout=10)
        wait_for(lambda: "flags" in (hub.listened() or ()), timeout=10)
        state.scope("flags").set("other", "no")  # another key: the run sleeps on
        state.scope("flags").set("open", "yes")
        assert handle.result(timeout=10) == "yes"
        wait_for(lambda: hub.listened() == idle, timeout=10)
    assert [(s.name, s.status) for s in state.run_info(handle.id).steps] == [
        ("wait_for", "succeeded")
    ]


def test_a_run_waiting_on_a_key_wakes_after_the_workers_restart(open_state: Opener) -> None:
    state = open_state()

    @state.workflow("gate")
    def gate(run: reactor.Run, _input: Any) -> Any:
        return run.wait_for("flags", "open")

    handle = state.start("gate", None)
    with state.serve():
        wait_for(lambda: handle.status() == "suspended", timeout=10)
    state.scope("flags").set("open", "yes")  # nobody serves it now
    with state.serve():
        assert handle.result(timeout=10) == "yes"


def test_tx_start_starts_a_run_with_the_transaction_or_not_at_all(open_state: Opener) -> None:
    state = open_state()

    @state.workflow("ship")
    def ship(_run: reactor.Run, order: str) -> str:
        return f"shipped {order}"

    with state.transaction("orders") as tx:
        tx["orders"].set("o-1", {"status": "paid"})
        handle = tx.start("ship", "o-1", id="ship-o-1")
        assert handle.status() == "pending"  # not committed yet
    with pytest.raises(RuntimeError), state.scope("orders").transaction() as tx:
        tx.set("o-2", {"status": "paid"})
        tx.start("ship", "o-2", id="ship-o-2")
        raise RuntimeError("rolled back")
    with state.transaction("orders") as tx:
        again = tx.start("ship", "other input", id="ship-o-1")
    assert again.workflow == "ship"
    with state.serve():
        assert handle.result(timeout=10) == "shipped o-1"
    assert state.run_info("ship-o-1").input == "o-1"
    with pytest.raises(KeyError):
        state.run_info("ship-o-2")
