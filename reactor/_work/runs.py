"""Durable workflows' runs (SPEC §14), as stored: each run is a JSON document, the
value of key RUN_ID in scope ``run:WORKFLOW``, so that every change of it is an
ordinary write with its event; scope ``run:`` maps each run id to its workflow (ids
are unique per database). A run is made ready by a job of queue ``run:WORKFLOW``,
whose item is the run's id and whose idempotency key is the id too: a run has one job
at most, and its lease is the run's (a worker's every record checks it holds it:
fencing). Suspending acknowledges that job and puts the one that wakes the run, in the
record's transaction; whatever resumes a run (a message, a child's end) makes its
waiting job ready at once (a debounce of 0).

Everything here runs in a write transaction holding ``locks(workflow)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from reactor._base.keys import RUN_PREFIX, check_key
from reactor._base.values import decode, encode
from reactor._engine.options import Options
from reactor._storage.records import Reservation, SharedScope
from reactor._storage.txn import WriteTxn
from reactor.errors import InvalidArgumentError

from . import jobs as _jobs

__all__ = [
    "FINAL",
    "INDEX",
    "Document",
    "check_run_id",
    "check_seconds",
    "check_topic",
    "check_workflow",
    "children",
    "encode_value",
    "error_of",
    "id_lock",
    "job_item",
    "locks",
    "queue_of",
    "scope_of",
    "shared_locks",
    "start_locks",
    "start_reads",
    "start_reservation",
    "step",
    "waiting_on_key",
    "wake",
]

INDEX: Final = RUN_PREFIX  # scope "run:": run id -> its workflow's name
FINAL: Final = frozenset({"succeeded", "failed", "cancelled"})
Document = dict[str, Any]


def check_workflow(name: object) -> str:
    """A workflow's name.

    Raises:
        InvalidKeyError: empty, or not a valid name.
    """
    return check_key(name, "workflow name")


def scope_of(workflow: str) -> str:
    """The scope of ``workflow``'s runs (and of their events)."""
    return RUN_PREFIX + workflow


def queue_of(workflow: str) -> str:
    """The queue whose jobs make ``workflow``'s runs ready."""
    return RUN_PREFIX + workflow


def locks(*workflows: str | None) -> tuple[str, ...]:
    """The scopes a transaction over the runs of ``workflows`` holds (None: none)."""
    found = {INDEX}
    for workflow in workflows:
        if workflow is not None:
            found.update((scope_of(workflow), _jobs.lock_name(queue_of(workflow))))
    return tuple(sorted(found))


def shared_locks(workflow: str) -> tuple[str, ...]:
    """The scopes a record that writes only a run's document and its job holds: the
    workflow's, in shared mode (``SharedScope``), so that records of different runs
    commit side by side across processes. Writes of another kind (a start, a send, a
    cancel, a put of the run's job) hold them plainly, and wait for those."""
    return tuple(
        SharedScope(scope) for scope in (scope_of(workflow), _jobs.lock_name(queue_of(workflow)))
    )


def start_locks(workflow: str, run_id: str) -> tuple[str, ...]:
    """The scopes a start of run ``run_id`` holds: the index and the workflow's in
    shared mode, and the run id's own lock (two starts of one id come in turn), so that
    starts go on beside other runs' records, and beside each other but for the
    numbering of their jobs (the queue's row, locked as the put reads it)."""
    return (SharedScope(INDEX), *shared_locks(workflow), id_lock(run_id))


def id_lock(run_id: str) -> str:
    """The name locked for one run id (not a scope: no scope name ends so)."""
    return f"{INDEX}{run_id}\x00id"


def start_reads(workflow: str, run_id: str) -> tuple[tuple[str, str], ...]:
    """The rows a start reads, read ahead with its begin."""
    return ((INDEX, run_id), (scope_of(workflow), run_id))


def start_reservation(workflow: str, run_id: str) -> Reservation:
    """The job id a start in shared mode reserves (``Store.create``): one, its key the
    run's id; none if the run exists."""
    return Reservation(queue_of(workflow), 1, (run_id,), (scope_of(workflow), run_id))


def job_item(doc: Document) -> dict[str, Any]:
    """The item of the job that makes a run ready: its id, and its parent's workflow
    (whose runs a record of its end writes too: the parent waits for it)."""
    parent = doc["parent"]
    return {"id": doc["id"], "parent": None if parent is None else parent["workflow"]}


