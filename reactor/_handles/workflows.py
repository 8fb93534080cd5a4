"""Durable workflows (SPEC §14), a handle's side: the functions registered under
names, ``start``, the run handles, and what anyone may ask of a run by its id
(``run_info``, ``runs``, ``send``, ``cancel``). Workers are in ``run_workers``, a
run's replay in ``run``, the stored form in ``_work.runs``."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reactor._base.keys import compile_pattern
from reactor._base.results import RunInfo, StepInfo
from reactor._work import runs as _runs
from reactor.errors import (
    InvalidArgumentError,
    RunCancelledError,
    WorkflowFailedError,
)

from .scope import Scope

if TYPE_CHECKING:
    from .binding import Binding

__all__ = ["Registered", "RunHandle", "Workflows"]

STATUSES = ("pending", "running", "suspended", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Registered:
    """A workflow function and how its runs are held."""

    fn: Callable[..., Any]
    max_attempts: int
    lease: float


class RunHandle:
    """A workflow's run, by its id: ``status()``, ``result(timeout)``."""

    __slots__ = ("_binding", "id", "workflow")

    def __init__(self, binding: Binding, run_id: str, workflow: str) -> None:
        self._binding = binding
        self.id: str = run_id
        """The run's id."""
        self.workflow: str = workflow
        """Its workflow's name."""

    def __repr__(self) -> str:
        return f"<reactor.RunHandle {self.id!r} of {self.workflow!r}>"

    def _scope(self) -> Scope:
        return Scope(self._binding, _runs.scope_of(self.workflow))

    def status(self) -> str:
        """``pending``, ``running``, ``suspended``, ``succeeded``, ``failed`` or
        ``cancelled``."""
        return str(self._scope().get(self.id)["status"])

    def result(self, timeout: float | None = None) -> Any:
        """Wait (without polling, across processes) until the run ends; its result.

        Raises:
            WorkflowFailedError: it failed (``error``: the recorded error).
            RunCancelledError: it was cancelled.
            OperationTimeout: it had not ended within ``timeout`` seconds.
        """
        doc = self._scope().wait_for(
            self.id, lambda value: value["status"] in _runs.FINAL, timeout=timeout
        )
        return _outcome(doc)


def _outcome(doc: dict[str, Any]) -> Any:
    if doc["status"] == "succeeded":
        return doc["result"]
    if doc["status"] == "cancelled":
        raise RunCancelledError(f"run {doc['id']} was cancelled")
    error = doc["error"] or {"type": "Error", "message": "failed"}
    raise WorkflowFailedError(f"run {doc['id']} failed: {error['type']}: {error['message']}", error)


class Workflows:
    """A handle's workflows: the functions registered in this process, and the runs
    in the database."""

    def __init__(self, binding: Binding) -> None:
        self._binding = binding
        self.registered: dict[str, Registered] = {}

    def register(
        self, name: str, max_attempts: int, lease: float
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator registering a function as workflow ``name``."""
        checked = _runs.check_workflow(name)
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
        seconds = _runs.check_seconds(lease, "lease")
        if seconds == 0 or not math.isfinite(seconds):
            raise InvalidArgumentError(f"lease must be a finite number > 0, not {lease!r}")

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(fn):
                raise InvalidArgumentError(f"a workflow is a function, not {fn!r}")
            self.registered[checked] = Registered(fn, max_attempts, seconds)
            return fn

        return decorate

    def start(self, name: str, input: Any, run_id: str | None) -> RunHandle:  # noqa: A002 - the spec's name
        """Record a run of ``name`` and make it ready (an existing id: its handle)."""
        workflow = _runs.check_workflow(name)
        engine = self._binding.engine
        identity = uuid.uuid4().hex if run_id is None else _runs.check_run_id(run_id)
        text = _runs.encode_value(engine.options, input)
        work = _runs.start(engine.options, workflow, identity, text)
        known, _created = engine.commit(work, scopes=(*_runs.locks(workflow),))
        return RunHandle(self._binding, identity, known)

    def workflow_of(self, run_id: str) -> str:
        """The workflow of run ``run_id``.

        Raises:
            KeyError: no such run.
        """
        checked = _runs.check_run_id(run_id)
        workflow = Scope(self._binding, _runs.INDEX).get(checked)
        if workflow is None:
            raise KeyError(run_id)
        return str(workflow)

    def handle(self, run_id: str) -> RunHandle:
        return RunHandle(self._binding, run_id, self.workflow_of(run_id))

    def run_info(self, run_id: str) -> RunInfo:
        """Run ``run_id`` as recorded.

        Raises:
            KeyError: no such run.
        """
        workflow = self.workflow_of(run_id)
        doc = Scope(self._binding, _runs.scope_of(workflow)).get(run_id)
        if doc is None:
            raise KeyError(run_id)
        return info_of(doc)

    def runs(self, workflow: str = "*", status: str | None = None) -> list[RunInfo]:
        """The runs of the workflows whose names match ``workflow`` (a glob), with
        ``status`` if given, oldest first."""
        pattern = compile_pattern(workflow)
        if status is not None and status not in STATUSES:
            raise InvalidArgumentError(f"status is one of {', '.join(STATUSES)}, not {status!r}")
        engine = self._binding.engine
        found: list[RunInfo] = []
        for scope in engine.store.scopes(engine.now()):
            name = scope.removeprefix(_runs.INDEX)
            if scope in {_runs.INDEX, name} or not pattern.matches(name):
                continue
            docs = Scope(self._binding, scope).list().values()
            found.extend(info_of(doc) for doc in docs if status in {None, doc["status"]})
        return sorted(found, key=lambda info: (info.created, info.id))

    def send(self, run_id: str, topic: str, message: Any) -> None:
        """Keep ``message`` for run ``run_id`` on ``topic`` (its ``receive`` gets it).

        Raises:
            KeyError: no such run.
        """
        workflow = self.workflow_of(run_id)
        engine = self._binding.engine
        checked = _runs.check_topic(topic)
        text = _runs.encode_value(engine.options, message)
        work = _runs.send(engine.options, workflow, run_id, checked, text)
        if not engine.commit(work, scopes=_runs.locks(workflow)):
            raise KeyError(run_id)

    def cancel(self, run_id: str) -> bool:
        """Cancel run ``run_id``; whether it was not finished.

        Raises:
            KeyError: no such run.
        """
        workflow = self.workflow_of(run_id)
        engine = self._binding.engine
        done = engine.commit(
            _runs.cancel(workflow, run_id, engine.options), scopes=_runs.locks(workflow)
        )
        if done is None:
            raise KeyError(run_id)
        return done


def info_of(doc: dict[str, Any]) -> RunInfo:
    """A run's document as ``RunInfo``."""
    return RunInfo(
        id=doc["id"],
        workflow=doc["workflow"],
        status=doc["status"],
        input=doc["input"],
        result=doc["result"],
        error=doc["error"],
        attempts=doc["attempts"],
        steps=[
            StepInfo(
                name=step["name"],
                status=step["status"],
                result=step["result"],
                error=step["error"],
                started=step["started"],
                ended=step["ended"],
            )
            for step in doc["steps"]
        ],
        created=doc["created"],
        updated=doc["updated"],
    )
