"""``RunHandle``: a durable workflow's run by its id (SPEC §14): ``status()`` and
``result(timeout)``, which waits on the run's change events, across processes."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reactor._base.values import decode
from reactor._engine.options import Options
from reactor._storage.txn import WriteTxn
from reactor._work import runs as _runs
from reactor.errors import RunCancelledError, WorkflowFailedError

from . import waiting as _waiting

if TYPE_CHECKING:
    from .binding import Binding

__all__ = ["RunHandle", "start_in"]


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

    def status(self) -> str:
        """``pending``, ``running``, ``suspended``, ``succeeded``, ``failed`` or
        ``cancelled`` (``pending`` too for a run started in a transaction that has not
        committed yet)."""
        engine = self._binding.engine
        text = engine.store.get(_runs.scope_of(self.workflow), self.id, engine.now())
        return "pending" if text is None else str(decode(text)["status"])

    def result(self, timeout: float | None = None) -> Any:
        """Wait (without polling, across processes) until the run ends; its result.

        Raises:
            WorkflowFailedError: it failed (``error``: the recorded error).
            RunCancelledError: it was cancelled.
            OperationTimeout: it had not ended within ``timeout`` seconds.
            InvalidArgumentError: a bad ``timeout``.
        """
        engine = self._binding.engine

        def ended(doc: Any) -> bool:
            return isinstance(doc, dict) and doc.get("status") in _runs.FINAL

        key, seconds = _waiting.check_wait(self.id, ended, timeout)
        doc = _waiting.wait(engine, _runs.scope_of(self.workflow), key, ended, seconds)
        return outcome(doc)


def outcome(doc: dict[str, Any]) -> Any:
    """What ``result()`` returns, or raises, for a run that ended as ``doc`` says."""
    if doc["status"] == "succeeded":
        return doc["result"]
    if doc["status"] == "cancelled":
        raise RunCancelledError(f"run {doc['id']} was cancelled")
    error = doc["error"] or {"type": "Error", "message": "failed"}
    raise WorkflowFailedError(f"run {doc['id']} failed: {error['type']}: {error['message']}", error)


def start_in(
    binding: Binding,
    options: Options,
    txn: WriteTxn,
    defer: Callable[[Callable[[WriteTxn], None], tuple[str, ...]], None],
    started: tuple[str, Any, str | None],
) -> RunHandle:
    """``tx.start``: start run ``started`` (workflow, input, id) with the commit of a
    transaction body (``txn``; ``defer`` runs work in its commit, holding scopes).

    Raises:
        InvalidKeyError: an empty workflow name or id.
        InvalidValueError: the input is not a value.
    """
    workflow, value, run_id = started
    name = _runs.check_workflow(workflow)
    identity = uuid.uuid4().hex if run_id is None else _runs.check_run_id(run_id)
    text = _runs.encode_value(options, value)
    known = txn.row(_runs.INDEX, identity)
    if known is not None:  # an existing id: that run, and nothing changes
        return RunHandle(binding, identity, str(decode(known.value)))
    start = _runs.start(options, name, identity, text)

    def deferred(commit: WriteTxn) -> None:
        start(commit)

    defer(deferred, _runs.locks(name))
    return RunHandle(binding, identity, name)
