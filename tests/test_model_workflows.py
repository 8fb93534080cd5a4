"""Model-based testing of durable workflows (SPEC §14): a hypothesis state machine starts
runs, sends them messages, cancels them, and crashes their workers at chosen steps,
while workers serve in the background; a model written from the SPEC says how each run
ends and how many times each step's function may have run.

A run of workflow ``model`` is started with ``{"steps": N, "crash": [i, ...], "wait":
bool}``: it calls steps ``s0`` .. ``sN-1`` (each counting its calls), the first call of
each step in ``crash`` ending its worker's thread at once, before the record, as a
kill -9 would (a ``BaseException`` that no code of the engine catches: the job stays
taken until its lease runs out, then another worker takes the run again); then, if
``wait``, it receives one message. The model: a run not cancelled succeeds with
``{"steps": N, "message": the first message sent}``; a run cancelled before it ended
is cancelled, or had succeeded already; each step ran once, plus once per crash at it
(never again once recorded); ``attempts`` is 1 plus the crashes; every message sent
after the run's ``receive`` took one stays in its inbox, unread.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Final

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import reactor
from tests.conftest import wait_for

LEASE: Final = 0.3  # seconds: a crashed worker's run is taken again this soon
SETTLE: Final = 30.0  # seconds every run has to end in, once the machine stops


class Crash(BaseException):
    """Ends a worker's thread in the middle of a step, before its record."""


class WorkflowMachine(RuleBasedStateMachine):
    """Runs started, messaged, cancelled and crashed against the model."""

    path: ClassVar[Any] = None  # the database of the test that runs the machine
    instances: ClassVar[int] = 0  # each example's workflow and runs are its own

    def __init__(self) -> None:
        super().__init__()
        self.state = reactor.open(self.path)
        self.calls: dict[tuple[str, int], int] = {}
        self.crashed: set[tuple[str, int]] = set()
        self.lock = threading.Lock()
        self.runs: dict[str, dict[str, Any]] = {}  # id -> the model's run
        self.count = 0
        WorkflowMachine.instances += 1
        self.name = f"model{WorkflowMachine.instances}"
        self.state.workflow(self.name, max_attempts=100, lease=LEASE)(self.model)
        self.workers = self.state.serve([self.name], concurrency=3)

    def model(self, run: reactor.Run, plan: dict[str, Any]) -> dict[str, Any]:
        for i in range(plan["steps"]):
            run.step(f"s{i}", self.effect, run.id, i, i in plan["crash"])
        message = run.receive("m") if plan["wait"] else None
        return {"steps": plan["steps"], "message": message}

    def effect(self, run_id: str, step: int, crash: bool) -> int:
        with self.lock:
            self.calls[(run_id, step)] = self.calls.get((run_id, step), 0) + 1
            first_crash = crash and (run_id, step) not in self.crashed
            if first_crash:
                self.crashed.add((run_id, step))
        if first_crash:
            raise Crash
        return step

    @initialize()
    def fresh(self) -> None:
        assert self.state.runs(workflow=self.name) == []

    @rule(
        steps=st.integers(0, 4),
        crash=st.sets(st.integers(0, 3), max_size=2),
        wait=st.booleans(),
    )
    def start(self, steps: int, crash: set[int], wait: bool) -> None:
        run_id = f"{self.name}-r{self.count}"
        self.count += 1
        plan = {"steps": steps, "crash": sorted(c for c in crash if c < steps), "wait": wait}
        handle = self.state.start(self.name, plan, id=run_id)
        assert handle.id == run_id
        again = self.state.start(self.name, {"other": True}, id=run_id)  # the same run
        assert again.workflow == self.name
        self.runs[run_id] = {"plan": plan, "messages": [], "cancelled": False}

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), message=st.integers(-(2**31), 2**31))
    def send(self, data: st.DataObject, message: int) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.runs)))
        self.state.send(run_id, "m", message)
        self.runs[run_id]["messages"].append(message)

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.runs)))
        model = self.runs[run_id]
        was = self.state.run_info(run_id).status
        answered = self.state.cancel(run_id)
        if was in {"succeeded", "failed", "cancelled"}:
            assert answered is False  # ended: left as it was
        # Not ended then: True, unless it ended meanwhile (a running run asked to stop
        # stays "not finished" until its step ends: True again).
        model["cancelled"] = model["cancelled"] or answered

    @invariant()
    def statuses_are_known(self) -> None:
        for info in self.state.runs(workflow=self.name):
            assert info.status in {"pending", "running", "suspended", "succeeded", "cancelled"}

    def teardown(self) -> None:
        try:
            self.settle()
        finally:
            self.workers.stop()
            self.state.close()

    def settle(self) -> None:
        """Every run ends as the model says: waiting runs get a message if none came."""
        for run_id, model in self.runs.items():
            if model["plan"]["wait"] and not model["messages"] and not model["cancelled"]:
                self.state.send(run_id, "m", "last")
                model["messages"].append("last")
        for run_id, model in self.runs.items():
            handle = self.state.run(run_id)
            wait_for(lambda h=handle: h.status() in {"succeeded", "cancelled"}, timeout=SETTLE)
            info = self.state.run_info(run_id)
            plan = model["plan"]
            crashes = sum(1 for step in plan["crash"] if (run_id, step) in self.crashed)
            if info.status == "succeeded":
                first = model["messages"][0] if plan["wait"] else None
                assert info.result == {"steps": plan["steps"], "message": first}
                assert info.attempts == 1 + crashes
                assert [s.name for s in info.steps][: plan["steps"]] == [
                    f"s{i}" for i in range(plan["steps"])
                ]
            else:
                assert model["cancelled"], (run_id, info)
            for step in range(plan["steps"]):
                ran = self.calls.get((run_id, step), 0)
                limit = 1 + (1 if (run_id, step) in self.crashed else 0)
                assert ran <= limit, (run_id, step, ran)
                if info.status == "succeeded":
                    assert ran == limit, (run_id, step, ran)


@pytest.mark.timeout(600)
def test_workflows_against_the_model(db_path: Any) -> None:
    WorkflowMachine.path = db_path
    WorkflowMachine.TestCase.settings = settings(
        max_examples=12,
        stateful_step_count=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    try:
        WorkflowMachine.TestCase().runTest()
    finally:
        WorkflowMachine.path = None
