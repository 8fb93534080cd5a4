"""Durable workflows (SPEC §14), a handle's side: the functions registered under
names, ``start``, the run handles, and what anyone may ask of a run by its id
(``run_info``, ``runs``, ``send``, ``cancel``). Workers are in ``run_workers``, a
run's replay in ``run``, the stored form in ``_work.runs``."""

from __future__ import annotations

import math
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reactor._base.keys import compile_pattern
from reactor._base.results import RunInfo, StepInfo
from reactor._storage.records import ReadsAhead
from reactor._work import runs as _runs
from reactor._work.jobs import QueueLockNeeded
from reactor.errors import InvalidArgumentError

from .run_handle import RunHandle
from .scope import Scope

if TYPE_CHECKING:
    from .binding import Binding

__all__ = ["Registered", "Workflows"]

STATUSES = ("pending", "running", "suspended", "succeeded", "failed", "cancelled")
# engine -> the workflows registered on it in this process (gone with the engine)
_REGISTRY: weakref.WeakKeyDictionary[object, dict[str, Registered]] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


@dataclass(frozen=True)
class Registered:
    """A workflow function and how its runs are held."""

    fn: Callable[..., Any]
    max_attempts: int
    lease: float


class Workflows:
    """A handle's workflows: the functions registered in this process, and the runs
    in the database."""

    def __init__(self, binding: Binding) -> None:
        self._binding = binding

    @property
    def registered(self) -> dict[str, Registered]:
        """The workflows registered in this process on this database, through any
        handle (``reactor serve --workflows MODULE`` serves what a module registered)."""
        engine = self._binding.engine
        with _REGISTRY_LOCK:
            return _REGISTRY.setdefault(engine, {})

    @staticmethod
    def check(name: object, max_attempts: object, lease: object) -> tuple[str, int, float]:
        """A registration's name, ``max_attempts`` and ``lease``.

        Raises:
            InvalidKeyError: an empty name.
            InvalidArgumentError: a bad ``max_attempts`` or ``lease``.
        """
        checked = _runs.check_workflow(name)
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
        seconds = _runs.check_seconds(lease, "lease")
        if seconds == 0 or not math.isfinite(seconds):
            raise InvalidArgumentError(f"lease must be a finite number > 0, not {lease!r}")
        return checked, max_attempts, seconds

    def register(
        self, name: str, max_attempts: int, lease: float
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator registering a function as workflow ``name``."""
        checked, max_attempts, seconds = self.check(name, max_attempts, lease)

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
        reads = _runs.start_reads(workflow, identity)
        try:
            # Beside other runs' records and starts; a new queue, or a job that holds
            # the id already, needs the workflow's locks (QueueLockNeeded). Its job's id
            # is reserved as the start begins.
            work = _runs.start(engine.options, workflow, identity, text, shared=True)
            scopes = _runs.start_locks(workflow, identity)
            ahead = ReadsAhead(reads, _runs.start_reservation(workflow, identity))
            known, _created = engine.commit(work, scopes=scopes, reads=ahead)
        except QueueLockNeeded:
            work = _runs.start(engine.options, workflow, identity, text)
            known, _created = engine.commit(work, scopes=_runs.locks(workflow), reads=reads)
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
        """Cancel run ``run_id``, and its children; whether it was not finished.

        Raises:
            KeyError: no such run.
        """
        runs = self._family(run_id)
        engine = self._binding.engine
        root = Scope(self._binding, _runs.scope_of(runs[0][0])).get(run_id) or {}
        parent = (root.get("parent") or {}).get("workflow")
        scopes = _runs.locks(parent, *(workflow for workflow, _ in runs))
        done = engine.commit(_runs.cancel(engine.options, runs), scopes=scopes)
        if done is None:
            raise KeyError(run_id)
        return done

    def _family(self, run_id: str) -> list[tuple[str, str]]:
        """Run ``run_id`` and its descendants (those its ``call`` steps started):
        (workflow, id), the run first.

        Raises:
            KeyError: no such run.
        """
        found = [(self.workflow_of(run_id), run_id)]
        seen = {run_id}
        for workflow, each in found:  # grows as it goes: breadth first
            doc = Scope(self._binding, _runs.scope_of(workflow)).get(each)
            for child in [] if doc is None else _runs.children(doc):
                if child[1] not in seen:
                    seen.add(child[1])
                    found.append(child)
        return found


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
