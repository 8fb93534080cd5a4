"""``Run``: what a workflow function is given (SPEC §14): its steps, suspensions,
child runs and transactions, recorded by its ``Runner``.

Each call of the function replays the run from the top: a recorded step returns its
recorded result (or raises its recorded error) at once, in the recorded order (else
``NonDeterminismError``); the first step not recorded runs and is recorded before it
returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from reactor._base.keys import check_key
from reactor._base.values import decode
from reactor._storage.txn import WriteTxn
from reactor._work import runs as _runs
from reactor.errors import (
    ConflictError,
    InvalidArgumentError,
    LockNotOwnedError,
    NonDeterminismError,
    OperationTimeout,
    RunCancelledError,
    StepFailedError,
    WorkflowFailedError,
)

from .runner import Runner, Unwind, suspend_in
from .scope import Scope
from .transaction import Hold, MultiTransaction
from .transaction_scopes import scope_names

if TYPE_CHECKING:
    from .binding import Binding

__all__ = ["Run"]


class _Discard(Exception):
    """Rolls back a replayed ``run.transaction``'s body: its writes committed once."""


class Run:
    """The running workflow's side of a run: its id, input and attempts, and the verbs
    that record steps and suspend it."""

    def __init__(self, binding: Binding, runner: Runner, doc: _runs.Document) -> None:
        self._binding = binding
        self.runner = runner
        self._recorded: list[dict[str, Any]] = doc["steps"]
        self._position = 0
        self.id: str = doc["id"]
        """The run's id."""
        self.workflow: str = doc["workflow"]
        """The workflow's name."""
        self.input: Any = doc["input"]
        """What the run was started with."""
        self.attempts: int = doc["attempts"]
        """1 at its first take; one more each time it was taken after a lease ran out."""

    def __repr__(self) -> str:
        return f"<reactor.Run {self.id!r} of {self.workflow!r}>"

    # -- replay ---------------------------------------------------------------------
    def next_step(self, name: str) -> tuple[int, dict[str, Any] | None]:
        """The position of the step called now, and its record if it has one.

        Raises:
            Unwind: it was recorded under another name (the run failed:
                ``NonDeterminismError``).
        """
        position = self._position
        self._position += 1
        if position >= len(self._recorded):
            return position, None
        recorded = self._recorded[position]
        if recorded["name"] != name:
            error = NonDeterminismError(
                f"step {position} of run {self.id} is {name!r} now, but {recorded['name']!r} "
                "was recorded: steps must be called in the recorded order"
            )
            self.runner.finish("failed", error=_runs.error_of(error))
            raise Unwind
        return position, recorded

    def going_on(self) -> None:
        """Before a step runs: give the run back if this process stops serving."""
        if self.runner.stopping.is_set():
            raise self.runner.release()

    # -- steps ------------------------------------------------------------------------
    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: int = 0,
        backoff: float = 1.0,
        **kwargs: Any,
    ) -> Any:
        """Call ``fn(*args, **kwargs)`` and record its result before returning it; a
        recorded step returns its recorded result at once. An exception is retried up
        to ``retries`` times (waiting ``backoff`` seconds, doubled each time), then
        recorded and raised as ``StepFailedError``.

        Raises:
            StepFailedError: ``fn`` raised past its retries (now or when recorded).
            InvalidValueError: ``fn`` returned something that is not a value.
            InvalidKeyError: an empty ``name``.
            InvalidArgumentError: a bad ``retries`` or ``backoff``.
        """
        call = StepCall(self, name, retries, backoff)
        if call.recorded is not None:
            return replayed(call.recorded)
        for attempt in range(retries + 1):
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if self.runner.stopping.wait(call.failed(attempt, exc)):
                    raise self.runner.release() from exc
                continue
            return call.succeeded(result)
        raise AssertionError("the last attempt returns or raises")  # pragma: no cover

    def sleep(self, seconds: float) -> None:
        """Suspend the run for ``seconds``, holding no worker and no thread.

        Raises:
            InvalidArgumentError: not a finite number >= 0.
        """
        seconds = _runs.check_seconds(seconds, "seconds")
        self._sleep(lambda now: now + seconds)

    def sleep_until(self, epoch: float) -> None:
        """Suspend the run until ``epoch`` (seconds since the epoch).

        Raises:
            InvalidArgumentError: not a finite number >= 0.
        """
        until = _runs.check_seconds(epoch, "epoch")
        self._sleep(lambda _now: until)

    def _sleep(self, wake_at: Callable[[float], float]) -> None:
        position, recorded = self.next_step("sleep")
        if recorded is not None and recorded["status"] != "waiting":
            return
        runner = self.runner
        now = runner.engine.now()
        if recorded is None:
            self.going_on()
            step = _runs.step("sleep", "waiting", None, None, now, None)
            step["until"] = wake_at(now)
        else:
            step = recorded
        if now >= step["until"]:
            runner.record_step(position, {**step, "status": "succeeded", "ended": now})
            return
        raise runner.suspend(position, step, step["until"] - now)

    def receive(self, topic: str, timeout: float | None = None) -> Any:
        """The next message ``state.send`` sent this run on ``topic`` (each received
        once, in order); the run is suspended until one comes.

        Raises:
            OperationTimeout: none came within ``timeout`` seconds (recorded).
            InvalidKeyError: an empty ``topic``.
            InvalidArgumentError: a bad ``timeout``.
        """
        check_key(topic, "topic")
        seconds = None if timeout is None else _runs.check_seconds(timeout, "timeout")
        position, step, done = self._waiting_step(f"receive:{topic}", seconds)
        if done:
            return _waited(step)
        received, message = self.runner.receive(position, step, topic, step["deadline"])
        if not received:
            raise OperationTimeout(f"no message {topic!r} came within {timeout} s")
        return message

    def wait_for(
        self,
        scope: str,
        key: str,
        predicate: Callable[[Any], bool] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Wait until ``key`` of ``scope`` holds a value for which ``predicate`` is true
        (without one: until it exists), as ``scope.wait_for``, durably: suspended
        meanwhile, the run looks again at each change of the key, in any process that
        serves it. The value is recorded and returned.

        Raises:
            OperationTimeout: not within ``timeout`` seconds (recorded).
            InvalidKeyError: a bad scope name or key.
            InvalidArgumentError: a bad ``timeout``.
        """
        watched = Scope(self._binding, scope)
        check_key(key)
        seconds = None if timeout is None else _runs.check_seconds(timeout, "timeout")
        position, step, done = self._waiting_step("wait_for", seconds)
        if done:
            return _waited(step)
        step.setdefault("scope", watched.name)
        step.setdefault("key", key)
        step.setdefault("seen", 0)
        runner = self.runner
        while True:
            entry = watched.entry(key)
            seen = 0 if entry is None else entry.revision
            if entry is not None and (predicate is None or predicate(entry.value)):
                ended = {**step, "status": "succeeded", "result": entry.value, "seen": seen}
                runner.record_step(position, {**ended, "ended": runner.engine.now()})
                return entry.value
            if step["deadline"] is not None and runner.engine.now() >= step["deadline"]:
                error = _runs.error_of(OperationTimeout(f"{scope}/{key} did not come in time"))
                failed = {**step, "status": "failed", "error": error, "seen": seen}
                runner.record_step(position, {**failed, "ended": runner.engine.now()})
                raise OperationTimeout(error["message"])
            if runner.suspend_on_key(position, {**step, "seen": seen}):
                raise Unwind

    def _waiting_step(self, name: str, seconds: float | None) -> tuple[int, dict[str, Any], bool]:
        """The step of a wait called now (``receive``, ``wait_for``): its position,
        its record, and whether it ended already (replayed: ``_waited`` gives its
        outcome); a new one is recorded waiting until ``seconds`` from now (None: no
        deadline)."""
        position, recorded = self.next_step(name)
        if recorded is not None:
            return position, recorded, recorded["status"] != "waiting"
        self.going_on()
        now = self.runner.engine.now()
        step = _runs.step(name, "waiting", None, None, now, None)
        step["deadline"] = None if seconds is None else now + seconds
        return position, step, False

    def call(self, workflow: str, input: Any = None, id: str | None = None) -> Any:  # noqa: A002 - the spec's names
        """Start a child run of ``workflow`` (id ``id``, by default this run's id and
        the step's position) and wait for its result, suspended meanwhile.

        Raises:
            WorkflowFailedError: the child failed (``error``: its recorded error).
            RunCancelledError: the child was cancelled.
            InvalidArgumentError: ``id`` is a run's that is not a child of this one.
        """
        child_workflow = _runs.check_workflow(workflow)
        name = f"call:{child_workflow}"
        position, recorded = self.next_step(name)
        if recorded is not None and recorded["status"] != "waiting":
            return _called(recorded)
        runner = self.runner
        if recorded is None:
            self.going_on()
            child = f"{self.id}/{position}" if id is None else _runs.check_run_id(id)
            text = _runs.encode_value(runner.engine.options, input)
            step = {**_runs.step(name, "waiting", None, None, runner.engine.now(), None)}
            step.update(child=child, workflow=child_workflow)
        else:
            step, text = recorded, None
        parent = {"id": self.id, "workflow": self.workflow}

        def change(store: _runs.Store, doc: _runs.Document) -> dict[str, Any] | None:
            if store.workflow_of(step["child"]) is None:
                assert text is not None  # a recorded call's child exists
                store.create(child_workflow, step["child"], text, parent)
            found = store.read(child_workflow, step["child"])
            if found is None or found["parent"] != parent:
                raise InvalidArgumentError(
                    f"run {step['child']!r} exists, and is not a child of run {self.id!r}"
                )
            if found["status"] in _runs.FINAL:
                done = _child_ended(step, found, store.txn.now)
                store.put_step(doc, position, done)
                store.save(doc)
                return done
            suspend_in(store, doc, position, step)
            runner.job_done(store)
            return None

        done = runner.commit(change, extra=_runs.locks(child_workflow))
        if done is None:
            raise Unwind
        return _called(done)

    @contextlib.contextmanager
    def transaction(self, *scopes: str) -> Iterator[MultiTransaction]:
        """A transaction over ``scopes`` (as ``state.transaction``) that is a step: its
        writes commit in the same transaction as its record, exactly once. Replayed, its
        body runs again and its writes are discarded (they committed once).

        Raises:
            InvalidKeyError, InvalidArgumentError: bad scope names, as
                ``state.transaction``.
        """
        names = scope_names(scopes)
        position, recorded = self.next_step("transaction")
        hold = Hold(self._binding, names)
        tx = MultiTransaction(self._binding, names, hold)
        if recorded is not None:
            with contextlib.suppress(_Discard), tx:
                yield tx
                raise _Discard
            return
        self.going_on()
        runner = self.runner
        started = runner.engine.now()

        def record(txn: WriteTxn) -> None:
            def change(store: _runs.Store, doc: _runs.Document) -> None:
                done = _runs.step("transaction", "succeeded", None, None, started, txn.now)
                store.put_step(doc, position, done)
                store.save(doc)

            runner.apply(txn, change)

        try:
            with tx:
                yield tx
                hold.defer(record, runner.locks)
        except LockNotOwnedError:
            raise runner.unwind_lost() from None
        except ConflictError as exc:
            # Another process wrote one of the scopes meanwhile: nothing was applied.
            # The run goes back to be replayed at once, the body with it (its steps
            # recorded return at once), as a transaction that conflicts is run again.
            raise runner.release() from exc
        if runner.ended:
            raise Unwind


def _waited(recorded: dict[str, Any]) -> Any:
    """What an ended wait step returns (its value), or raises (its timeout)."""
    if recorded["status"] == "failed":
        raise OperationTimeout(recorded["error"]["message"])
    return recorded["result"]


def _child_ended(step: dict[str, Any], child: _runs.Document, now: float) -> dict[str, Any]:
    """The record of a call step whose child ended as ``child`` says."""
    done = {**step, "ended": now, "child_status": child["status"]}
    if child["status"] == "succeeded":
        done.update(status="succeeded", result=child["result"])
    else:
        error = child["error"] or _runs.error_of(
            RunCancelledError(f"run {child['id']} was cancelled")
        )
        done.update(status="failed", error=error)
    return done


def _called(recorded: dict[str, Any]) -> Any:
    """What a call step returns, or raises, as the child's ``result()`` would."""
    if recorded["status"] == "succeeded":
        return recorded["result"]
    child = recorded["child"]
    if recorded.get("child_status") == "cancelled":
        raise RunCancelledError(f"run {child} was cancelled")
    error = recorded["error"]
    raise WorkflowFailedError(f"run {child} failed: {error['type']}: {error['message']}", error)


class StepCall:
    """A step being called (``Run.step``, ``AsyncRun.step``): its checks, where it is
    in the run, and its record."""

    def __init__(self, run: Run, name: str, retries: int, backoff: float) -> None:
        check_key(name, "step name")
        if type(retries) is not int or retries < 0:
            raise InvalidArgumentError(f"retries must be an int >= 0, not {retries!r}")
        self._pause = _runs.check_seconds(backoff, "backoff")
        self._run = run
        self.runner = run.runner
        self.name = name
        self.retries = retries
        self.position, self.recorded = run.next_step(name)
        self.started = 0.0
        if self.recorded is None:
            run.going_on()
            self.started = self.runner.engine.now()

    def failed(self, attempt: int, exc: Exception) -> float:
        """Attempt ``attempt`` raised ``exc``: the pause before the next one.

        Raises:
            StepFailedError: it was the last (recorded).
        """
        if attempt < self.retries:
            return float(self._pause * 2**attempt)
        runner = self.runner
        error = _runs.error_of(exc)
        step = _runs.step(self.name, "failed", None, error, self.started, runner.engine.now())
        runner.record_step(self.position, step)
        raise _step_failed(self.name, error) from exc

    def succeeded(self, result: Any) -> Any:
        """Record ``result``; a fresh copy of it, as a replay would return.

        Raises:
            InvalidValueError: it is not a value.
        """
        runner = self.runner
        text = _runs.encode_value(runner.engine.options, result)
        now = runner.engine.now()
        step = _runs.step(self.name, "succeeded", decode(text), None, self.started, now)
        runner.record_step(self.position, step)
        return decode(text)


def replayed(recorded: dict[str, Any]) -> Any:
    if recorded["status"] == "failed":
        raise _step_failed(recorded["name"], recorded["error"])
    return recorded["result"]


def _step_failed(name: str, error: dict[str, str]) -> StepFailedError:
    return StepFailedError(f"step {name!r} failed: {error['type']}: {error['message']}", error)