def error_of(exc: BaseException) -> dict[str, str]:
    """A recorded error: the exception's type name and message."""
    return {"type": type(exc).__name__, "message": str(exc)}


def check_seconds(value: object, name: str) -> float:
    """A finite number of seconds >= 0.

    Raises:
        InvalidArgumentError: anything else.
    """
    seconds = _jobs.check_delay(value, zero=True) if value is not None else None
    if seconds is None:
        raise InvalidArgumentError(f"{name} must be a finite number >= 0, not {value!r}")
    return seconds


def encode_value(options: Options, value: Any) -> str:
    """``value``'s JSON text.

    Raises:
        InvalidValueError: it is not a value reactor stores.
    """
    return encode(value, max_depth=options.max_depth, max_bytes=options.max_value_bytes)


class Store:
    """Reads and writes of runs in one write transaction (``txn``)."""

    def __init__(self, options: Options, txn: WriteTxn) -> None:
        self.options = options
        self.txn = txn

    def encode(self, value: Any) -> str:
        return encode_value(self.options, value)

    def workflow_of(self, run_id: str) -> str | None:
        row = self.txn.row(INDEX, run_id)
        return None if row is None else str(decode(row.value))

    def read(self, workflow: str, run_id: str) -> Document | None:
        row = self.txn.row(scope_of(workflow), run_id)
        return None if row is None else dict(decode(row.value))

    def save(self, doc: Document) -> None:
        """Store ``doc`` (its ``updated`` set to now) over what the run's key holds."""
        scope = scope_of(doc["workflow"])
        doc["updated"] = self.txn.now
        old = self.txn.row(scope, doc["id"])
        self.txn.write(scope, doc["id"], old, self.encode(doc), None)

    def create(
        self, workflow: str, run_id: str, input_text: str, parent: Any, *, shared: bool = False
    ) -> Document:
        """A new run, pending, and its job (``shared``: see ``start_locks``).

        Raises:
            QueueLockNeeded: in shared mode, the run's queue is new, or a job holds the
                run's id already.
        """
        now = self.txn.now
        doc: Document = {
            "id": run_id,
            "workflow": workflow,
            "status": "pending",
            "input": decode(input_text),
            "result": None,
            "error": None,
            "attempts": 0,
            "steps": [],
            "created": now,
            "updated": now,
            "held": False,
            "inbox": {},
            "cancel": False,
            "parent": parent,
        }
        self.txn.write(INDEX, run_id, None, self.encode(workflow), None)
        self.save(doc)
        if shared:  # no job holds the id (else QueueLockNeeded): a plain put
            _name, entry = _jobs.check_put(
                self.options, queue_of(workflow), job_item(doc), None, run_id
            )
            _jobs.enqueue(self.txn, queue_of(workflow), [entry], shared=True)
        else:
            self.ready(doc, None)
        return doc

    def ready(self, doc: Document, delay: float | None) -> None:
        """Make the run ready (in ``delay`` seconds): its job, or the one it has
        (ready at once if it waits). A job of the run that is taken is left as it is,
        and none is added: its worker replays the run, and sees what changed (a second
        job would have two workers run it at once)."""
        queue = queue_of(doc["workflow"])
        if delay is None:
            held = self.txn.writes.jobs().holders(queue, [doc["id"]]).get(doc["id"], [])
            if any(state == "taken" for _, state in held):
                return
        _name, entry = _jobs.check_put(
            self.options,
            queue,
            job_item(doc),
            None if delay is None else delay,
            doc["id"],
            debounce=0 if delay is None else None,
        )
        _jobs.enqueue(self.txn, queue, [entry])

    def put_step(self, doc: Document, position: int, step: dict[str, Any]) -> None:
        """Record ``step`` at ``position`` of ``doc`` (over a waiting one there)."""
        steps = doc["steps"]
        if position < len(steps):
            steps[position] = step
        else:
            steps.append(step)

    def finish(
        self,
        doc: Document,
        status: str,
        result: Any = None,
        error: dict[str, str] | None = None,
    ) -> None:
        """Record the run's end (its job is the caller's to acknowledge), and make its
        parent ready if it waits for it."""
        doc.update(status=status, result=result, error=error, held=False)
        self.save(doc)
        parent = doc["parent"]
        if parent is None:
            return
        waiting = self.read(parent["workflow"], parent["id"])
        if waiting is not None and waiting["status"] == "suspended":
            steps = waiting["steps"]
            if steps and steps[-1]["status"] == "waiting" and steps[-1].get("child") == doc["id"]:
                self.ready(waiting, None)


def step(
    name: str,
    status: str,
    result: Any,
    error: dict[str, str] | None,
    started: float,
    ended: float | None,
) -> dict[str, Any]:
    """A step's record."""
    return {
        "name": name,
        "status": status,
        "result": result,
        "error": error,
        "started": started,
        "ended": ended,
    }


def start(
    options: Options,
    workflow: str,
    run_id: str,
    input_text: str,
    parent: Any = None,
    *,
    shared: bool = False,
) -> Callable[[WriteTxn], tuple[str, bool]]:
    """The work of ``state.start``: the run's workflow, and whether it was created (an
    existing id changes nothing). ``shared``: it holds ``start_locks``.

    Raises:
        QueueLockNeeded: in shared mode, start again holding ``locks(workflow)``.
    """

    def work(txn: WriteTxn) -> tuple[str, bool]:
        store = Store(options, txn)
        known = store.workflow_of(run_id)
        if known is not None:
            return known, False
        store.create(workflow, run_id, input_text, parent, shared=shared)
        return workflow, True

    return work


def send(
    options: Options, workflow: str, run_id: str, topic: str, message_text: str
) -> Callable[[WriteTxn], bool]:
    """The work of ``state.send``: keep the message for the run, and make the run ready
    if it waits for that topic; whether the run exists."""

    def work(txn: WriteTxn) -> bool:
        store = Store(options, txn)
        doc = store.read(workflow, run_id)
        if doc is None:
            return False
        doc["inbox"].setdefault(topic, []).append(decode(message_text))
        store.save(doc)
        if doc["status"] == "suspended" and waiting_for(doc) == f"receive:{topic}":
            store.ready(doc, None)
        return True

    return work


def cancel(options: Options, runs: list[tuple[str, str]]) -> Callable[[WriteTxn], bool | None]:
    """The work of ``state.cancel`` of ``runs[0]`` (workflow, id), and of its children
    after it (the rest): whether the run was not finished (None: no such run). A
    pending or suspended run is cancelled now; a running one at its step's end (its
    worker's next record sees the request)."""

    def work(txn: WriteTxn) -> bool | None:
        store = Store(options, txn)
        outcome: bool | None = None
        for position, (workflow, run_id) in enumerate(runs):
            doc = store.read(workflow, run_id)
            done = doc is not None and doc["status"] not in FINAL
            if position == 0:
                outcome = None if doc is None else done
            if doc is None or not done:
                continue
            if doc["status"] == "running":
                doc["cancel"] = True
                store.save(doc)
            else:
                store.finish(doc, "cancelled")
        return outcome

    return work


def children(doc: Document) -> list[tuple[str, str]]:
    """The runs ``doc``'s ``call`` steps started: (workflow, id)."""
    return [
        (step["workflow"], step["child"]) for step in doc["steps"] if step.get("child") is not None
    ]


def waiting_for(doc: Document) -> str | None:
    """The name of the step the run waits on (its last, if waiting), or None."""
    steps = doc["steps"]
    if steps and steps[-1]["status"] == "waiting":
        return str(steps[-1]["name"])
    return None


def check_run_id(run_id: object) -> str:
    """A run's id.

    Raises:
        InvalidKeyError: not a valid key.
    """
    return check_key(run_id, "run id")


def check_topic(topic: object) -> str:
    """A message topic.

    Raises:
        InvalidKeyError: not a valid key.
    """
    return check_key(topic, "topic")


def wake(options: Options, workflow: str, run_id: str, position: int) -> Callable[[WriteTxn], bool]:
    """Make the run ready if it is still suspended on its step at ``position`` (a key it
    waits for changed: the run looks again); whether it was."""

    def work(txn: WriteTxn) -> bool:
        store = Store(options, txn)
        doc = store.read(workflow, run_id)
        if doc is None or doc["status"] != "suspended" or len(doc["steps"]) != position + 1:
            return False
        store.ready(doc, None)
        return True

    return work


def waiting_on_key(doc: Document) -> tuple[str, str, int, int] | None:
    """(scope, key, the key's revision as last seen, the step's position) of the key a
    suspended run waits for (``run.wait_for``), or None."""
    steps = doc.get("steps")
    if doc.get("status") != "suspended" or not steps:
        return None
    last = steps[-1]
    if last["status"] != "waiting" or last["name"] != "wait_for":
        return None
    return last["scope"], last["key"], last["seen"], len(steps) - 1
